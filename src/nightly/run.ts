// `forge nightly`: every build of the matrix, one after another, through the normal build() and its
// shared stage cache (unchanged inputs cost nothing), reduced to nightly.json and compared with the
// previous nightly. Layout of the out dir:
//   nightly.json, report.md, report.html   this run (nightly.json is the next run's default baseline)
//   history/<startedAt>.json               every run's nightly.json, for the trend plots
//   builds/<recipe>/<arch>[@<toolchain>]/   each build's output, as `forge build --out` writes it
// With --queue the builds run as jobs on `forge worker`s instead (queued.ts), written where each
// worker writes; what comes back is the same summaries, and from there both paths are one.
import { existsSync, mkdirSync, readdirSync, renameSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { build } from '../build.js';
import { RemoteCache } from '../engine/remote-cache.js';
import { buildId, loadMatrix, type Matrix, type MatrixBuild } from './matrix.js';
import { buildOnQueue } from './queued.js';
import { checkQueueUrl, runIdOf } from './queue.js';
import { compareNightlies, type Comparison } from './compare.js';
import { failedSummary, readNightly, summarize, type BuildSummary, type Nightly } from './summary.js';
import { nightlyHtml, nightlyMarkdown } from './report.js';

export interface NightlyRequest {
  /** The matrix file (default nightly/twins.json in the repo). */
  matrix?: string;
  /** The out dir (default out/nightly). */
  out?: string;
  /** A previous nightly.json to compare with (default: the out dir's own nightly.json, when there is one). */
  compare?: string;
  verbose?: boolean;
  log?: (line: string) => void;
  /** The shared stage cache for every build (`--cache`; absent: FORGE_REMOTE_CACHE, else none). */
  remoteCache?: string;
  /** redis://…: enqueue the builds for `forge worker`s instead of building here (each worker has its own --cache). */
  queue?: string;
  /** With queue: the run id the jobs are named by (default from the start time); a rerun with the same id reattaches. */
  run?: string;
}

export interface NightlyOutcome {
  nightly: Nightly;
  comparison: Comparison;
  dir: string;
  /** A build was interrupted (SIGINT/SIGTERM): the rest did not run and nothing was written. */
  interrupted?: string;
}

export const NIGHTLY_JSON = 'nightly.json';

/** Written beside, then renamed: a reader (the next nightly, a CI upload) never sees half a file. */
export function writeAtomic(file: string, text: string): void {
  const tmp = `${file}.tmp-${process.pid}`;
  writeFileSync(tmp, text);
  renameSync(tmp, file);
}

/** The stored nightlies of an out dir, oldest first; one that no longer parses is skipped, and said. */
function readHistory(dir: string, log: (l: string) => void): Nightly[] {
  if (!existsSync(dir)) return [];
  const runs: Nightly[] = [];
  for (const name of readdirSync(dir).filter((f) => f.endsWith('.json'))) {
    try {
      runs.push(readNightly(join(dir, name)));
    } catch (e) {
      log(`skipping ${join(dir, name)} in the trend plots: ${(e as Error).message}`);
    }
  }
  return runs.sort((a, b) => a.startedAt.localeCompare(b.startedAt));
}

/** Where a matrix build's output goes: builds/<recipe>/<arch>, a toolchain's beside it as <arch>@<toolchain>. */
export function buildOut(out: string, b: MatrixBuild): string {
  return join(out, 'builds', b.recipe, b.toolchain ? `${b.arch}@${b.toolchain}` : b.arch);
}

/**
 * One build of the matrix through the normal build(), reduced to its summary. A build that throws
 * (its recipe no longer loads, the venv cannot be made) is a failed build of the nightly, not the
 * end of it; an interrupted one is returned as such (the caller stops).
 */
export async function runMatrixBuild(b: MatrixBuild, out: string, verbose?: boolean, remoteCache?: RemoteCache | null): Promise<{ summary: BuildSummary } | { interrupted: string }> {
  const bt = performance.now();
  try {
    const record = await build({ recipe: b.recipe, arch: b.arch, out, verbose, ...(b.toolchain ? { toolchain: b.toolchain } : {}), ...(remoteCache ? { remoteCache } : {}) });
    if (record.status === 'interrupted') return { interrupted: record.error ?? 'interrupted' };
    return { summary: summarize(record, record.buildDir ? join(record.buildDir, 'run.json') : null, b.toolchain) };
  } catch (e) {
    return { summary: failedSummary(b, (e as Error).message, (performance.now() - bt) / 1000) };
  }
}

export function describeSummary(s: BuildSummary): string {
  const cached = s.stages.filter((x) => x.status === 'cached').length;
  return `${s.ok ? 'ok' : `FAILED (${s.error ?? s.status})`} in ${s.seconds.toFixed(1)} s, ${cached}/${s.stages.length} stages cached`;
}

/** The baseline a nightly compares with: --compare, else the out dir's own nightly.json (refused before any build when unreadable). */
export function baselineOf(out: string, compare?: string): { baselineFile: string | null; before: Nightly | null } {
  const own = join(out, NIGHTLY_JSON);
  const baselineFile = compare ? resolve(compare) : existsSync(own) ? own : null;
  return { baselineFile, before: baselineFile ? readNightly(baselineFile) : null };
}

export async function nightly(req: NightlyRequest = {}): Promise<NightlyOutcome> {
  const log = req.log ?? ((l: string) => process.stderr.write(`[nightly] ${l}\n`));
  const t0 = performance.now();
  // Everything that can be refused is refused before the first build: the matrix, and the baseline.
  const { matrix, file } = loadMatrix(req.matrix);
  const out = resolve(req.out ?? join('out', 'nightly'));
  const { baselineFile, before } = baselineOf(out, req.compare);
  if (req.queue) checkQueueUrl(req.queue);
  const startedAt = new Date().toISOString();
  if (req.queue) {
    const builds = await buildOnQueue({ matrix, queue: req.queue, runId: req.run ?? runIdOf(startedAt), log });
    return finishNightly({ matrix, file, builds, out, baselineFile, before, startedAt, seconds: (performance.now() - t0) / 1000, log });
  }
  // Opened (and its bucket checked) once: a wrong bucket fails the nightly, not each build in turn.
  const remoteCache = await RemoteCache.fromOption(req.remoteCache);

  const builds: BuildSummary[] = [];
  for (const [n, b] of matrix.builds.entries()) {
    const id = buildId(b);
    log(`${n + 1}/${matrix.builds.length} ${id}: building`);
    const r = await runMatrixBuild(b, buildOut(out, b), req.verbose, remoteCache);
    if ('interrupted' in r) {
      log(`${id}: ${r.interrupted}; the rest of the matrix is not built and no nightly.json is written`);
      const partial = { format: 'forge-nightly/1' as const, startedAt, seconds: (performance.now() - t0) / 1000, matrix: file, thresholds: matrix.thresholds, builds, comparedWith: baselineFile, regressions: 0 };
      return { nightly: partial, comparison: compareNightlies(partial, before), dir: out, interrupted: r.interrupted };
    }
    log(`${n + 1}/${matrix.builds.length} ${id}: ${describeSummary(r.summary)}`);
    builds.push(r.summary);
  }
  return finishNightly({ matrix, file, builds, out, baselineFile, before, startedAt, seconds: (performance.now() - t0) / 1000, log });
}

/**
 * The builds' summaries → nightly.json, compared with the baseline, the reports and the history.
 * Shared by `forge nightly` (builds here) and `--from-results` (builds done by CI jobs).
 */
export function finishNightly(o: {
  matrix: Matrix; file: string; builds: BuildSummary[]; out: string; baselineFile: string | null; before: Nightly | null;
  startedAt: string; seconds: number; log: (l: string) => void;
}): NightlyOutcome {
  const { matrix, file, builds, out, baselineFile, before, startedAt, log } = o;
  const result: Nightly = {
    format: 'forge-nightly/1',
    ...(matrix.name ? { name: matrix.name } : {}),
    startedAt,
    seconds: o.seconds,
    matrix: file,
    thresholds: matrix.thresholds,
    builds,
    comparedWith: baselineFile,
    regressions: 0,
  };
  const comparison = compareNightlies(result, before);
  result.regressions = comparison.regressions.length;

  mkdirSync(out, { recursive: true });
  const historyDir = join(out, 'history');
  mkdirSync(historyDir, { recursive: true });
  const stored = readHistory(historyDir, log);
  // A --compare baseline from elsewhere is a point of the trend too (before → after on one plot).
  if (before && !stored.some((h) => h.startedAt === before.startedAt)) stored.push(before);
  const history = [...stored.sort((a, b) => a.startedAt.localeCompare(b.startedAt)), result];
  const text = JSON.stringify(result, null, 2) + '\n';
  writeAtomic(join(historyDir, `${startedAt.replace(/:/g, '-')}.json`), text);
  writeAtomic(join(out, 'report.md'), nightlyMarkdown(result, before, comparison));
  writeAtomic(join(out, 'report.html'), nightlyHtml(result, before, comparison, history));
  // Last: nightly.json is the next run's baseline, so it only appears once the reports are written.
  writeAtomic(join(out, NIGHTLY_JSON), text);
  return { nightly: result, comparison, dir: out };
}
