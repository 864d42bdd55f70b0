// `forge nightly`: every build of the matrix, one after another, through the normal build() and its
// shared stage cache (unchanged inputs cost nothing), reduced to nightly.json and compared with the
// previous nightly. Layout of the out dir:
//   nightly.json, report.md, report.html   this run (nightly.json is the next run's default baseline)
//   history/<startedAt>.json               every run's nightly.json, for the trend plots
//   builds/<recipe>/<arch>/                each build's output, as `forge build --out` writes it
// With --queue the builds run as jobs on `forge worker`s instead (queued.ts), written where each
// worker writes; what comes back is the same summaries, and from there both paths are one.
import { existsSync, mkdirSync, readdirSync, renameSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { build } from '../build.js';
import { buildId, loadMatrix, type Matrix } from './matrix.js';
import { compareNightlies, type Comparison } from './compare.js';
import { failedSummary, readNightly, summarize, type BuildSummary, type Nightly } from './summary.js';
import { nightlyHtml, nightlyMarkdown } from './report.js';
import { buildOnQueue } from './queued.js';
import { checkQueueUrl, runIdOf } from './queue.js';

export interface NightlyRequest {
  /** The matrix file (default nightly/twins.json in the repo). */
  matrix?: string;
  /** The out dir (default out/nightly). */
  out?: string;
  /** A previous nightly.json to compare with (default: the out dir's own nightly.json, when there is one). */
  compare?: string;
  verbose?: boolean;
  log?: (line: string) => void;
  /** redis://…: enqueue the builds for `forge worker`s instead of building here. */
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
function writeAtomic(file: string, text: string): void {
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

/** What both paths fix before the first build: the matrix, out dir and baseline are refused here. */
interface Prepared {
  matrix: Matrix;
  file: string;
  out: string;
  own: string;
  baselineFile: string | null;
  before: Nightly | null;
  startedAt: string;
  t0: number;
  log: (line: string) => void;
}

export async function nightly(req: NightlyRequest = {}): Promise<NightlyOutcome> {
  const log = req.log ?? ((l: string) => process.stderr.write(`[nightly] ${l}\n`));
  const t0 = performance.now();
  // Everything that can be refused is refused before the first build: the matrix, and the baseline.
  const { matrix, file } = loadMatrix(req.matrix);
  const out = resolve(req.out ?? join('out', 'nightly'));
  const own = join(out, NIGHTLY_JSON);
  const baselineFile = req.compare ? resolve(req.compare) : existsSync(own) ? own : null;
  const before = baselineFile ? readNightly(baselineFile) : null;
  if (req.queue) checkQueueUrl(req.queue);
  const startedAt = new Date().toISOString();
  const p: Prepared = { matrix, file, out, own, baselineFile, before, startedAt, t0, log };
  if (req.queue) return finish(p, await buildOnQueue({ matrix, queue: req.queue, runId: req.run ?? runIdOf(startedAt), log }));
  return buildHere(p, req.verbose);
}

/** The builds one after another in this process. */
async function buildHere(p: Prepared, verbose?: boolean): Promise<NightlyOutcome> {
  const { matrix, file, out, baselineFile, before, startedAt, t0, log } = p;
  const builds: BuildSummary[] = [];
  for (const [n, b] of matrix.builds.entries()) {
    const id = buildId(b);
    log(`${n + 1}/${matrix.builds.length} ${id}: building`);
    const bt = performance.now();
    let summary: BuildSummary;
    try {
      const record = await build({ recipe: b.recipe, arch: b.arch, out: join(out, 'builds', b.recipe, b.arch), verbose });
      if (record.status === 'interrupted') {
        log(`${id}: ${record.error}; the rest of the matrix is not built and no nightly.json is written`);
        const partial = { format: 'forge-nightly/1' as const, startedAt, seconds: (performance.now() - t0) / 1000, matrix: file, thresholds: matrix.thresholds, builds, comparedWith: baselineFile, regressions: 0 };
        return { nightly: partial, comparison: compareNightlies(partial, before), dir: out, interrupted: record.error };
      }
      summary = summarize(record, record.buildDir ? join(record.buildDir, 'run.json') : null);
    } catch (e) {
      // A build that throws (its recipe no longer loads, the venv cannot be made) is a failed build
      // of the nightly, not the end of it: the other builds still run and are still compared.
      summary = failedSummary(b.recipe, b.arch, (e as Error).message, (performance.now() - bt) / 1000);
    }
    const cached = summary.stages.filter((s) => s.status === 'cached').length;
    log(`${n + 1}/${matrix.builds.length} ${id}: ${summary.ok ? 'ok' : `FAILED (${summary.error ?? summary.status})`} in ${summary.seconds.toFixed(1)} s, ${cached}/${summary.stages.length} stages cached`);
    builds.push(summary);
  }
  return finish(p, builds);
}

/** The builds' summaries, in matrix order, to nightly.json, the reports and the history: one path for both. */
function finish({ matrix, file, out, own, baselineFile, before, startedAt, t0, log }: Prepared, builds: BuildSummary[]): NightlyOutcome {
  const result: Nightly = {
    format: 'forge-nightly/1',
    ...(matrix.name ? { name: matrix.name } : {}),
    startedAt,
    seconds: (performance.now() - t0) / 1000,
    matrix: file,
    thresholds: matrix.thresholds,
    builds,
    comparedWith: baselineFile,
    regressions: 0,
  };
  const comparison = compareNightlies(result, before);
  result.regressions = comparison.regressions.length;

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
  writeAtomic(own, text);
  return { nightly: result, comparison, dir: out };
}
