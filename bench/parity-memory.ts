// Memory of the parity gate's runtime on a real-size bundle: qhx_generate (CPU, as the host parity
// gate runs it) from this checkout ("after": weights shared and mapped, native/src/shared_weights.h)
// and from the runtime before that change ("before": one ORT session per graph at ORT's defaults),
// each greedy over the same prompt, peak private (RssAnon) and mapped (RssFile) memory sampled from
// /proc every 250 ms, printed as one JSON object with before/after ratios.
//
//   node --import tsx bench/parity-memory.ts BUNDLE_DIR [--tokens 4] [--prompt TEXT] [--threads 1]
//        [--assemble-from EXPORT_DIR --checkpoint CKPT [--recipe qwen3-4b]]
//        [--before-rev REV] [--skip-before] [--after QHX_GENERATE] [--stop-anon-gb 14] [--timeout-s 1800]
//
// --after measures that qhx_generate (e.g. a CMake build of this checkout's native/) instead of the
// one ensureNative() builds. --assemble-from puts BUNDLE_DIR together from an export/quantize output first (as the parity gate
// does). The "before" runtime is native/ at --before-rev (default: the last commit before shared
// weights), built once with CMake into ${FORGE_HOME}/bench/native-<rev>/ (qhx_generate only). A run
// whose private memory passes --stop-anon-gb, or that runs past --timeout-s, is stopped and reported
// with what it had reached (`stopped`; its peaks are then lower bounds). Real-size runs belong under
// /work/prompts/heavy.sh (-x for the "before" run).
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { assembleBundle } from '../src/bundle/assemble.js';
import { loadRecipe, archSettings } from '../src/recipe/load.js';
import { ensureNative, nativeDeps } from '../src/toolchain/native.js';
import { forgeHome, repoRoot } from '../src/paths.js';
import { benchArgs, positiveInt } from './util.js';

/** native/ before its CPU sessions shared mapped weights. */
const BEFORE_SHARED_WEIGHTS = '1d6493da4d6c4d73a0215fcba31528321b54d5ba';

const { values: a, positionals: [bundle], num } = benchArgs({
  tokens: { type: 'string', default: '4' },
  prompt: { type: 'string', default: 'The capital of France is' },
  threads: { type: 'string', default: '1' },
  'assemble-from': { type: 'string', default: '' },
  checkpoint: { type: 'string', default: '' },
  recipe: { type: 'string', default: 'qwen3-4b' },
  'before-rev': { type: 'string', default: BEFORE_SHARED_WEIGHTS },
  after: { type: 'string', default: '' },
  'skip-before': { type: 'boolean' },
  'stop-anon-gb': { type: 'string', default: '14' },
  'timeout-s': { type: 'string', default: '1800' },
});
if (!bundle) {
  process.stderr.write('usage: parity-memory.ts BUNDLE_DIR [--tokens N] [--assemble-from EXPORT_DIR --checkpoint CKPT] [--skip-before]\n');
  process.exit(2);
}
const tokens = num('tokens', positiveInt);
const threads = num('threads', positiveInt);
const stopAnon = num('stop-anon-gb', (n) => n > 0) * 1e9;
const timeoutS = num('timeout-s', (n) => n > 0);
const log = (m: string) => process.stderr.write(`parity-memory: ${m}\n`);
const GB = (b: number) => Math.round(b / 1e7) / 100;

if (a['assemble-from']) {
  if (!a.checkpoint) throw new Error('--assemble-from needs --checkpoint (the checkpoint the export read)');
  const { recipe } = loadRecipe(a.recipe);
  const { arch } = archSettings(recipe, 'v81');
  rmSync(bundle, { recursive: true, force: true });
  await assembleBundle({ recipe, arch, graphsDir: a['assemble-from'], embeddingDir: a['assemble-from'], checkpointDir: a.checkpoint, maxNewTokens: tokens }, bundle);
  log(`assembled ${bundle} from ${a['assemble-from']}`);
}
if (!existsSync(join(bundle, 'manifest.json'))) throw new Error(`${bundle} has no manifest.json`);

/** qhx_generate as native/ was at `rev`: CMake without the tests, cached by commit. */
async function buildAt(rev: string): Promise<string> {
  const sha = execFileSync('git', ['-C', repoRoot(), 'rev-parse', `${rev}^{commit}`], { encoding: 'utf8' }).trim();
  const dir = join(forgeHome(), 'bench', `native-${sha.slice(0, 12)}`);
  const exe = join(dir, 'build', 'qhx_generate');
  if (existsSync(join(dir, '.complete'))) return exe;
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(join(dir, 'src'), { recursive: true });
  log(`building qhx_generate at ${sha.slice(0, 12)} into ${dir}`);
  execFileSync('bash', ['-c', `git -C "${repoRoot()}" archive ${sha} native | tar -x -C "${dir}/src"`], { stdio: 'inherit' });
  const deps = await nativeDeps();
  const cmake = (args: string[]) => execFileSync('cmake', args, { stdio: ['ignore', 'ignore', 'inherit'] });
  cmake(['-G', 'Ninja', '-S', join(dir, 'src', 'native'), '-B', join(dir, 'build'), '-DCMAKE_BUILD_TYPE=Release', '-DFORGE_NATIVE_TESTS=OFF',
    `-DORT_INCLUDE_DIR=${deps.ORT_INCLUDE_DIR}`, `-DORT_LIB=${deps.ORT_LIB}`]);
  cmake(['--build', join(dir, 'build'), '--target', 'qhx_generate']);
  execFileSync('touch', [join(dir, '.complete')]);
  return exe;
}

