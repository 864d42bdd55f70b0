// A checkpoint whose config.json differs from what the recipe recorded is not the model the recipe
// was written for: refuse it, naming the first field that differs. The recipe records a subset
// (nested objects such as text_config included), so only the fields it names are compared.
import { stableStringify } from '../engine/hash.js';

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

export function checkConfigMatches(actual: Record<string, unknown>, expected: Record<string, unknown>, file: string, path = ''): void {
  for (const [key, want] of Object.entries(expected)) {
    const got = actual[key];
    const field = path ? `${path}.${key}` : key;
    if (isObject(want) && isObject(got)) {
      checkConfigMatches(got, want, file, field);
    } else if (stableStringify(got) !== stableStringify(want)) {
      throw new Error(`${file}: field ${field} is ${JSON.stringify(got)}, but the recipe expects ${JSON.stringify(want)}`);
    }
  }
}
