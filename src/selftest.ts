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

interface VitestJson {
  numPassedTests: number; numFailedTests: number; numPendingTests: number; numTodoTests: number;
  testResults: { name: string; status: string; message?: string; startTime?: number; endTime?: number; assertionResults: { fullName: string; status: string; failureMessages?: string[] }[] }[];
}
interface Counts { passed: number; failed: number; skipped: number; failures: string[] }

/** The first lines of a failure: enough to name the cause in a CI log that keeps only its tail. */
const firstLines = (text: string, n = 12) => text.split('\n').slice(0, n).map((l) => `    ${l}`).join('\n');

function vitestFailures(r: VitestJson): string[] {
  const out: string[] = [];
  for (const file of r.testResults) {
    const rel = file.name.replace(`${repoRoot()}/`, '');
    const failed = file.assertionResults.filter((a) => a.status === 'failed');
    for (const a of failed) out.push(`vitest ${rel} > ${a.fullName}\n${firstLines(a.failureMessages?.[0] ?? '')}`);
    // A file that failed without a failing test (import error, hook failure) has only a message.
    if (!failed.length && file.status === 'failed') out.push(`vitest ${rel}\n${firstLines(file.message ?? '')}`);
  }
  return out;
}

const log = (m: string) => process.stderr.write(`${m}\n`);

/**
 * The slowest test files, longest first: where the suite's time goes (the CI log keeps its tail).
 * The report's times span a file's tests only, not its beforeAll (where the builds run); files run
 * one at a time (vitest.config: fileParallelism false), so a file's time is from the end of the one
 * before it to its own end.
 */
function slowestFiles(r: VitestJson, n = 10): string[] {
  const files = r.testResults.filter((f) => f.endTime).sort((a, b) => a.endTime! - b.endTime!);
  return files
    .map((f, k) => ({ rel: f.name.replace(`${repoRoot()}/`, ''), s: (f.endTime! - (k ? files[k - 1].endTime! : f.startTime ?? f.endTime!)) / 1000 }))
    .sort((a, b) => b.s - a.s)
    .slice(0, n)
    .map((f) => `  ${f.s.toFixed(0).padStart(5)} s  ${f.rel}`);
}

/** The stage cache one `forge test` run shares between its vitest files and the native suite's bundles. */
const testCache = (dir: string) => join(dir, 'cache');

async function vitest(args: string[], dir: string): Promise<Counts & { code: number }> {
  const report = join(dir, 'vitest.json');
  const bin = join(repoRoot(), 'node_modules', 'vitest', 'vitest.mjs');
  const code = await new Promise<number>((resolve) => {
    const p = spawn(process.execPath, [bin, 'run', '--reporter=default', '--reporter=json', `--outputFile.json=${report}`, ...args], { cwd: repoRoot(), stdio: 'inherit', env: { ...process.env, FORGE_TEST_CACHE: testCache(dir) } });
    p.on('exit', (c) => resolve(c ?? 1));
  });
  try {
    const r = JSON.parse(readFileSync(report, 'utf8')) as VitestJson;
    // A file that cannot load fails no test, but is a failure all the same: count what failed.
    const failures = vitestFailures(r);
    console.log(`forge: slowest test files\n${slowestFiles(r).join('\n')}`);
    return { code, passed: r.numPassedTests, failed: failures.length, skipped: r.numPendingTests + r.numTodoTests, failures };
  } catch {
    return { code: code || 1, passed: 0, failed: 1, skipped: 0, failures: [`vitest wrote no report (${report}); exit code ${code}`] };
  }
}

/** The ctest suite needs real tiny bundles (every family's, fp32 and W8: make-bundle --all) and their HF traces. */
async function ctest(dir: string): Promise<Counts & { code: number }> {
  const build = await ensureNative();
  // The vitest run's cache: the tiny twins' builds it made are the bundles' too.
  const made = await $({ quiet: true, cwd: repoRoot(), env: { ...process.env, FORGE_CACHE: testCache(dir) } })`node --import tsx test/helpers/make-bundle.ts ${join(dir, 'bundles')} --all`;
  const bundles = JSON.parse(made.stdout.trim().split('\n').pop()!) as Parameters<typeof nativeTestEnv>[0];
  const r = await runNativeTests(build, nativeTestEnv(bundles));
  // A green run prints one line per test (and the parity figures); a red one prints everything.
  process.stdout.write(r.ok ? r.output.split('\n').filter((l) => /Test +#|tests passed|parity|Skipped$/.test(l)).join('\n') + '\n' : r.output);
  const m = /(\d+)% tests passed, (\d+) tests failed out of (\d+)/.exec(r.output);
  if (!m) return { code: 1, passed: 0, failed: 1, skipped: 0, failures: ['ctest printed no summary line'] };
  const failed = Number(m[2]);
  const total = Number(m[3]);
  // A "Not Run" test (missing executable …) is among ctest's failures; only skips and disabled tests are skipped.
  const skipped = (r.output.match(/\*\*\*Skipped|\(Disabled\)/g) ?? []).length;
  const failures = [...r.output.matchAll(/Test +#\d+: (\S+) \.+\*{3}(?:Failed|Exception|Timeout)/g)].map((f) => `ctest ${f[1]}`);
  return { code: r.ok ? 0 : 1, passed: total - failed - skipped, failed, skipped, failures };
}

export async function runTests(args: string[]): Promise<number> {
  await ensureVenv();
  await ensureDebianPackages({ chromium: 'chromium', 'redis-server': 'redis-server', 'espeak-ng': 'espeak-ng' }, log);
  const dir = mkdtempSync(join(tmpdir(), 'forge-test-'));
  const started = Date.now();
  try {
    const v = await vitest(args, dir);
    // A filtered run (file or -t arguments) is for a developer; the native suite runs on full runs.
    const c = args.length ? null : await ctest(dir);
    const passed = v.passed + (c?.passed ?? 0);
    const failed = v.failed + (c?.failed ?? 0);
    const failures = [...v.failures, ...(c?.failures ?? [])];
    if (failures.length) console.log(`forge: failed:\n${failures.map((f) => `  ${f}`).join('\n')}`);
    console.log(`forge: vitest ${v.passed} passed, ${v.failed} failed; ${c ? `ctest ${c.passed} passed, ${c.failed} failed` : 'ctest not run (filtered run)'}`);
    console.log(`forge: ${passed} passed, ${failed} failed, ${v.skipped + (c?.skipped ?? 0)} skipped in ${((Date.now() - started) / 60_000).toFixed(1)} min`);
    if (passed === 0) {
      console.log('forge: no test ran');
      return 1;
    }
    return v.code || c?.code || (failed ? 1 : 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
