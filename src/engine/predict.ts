// A stage's measured peak against its prediction: the run record keeps both, and a stage that used
// more than OVER_PREDICTION × its prediction says so, so a constant in pipelines/memory.ts that has
// gone stale shows up in the next run that exercises it.
import type { MemoryPeak } from './memory.js';
import type { MemoryPrediction } from './stage.js';
import { formatBytes as gb } from '../units.js';

export const OVER_PREDICTION = 1.25;


/** Says which measured figure exceeded its prediction by more than 25%, or undefined when none did. */
export function checkPrediction(predicted: MemoryPrediction | undefined, measured: MemoryPeak | null): string | undefined {
  if (!predicted || !measured) return undefined;
  const over: string[] = [];
  const check = (what: string, got: number, want: number) => {
    if (got > want * OVER_PREDICTION) over.push(`${what} ${gb(got)} vs ${gb(want)} predicted (×${(got / Math.max(1, want)).toFixed(2)})`);
  };
  check('private', measured.privateBytes, predicted.privateBytes);
  check('mapped', measured.mappedBytes, predicted.mappedBytes);
  return over.length ? `measured peak over the prediction by more than ${Math.round((OVER_PREDICTION - 1) * 100)}%: ${over.join('; ')} (predicted from ${predicted.how})` : undefined;
}

/** Past this many times what it needs to read, a stage was starved of memory. */
export const EVICTED_FACTOR = 3;

/**
 * Says that a stage's working set was evicted while it ran: its processes read more than
 * EVICTED_FACTOR × the bytes it needs from storage (its inputs, the checkpoint included, or its mapped
 * working set, whichever is larger; at least 1 GB). A cold read of everything is about 1×; a stage
 * whose pages the kernel keeps dropping under other jobs reads them again and again (10× was seen on
 * Gemma-4-E4B's trace beside other builds), and runs that much slower.
 */
export function checkEvicted(predicted: MemoryPrediction | undefined, measured: MemoryPeak | null, inputBytes: number): string | undefined {
  if (!measured?.diskReadBytes) return undefined;
  const need = Math.max(predicted?.mappedBytes ?? 0, measured.mappedBytes, inputBytes, 1e9);
  if (measured.diskReadBytes <= EVICTED_FACTOR * need) return undefined;
  return `its working set did not stay in memory: it read ${gb(measured.diskReadBytes)} from disk, ${(measured.diskReadBytes / need).toFixed(1)}× the ${gb(need)} it needs (other jobs took the memory it maps; run it with less beside it)`;
}
