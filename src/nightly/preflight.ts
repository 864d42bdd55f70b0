// What a `forge worker` checks before it takes any job, and again after a job failed for the
// machine's reasons: a worker that cannot build (its Redis refuses it, its shared cache cannot be
// written, a budget its machine does not have, a full disk) would otherwise take job after job and
// fail each in a second — a black hole the nightly reports as regressions of builds nothing is wrong with.
import { mkdirSync, statfsSync } from 'node:fs';
import { totalmem } from 'node:os';
import { RemoteCache } from '../engine/remote-cache.js';
import { formatBytes as gb } from '../units.js';

/** Below this much free space a build's first big stage would fail: the worker takes no job. */
export const MIN_FREE_BYTES = 2e9;

/** A budget over the machine's memory would admit jobs this machine cannot hold. */
export function memoryBudgetProblem(budgetBytes: number, totalBytes = totalmem()): string | null {
  if (budgetBytes <= totalBytes) return null;
  return `--memory-budget ${gb(budgetBytes)} is more than this machine has: ${gb(totalBytes)} of memory in all`;
}

/** A full (or nearly full) disk where builds write: the directories named, with what is free. */
export function diskProblem(dirs: string[], minFreeBytes = MIN_FREE_BYTES): string | null {
  const low: string[] = [];
  for (const dir of dirs) {
    try {
      mkdirSync(dir, { recursive: true });
      const s = statfsSync(dir);
      const free = s.bavail * s.bsize;
      if (free < minFreeBytes) low.push(`${dir} (${gb(free)} free)`);
    } catch (e) {
      low.push(`${dir} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
    }
  }
  return low.length ? `not enough disk space to build (${gb(minFreeBytes)} wanted free): ${low.join(', ')}` : null;
}

/** The shared cache as builds use it: the bucket reachable, and a test object written, read and deleted. */
export async function remoteCacheProblem(url: string, probeName: string): Promise<string | null> {
  try {
    const cache = await RemoteCache.open(url);
    try {
      await cache.probe(probeName);
    } finally {
      cache.client.destroy();
    }
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}

/** One error for everything wrong at once, so a person fixes it in one go. */
export function notStarted(problems: string[]): Error {
  return new Error(problems.length === 1 ? `this worker takes no jobs: ${problems[0]}` : `this worker takes no jobs:\n  ${problems.join('\n  ')}`);
}
