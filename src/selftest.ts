// `./forge test`: forge's own suite. Sets up what it needs first (the Python environment, the
// Debian packages the tests use), runs vitest, then the native runtime's ctest suite against a tiny
// bundle built here, and ends with one plain 'N passed, N failed' line over both.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import { ensureVenv } from './toolchain/venv.js';
import { ensureDebianPackages } from './toolchain/system-deps.js';
import { ensureNative, nativeTestEnv, runNativeTests } from './toolchain/native.js';
import { repoRoot } from './paths.js';

interface VitestJson { numPassedTests: number; numFailedTests: number; numPendingTests: number; numTodoTests: number }
interface Counts { passed: number; failed: number; skipped: number }

const log = (m: string) => process.stderr.write(`${m}\n`);

async function vitest(args: string[], dir: string): Promise<Counts & { code: number }> {
  const report = join(dir, 'vitest.json');
  const bin = join(repoRoot(), 'node_modules', 'vitest', 'vitest.mjs');
  const code = await new Promise<number>((resolve) => {
    const p = spawn(process.execPath, [bin, 'run', '--reporter=default', '--reporter=json', `--outputFile.json=${report}`, ...args], { cwd: repoRoot(), stdio: 'inherit' });
    p.on('exit', (c) => resolve(c ?? 1));
  });
  try {
    const r = JSON.parse(readFileSync(report, 'utf8')) as VitestJson;
    return { code, passed: r.numPassedTests, failed: r.numFailedTests, skipped: r.numPendingTests + r.numTodoTests };
  } catch {
    return { code: code || 1, passed: 0, failed: 1, skipped: 0 };
  }
}

/** The ctest suite needs a real tiny bundle (fp32 and W8) and its HF trace. */
async function ctest(dir: string): Promise<Counts & { code: number }> {
  const build = await ensureNative();
  const made = await $({ quiet: true, cwd: repoRoot(), env: { ...process.env, FORGE_CACHE: join(dir, 'cache') } })`node --import tsx test/helpers/make-bundle.ts ${join(dir, 'bundles')}`;
  const bundles = JSON.parse(made.stdout.trim().split('\n').pop()!) as { fp32: string; w8: string; trace: string };
  const r = await runNativeTests(build, nativeTestEnv(bundles));
  process.stdout.write(r.output);
  const m = /(\d+)% tests passed, (\d+) tests failed out of (\d+)/.exec(r.output);
  if (!m) return { code: 1, passed: 0, failed: 1, skipped: 0 };
  const failed = Number(m[2]);
  const total = Number(m[3]);
  const skipped = (r.output.match(/\*\*\*Skipped|Not Run|Disabled/g) ?? []).length;
  return { code: r.ok ? 0 : 1, passed: total - failed - skipped, failed, skipped };
}

export async function runTests(args: string[]): Promise<number> {
  await ensureVenv();
  await ensureDebianPackages({ chromium: 'chromium' }, log);
  const dir = mkdtempSync(join(tmpdir(), 'forge-test-'));
  try {
    const v = await vitest(args, dir);
    // A filtered run (file or -t arguments) is for a developer; the native suite runs on full runs.
    const c = args.length ? { code: 0, passed: 0, failed: 0, skipped: 0 } : await ctest(dir);
    const passed = v.passed + c.passed;
    const failed = v.failed + c.failed;
    console.log(`forge: vitest ${v.passed} passed, ${v.failed} failed; ctest ${c.passed} passed, ${c.failed} failed`);
    console.log(`forge: ${passed} passed, ${failed} failed, ${v.skipped + c.skipped} skipped`);
    if (passed === 0) {
      console.log('forge: no test ran');
      return 1;
    }
    return v.code || c.code || (failed ? 1 : 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
