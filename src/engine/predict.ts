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
