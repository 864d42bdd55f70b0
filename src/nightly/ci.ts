// The nightly split across CI jobs (.github/workflows/nightly.yml): `--list` gives the job matrix,
// `--build <id>` runs one build of it exactly as `forge nightly` would and writes its summary, and
// `--from-results <dir>` gathers the summaries the jobs uploaded into the same nightly.json and
// reports a local nightly writes (run.ts's finishNightly), compared with the previous one.
import { existsSync, mkdirSync, readdirSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { RemoteCache } from '../engine/remote-cache.js';
import { buildId, loadMatrix, type MatrixBuild } from './matrix.js';
import { baselineOf, buildOut, finishNightly, runMatrixBuild, writeAtomic, type NightlyOutcome } from './run.js';
import { BuildSummarySchema, failedSummary, readJsonFile, type BuildSummary } from './summary.js';
import { RecipeError } from '../recipe/load.js';

/** The file a `--build` job writes into its out dir, and `--from-results` looks for. */
export const BUILD_SUMMARY = 'build-summary.json';

export interface ListedBuild extends MatrixBuild {
  id: string;
  /** The id as a CI artifact or job name may spell it (no slashes). */
  slug: string;
}

export const slugOf = (id: string) => id.replace(/[^\w.-]+/g, '_');

/** The matrix's builds, in order, as a CI job matrix reads them. */
export function listBuilds(matrixFile?: string): ListedBuild[] {
  const { matrix } = loadMatrix(matrixFile);
  return matrix.builds.map((b) => ({ ...b, id: buildId(b), slug: slugOf(buildId(b)) }));
}

function findBuild(id: string, matrixFile?: string): MatrixBuild {
  const { matrix, file } = loadMatrix(matrixFile);
  const b = matrix.builds.find((x) => buildId(x) === id);
  if (!b) throw new RecipeError(`no build '${id}' in the nightly matrix ${file} (builds: ${matrix.builds.map(buildId).join(', ')})`);
  return b;
}

/**
 * One build of the matrix, as a CI job runs it: its output under <out>/builds/… and its summary in
 * <out>/build-summary.json, written whether it passed or failed (the report decides what a failure
 * means; the job itself only fails when it could not write a summary).
 */
export async function nightlyBuild(o: { id: string; matrix?: string; out?: string; verbose?: boolean; log?: (l: string) => void; remoteCache?: string }): Promise<{ summary: BuildSummary; file: string } | { interrupted: string }> {
  const log = o.log ?? ((l: string) => process.stderr.write(`[nightly] ${l}\n`));
  const b = findBuild(o.id, o.matrix);
  const out = resolve(o.out ?? join('out', 'nightly'));
  log(`${o.id}: building`);
  // --cache, else FORGE_REMOTE_CACHE (a CI job's shared cache), checked before the build starts.
  const r = await runMatrixBuild(b, buildOut(out, b), o.verbose, await RemoteCache.fromOption(o.remoteCache));
  if ('interrupted' in r) return r;
  mkdirSync(out, { recursive: true });
  const file = join(out, BUILD_SUMMARY);
  writeAtomic(file, JSON.stringify(r.summary, null, 2) + '\n');
  return { summary: r.summary, file };
}

/** Every build-summary.json under dir (artifact downloads put each in a folder of its own). */
function summaryFiles(dir: string): string[] {
  const found: string[] = [];
  const walk = (d: string) => {
    for (const name of readdirSync(d).sort()) {
      const p = join(d, name);
      if (statSync(p).isDirectory()) walk(p);
      else if (name === BUILD_SUMMARY) found.push(p);
    }
  };
  walk(dir);
  return found;
}

export function readBuildSummary(file: string): BuildSummary {
  return readJsonFile(BuildSummarySchema, file, 'build summary');
}

/**
 * The nightly of builds that ran elsewhere: one summary per matrix build, in matrix order. A build
 * whose job left no summary (it was cancelled, its runner died) is a failed build of the nightly;
 * a summary of a build the matrix does not have, or two of one build, is refused (the results and
 * the matrix do not belong together).
 */
export function nightlyFromResults(o: { results: string; matrix?: string; out?: string; compare?: string; log?: (l: string) => void }): NightlyOutcome {
  const log = o.log ?? ((l: string) => process.stderr.write(`[nightly] ${l}\n`));
  const { matrix, file } = loadMatrix(o.matrix);
  const out = resolve(o.out ?? join('out', 'nightly'));
  const { baselineFile, before } = baselineOf(out, o.compare);
  const dir = resolve(o.results);
  if (!existsSync(dir)) throw new RecipeError(`no results directory ${dir}`);
  const byId = new Map<string, { summary: BuildSummary; file: string }>();
  const ids = new Set(matrix.builds.map(buildId));
  for (const f of summaryFiles(dir)) {
    const summary = readBuildSummary(f);
    if (!ids.has(summary.id)) throw new RecipeError(`${f}: build '${summary.id}' is not in the nightly matrix ${file} (builds: ${[...ids].join(', ')})`);
    const twice = byId.get(summary.id);
    if (twice) throw new RecipeError(`${f}: a second summary of ${summary.id} (the first is ${twice.file})`);
    byId.set(summary.id, { summary, file: f });
  }
  const builds = matrix.builds.map((b) => {
    const got = byId.get(buildId(b));
    if (got) return got.summary;
    log(`${buildId(b)}: no ${BUILD_SUMMARY} under ${dir}; counted as a failed build`);
    return failedSummary(b, `no result: its job left no ${BUILD_SUMMARY} (cancelled, timed out, or its runner died)`, 0);
  });
  // The builds ran at once on separate runners: the nightly's time is the longest of them.
  const seconds = Math.max(0, ...builds.map((b) => b.seconds));
  return finishNightly({ matrix, file, builds, out, baselineFile, before, startedAt: new Date().toISOString(), seconds, log });
}
