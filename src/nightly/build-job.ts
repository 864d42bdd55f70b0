// One queued build, run and judged: its summary, and whether a failure was the build's (a gate, a
// stage's error: the nightly reports it) or the machine's (the shared cache unusable, a full disk,
// the build stopped from outside: the worker hands the job back, the nightly never reports it as a
// regression). Used by build-child.ts, in the process the worker forks for each job.
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { build, type BuildRequest } from '../build.js';
import type { RunRecord } from '../engine/record.js';
import { RemoteCacheError } from '../engine/s3.js';
import type { Progress } from '../engine/progress.js';
import { failedSummary, summarize, type BuildSummary } from './summary.js';

export interface BuildChildRequest {
  recipe: string;
  arch: string;
  toolchain?: string;
  /** s3://bucket/prefix: the shared stage cache (the worker's --cache). */
  remoteCache?: string;
  out: string;
  memoryBudgetBytes?: number;
  verbose?: boolean;
}

/** A failure of the worker's machine rather than of the build: the job goes back to the queue. */
export class InfraFailure extends Error {
  override name = 'InfraFailure';
}

const ENOSPC = /\bENOSPC\b|No space left on device/i;

/** Why a build that threw before making a record failed for the machine's reasons, or null (the build's own: a recipe that no longer loads …). */
export function infraCauseOfError(e: Error & { code?: string }): string | null {
  if (e instanceof RemoteCacheError) return e.message;
  if (e.code === 'ENOSPC' || ENOSPC.test(e.message)) return `out of disk space: ${e.message}`;
  return null;
}

/**
 * Why a build's record says it failed for the machine's reasons, or null when it is a build failure
 * (a gate failing, a stage's own error) that the nightly must report.
 */
export function infraCauseOfRecord(record: Pick<RunRecord, 'status' | 'error' | 'stages'>): string | null {
  // Stopped from outside (SIGTERM to the build process: a machine going down, an operator).
  if (record.status === 'interrupted') return `the build was stopped: ${record.error ?? 'interrupted'}`;
  if (record.status !== 'failed') return null;
  const failed = record.stages.filter((s) => s.status === 'failed').map((s) => `${s.name}: ${s.error ?? ''}`);
  const full = [record.error ?? '', ...failed].find((m) => ENOSPC.test(m));
  return full ? `out of disk space: ${full}` : null;
}

/** Runs the build and reduces it to its summary; `infra` is set when the failure was the machine's. */
export async function runBuildJob(req: BuildChildRequest, progress: Progress, buildFn: (r: BuildRequest) => Promise<RunRecord> = build): Promise<BuildSummary> {
  const t0 = performance.now();
  try {
    const record = await buildFn({
      recipe: req.recipe, arch: req.arch, out: req.out, memoryBudgetBytes: req.memoryBudgetBytes, verbose: req.verbose, progress,
      ...(req.toolchain ? { toolchain: req.toolchain } : {}), ...(req.remoteCache ? { remoteCache: req.remoteCache } : {}),
    });
    const summary = summarize(record, record.buildDir ? join(record.buildDir, 'run.json') : null, req.toolchain);
    const infra = infraCauseOfRecord(record);
    return infra ? { ...summary, infra } : summary;
  } catch (e) {
    // As in the sequential nightly: a build that throws is a failed build, not a failed job.
    const summary = failedSummary(req, (e as Error).message, (performance.now() - t0) / 1000);
    const infra = infraCauseOfError(e as Error);
    return infra ? { ...summary, infra } : summary;
  }
}