interface Sample { anon: number; file: number; pssFile: number }

function readMemory(pid: number): Sample | null {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const kb = (text: string, key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? 0) * 1024;
    // Pss_File splits a page mapped twice (ORT's own per-session mappings) between the mappings.
    const rollup = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
    return { anon: kb(status, 'RssAnon'), file: kb(status, 'RssFile'), pssFile: kb(rollup, 'Pss_File') };
  } catch {
    return null; // exited between samples
  }
}

interface RunResult {
  exe: string;
  seconds: number;
  peakAnonGB: number;
  peakFileGB: number;
  peakPssFileGB: number;
  /** Why it was stopped before finishing; the peaks are then lower bounds. */
  stopped?: string;
  exitCode?: number | null;
  generatedIds?: number[];
  timings?: Record<string, number>;
  weights?: Record<string, number>;
  stderrTail?: string;
}

function run(exe: string): Promise<RunResult> {
  const args = [join(bundle, 'manifest.json'), 'cpu', '-', bundle, String(tokens), a.prompt, '--json', '--ignore-eos'];
  log(`running ${exe} (${tokens} tokens, ${threads} thread(s))`);
  const t0 = performance.now();
  const child = spawn(exe, args, { detached: true, env: { ...process.env, FORGE_ORT_THREADS: String(threads) }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  const peak: Sample = { anon: 0, file: 0, pssFile: 0 };
  let stopped: string | undefined;
  const timer = setInterval(() => {
    const m = readMemory(child.pid!);
    if (!m) return;
    for (const k of ['anon', 'file', 'pssFile'] as const) peak[k] = Math.max(peak[k], m[k]);
    const s = (performance.now() - t0) / 1000;
    if (!stopped && (m.anon > stopAnon || s > timeoutS)) {
      stopped = m.anon > stopAnon ? `private memory passed ${GB(stopAnon)} GB after ${Math.round(s)} s` : `still running after ${Math.round(s)} s`;
      log(`stopping: ${stopped}`);
      try { process.kill(-child.pid!, 'SIGKILL'); } catch { /* gone */ }
    }
  }, 250);
  return new Promise((resolve) => {
    child.on('close', (code) => {
      clearInterval(timer);
      const r: RunResult = {
        exe, seconds: (performance.now() - t0) / 1000,
        peakAnonGB: GB(peak.anon), peakFileGB: GB(peak.file), peakPssFileGB: GB(peak.pssFile),
        ...(stopped ? { stopped } : { exitCode: code }),
      };
      const line = stdout.trim().split('\n').pop() ?? '';
      if (!stopped && code === 0 && line.startsWith('{')) {
        const j = JSON.parse(line) as { generated_ids: number[]; timings: Record<string, number>; weights?: Record<string, number> };
        Object.assign(r, { generatedIds: j.generated_ids, timings: j.timings, ...(j.weights ? { weights: j.weights } : {}) });
      } else if (!stopped) r.stderrTail = stderr.trim().split('\n').slice(-3).join(' | ');
      resolve(r);
    });
  });
}

const afterExe = a.after || (await ensureNative()).qhxGenerate;
const beforeExe = a['skip-before'] ? null : await buildAt(a['before-rev']);
const after = await run(afterExe);
const before = beforeExe ? await run(beforeExe) : null;

const ratio = (x: number, y: number) => (y > 0 ? Math.round((x / y) * 100) / 100 : null);
const manifest = JSON.parse(readFileSync(join(bundle, 'manifest.json'), 'utf8')) as { contexts: Array<{ name: string; files: Array<{ bytes: number }>; graphs: unknown[] }> };
process.stdout.write(JSON.stringify({
  bundle,
  contexts: manifest.contexts.map((c) => ({ name: c.name, graphs: c.graphs.length, weightGB: GB(c.files.reduce((s, f) => s + f.bytes, 0)) })),
  tokens, threads, prompt: a.prompt,
  after,
  before,
  ratios: before ? {
    // For a stopped "before" run these are lower bounds of the real ratio.
    privatePeakBeforeOverAfter: ratio(before.peakAnonGB, after.peakAnonGB),
    mappedPeakBeforeOverAfter: ratio(before.peakFileGB, after.peakFileGB),
    secondsBeforeOverAfter: before.stopped ? null : ratio(before.seconds, after.seconds),
    beforeStopped: before.stopped ?? null,
  } : null,
  sameTokens: before?.generatedIds && after.generatedIds ? JSON.stringify(before.generatedIds) === JSON.stringify(after.generatedIds) : null,
  machine: { cpus: (await import('node:os')).cpus().length, memGB: GB((await import('node:os')).totalmem()) },
}) + '\n');
