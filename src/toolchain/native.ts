// Builds the C++ runtime (native/: qhx_generate + its ctest suite) once per source change:
// native/deps.sh fetches ONNX Runtime (library from onnxruntime-node, headers from a registry) and
// installs missing build tools, then CMake + ninja build into
// ${FORGE_HOME}/native-build-<hash of native/ sources, their location and the deps>, finished by a
// marker. Concurrent callers serialise on a lock; a failed step names itself and its log file.
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { appendFile, mkdir, writeFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import lockfile from 'proper-lockfile';
import { runOwned, type OwnedResult } from '../engine/subprocess.js';
import { forgeHome, repoRoot } from '../paths.js';

export interface NativeBuild {
  /** The qhx_generate executable. */
  qhxGenerate: string;
  /** The CMake build directory (ctest runs here). */
  buildDir: string;
}

const MARKER = '.forge-native-complete';

function nativeDir(): string {
  return join(repoRoot(), 'native');
}

function sourceFiles(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...sourceFiles(p));
    else out.push(p);
  }
  return out;
}

/** Hash of every file under native/ (path + bytes): what the runtime is made of. */
export function nativeSourceHash(): string {
  const h = createHash('sha256');
  const root = nativeDir();
  for (const f of sourceFiles(root)) h.update(`${relative(root, f)}\n`).update(readFileSync(f));
  return h.digest('hex');
}

/** The sources, where they live (paths are compiled in) and the deps. */
function buildKey(deps: Record<string, string>): string {
  const h = createHash('sha256').update(`root ${nativeDir()}\n${nativeSourceHash()}\n`);
  for (const k of Object.keys(deps).sort()) h.update(`${k}=${deps[k]}\n`);
  return h.digest('hex').slice(0, 16);
}

async function step(name: string, log: string, run: () => Promise<OwnedResult>): Promise<string> {
  await appendFile(log, `\n=== ${name}\n`);
  const r = await run();
  await appendFile(log, r.stdout + r.stderr);
  if (r.spawnError) throw new Error(`native build: ${name} could not start: ${r.spawnError}`);
  if (r.exitCode !== 0) throw new Error(`native build: ${name} failed (${r.signal ? `killed by ${r.signal}` : `exit ${r.exitCode}`}); see ${log}`);
  return r.stdout;
}

/** Fetched dependency paths (ORT_LIB, ORT_INCLUDE_DIR, ...) as native/deps.sh prints them. */
export async function nativeDeps(log?: string): Promise<Record<string, string>> {
  const r = await runOwned('bash', [join(nativeDir(), 'deps.sh')]);
  if (log) await appendFile(log, `\n=== native/deps.sh\n${r.stdout}${r.stderr}`);
  if (r.exitCode !== 0) {
    const why = r.stderr.trim().split('\n').pop() ?? '';
    throw new Error(`native build: native/deps.sh failed (exit ${r.exitCode}): ${why}${log ? `; see ${log}` : ''}`);
  }
  const deps: Record<string, string> = {};
  for (const line of r.stdout.split('\n')) {
    const m = /^([A-Z_]+)=(.*)$/.exec(line.trim());
    if (m) deps[m[1]] = m[2];
  }
  for (const k of ['ORT_LIB', 'ORT_INCLUDE_DIR']) if (!deps[k]) throw new Error(`native build: native/deps.sh printed no ${k}`);
  return deps;
}

export async function ensureNative(): Promise<NativeBuild> {
  const home = forgeHome();
  await mkdir(home, { recursive: true });
  const depsLog = join(home, 'native-deps.log');
  await writeFile(depsLog, '');
  const deps = await nativeDeps(depsLog);
  const buildDir = join(home, `native-build-${buildKey(deps)}`);
  const qhxGenerate = join(buildDir, 'qhx_generate');
  if (existsSync(join(buildDir, MARKER))) return { qhxGenerate, buildDir };

  await mkdir(buildDir, { recursive: true });
  const release = await lockfile.lock(buildDir, {
    lockfilePath: `${buildDir}.lock`,
    stale: 30_000,
    update: 5_000,
    retries: { retries: 10_000, minTimeout: 500, maxTimeout: 5_000, factor: 1.5 },
  });
  try {
    if (existsSync(join(buildDir, MARKER))) return { qhxGenerate, buildDir }; // built while we waited
    const log = join(buildDir, 'build.log');
    await writeFile(log, readFileSync(depsLog));
    await step('cmake configure', log, () =>
      runOwned('cmake', ['-G', 'Ninja', '-S', nativeDir(), '-B', buildDir, '-DCMAKE_BUILD_TYPE=Release', `-DORT_INCLUDE_DIR=${deps.ORT_INCLUDE_DIR}`, `-DORT_LIB=${deps.ORT_LIB}`]));
    await step('cmake build (ninja)', log, () => runOwned('cmake', ['--build', buildDir]));
    if (!existsSync(qhxGenerate)) throw new Error(`native build: ${qhxGenerate} was not produced; see ${log}`);
    await writeFile(join(buildDir, MARKER), JSON.stringify({ deps, builtAt: new Date().toISOString() }) + '\n');
    return { qhxGenerate, buildDir };
  } finally {
    await release().catch(() => undefined);
  }
}

/**
 * Environment for the native tests: the tiny bundles and HF traces from test/helpers/make-bundle.ts,
 * by the names the ctest suites read. The dense twin's are FORGE_TEST_BUNDLE (fp32),
 * FORGE_TEST_BUNDLE_W8 and FORGE_TEST_TRACE; every other family's `<name>`, `<name>W8` and
 * `<name>Trace` become FORGE_TEST_<NAME>_BUNDLE, _BUNDLE_W8 and _TRACE, so a family's bundles reach
 * its ctest without an edit here.
 */
export function nativeTestEnv(bundles: Record<string, string>): Record<string, string> {
  const env: Record<string, string> = {};
  const dense: Record<string, string> = { fp32: 'FORGE_TEST_BUNDLE', w8: 'FORGE_TEST_BUNDLE_W8', trace: 'FORGE_TEST_TRACE' };
  for (const [key, dir] of Object.entries(bundles)) {
    if (dense[key]) env[dense[key]] = dir;
    else {
      const m = /^([a-z][a-zA-Z0-9]*?)(W8|Trace)?$/.exec(key);
      if (!m) throw new Error(`make-bundle: '${key}' is not <name>, <name>W8 or <name>Trace`);
      const name = m[1].replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase();
      env[`FORGE_TEST_${name}_${m[2] === 'Trace' ? 'TRACE' : m[2] === 'W8' ? 'BUNDLE_W8' : 'BUNDLE'}`] = dir;
    }
  }
  return env;
}

/** Runs ctest in a build; resolves with its exit code and output (the parity lines are in it). */
export async function runNativeTests(build: NativeBuild, env: Record<string, string>): Promise<{ ok: boolean; output: string }> {
  const r = await runOwned('ctest', ['--output-on-failure', '-V'], { cwd: build.buildDir, env });
  return { ok: r.exitCode === 0, output: r.stdout + r.stderr };
}
