// A checkpoint whose config.json differs from what the recipe recorded is not the model the recipe
// was written for: refuse it, naming the first field that differs.
import { stableStringify } from '../engine/hash.js';

export function checkConfigMatches(actual: Record<string, unknown>, expected: Record<string, unknown>, file: string): void {
  for (const [key, want] of Object.entries(expected)) {
    const got = actual[key];
    if (stableStringify(got) !== stableStringify(want)) {
      throw new Error(`${file}: field ${key} is ${JSON.stringify(got)}, but the recipe expects ${JSON.stringify(want)}`);
    }
  }
}
