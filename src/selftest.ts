// `./forge test`: forge's own suite. Sets up the Python environment first (tests build tiny twins),
// runs vitest, and ends with a plain 'N passed, N failed' line that CI can read.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { ensureVenv } from './toolchain/venv.js';
import { ensureDebianPackages } from './toolchain/system-deps.js';
import { repoRoot } from './paths.js';

interface VitestJson { numPassedTests: number; numFailedTests: number; numPendingTests: number; numTodoTests: number; success: boolean }

export async function runTests(args: string[]): Promise<number> {
  await ensureVenv();
  await ensureDebianPackages({ chromium: 'chromium' }, (m) => process.stderr.write(`${m}\n`));
  const dir = mkdtempSync(join(tmpdir(), 'forge-test-'));
  const report = join(dir, 'vitest.json');
  const vitest = join(repoRoot(), 'node_modules', 'vitest', 'vitest.mjs');
  const code = await new Promise<number>((resolve) => {
    const p = spawn(process.execPath, [vitest, 'run', '--reporter=default', '--reporter=json', `--outputFile.json=${report}`, ...args], { cwd: repoRoot(), stdio: 'inherit' });
    p.on('exit', (c) => resolve(c ?? 1));
  });
  try {
    const r = JSON.parse(readFileSync(report, 'utf8')) as VitestJson;
    console.log(`forge: ${r.numPassedTests} passed, ${r.numFailedTests} failed, ${r.numPendingTests + r.numTodoTests} skipped`);
    if (r.numPassedTests === 0 && code === 0) {
      console.log('forge: no test ran');
      return 1;
    }
  } catch {
    console.log('forge: vitest wrote no report');
    return code === 0 ? 1 : code;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return code;
}
