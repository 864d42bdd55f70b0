// The oracle's logit error (largestLogitError over a graph's GateTally): the largest |forge − HF| of
// its `logits` output over the compared entries only; a prefill chunk's padding rows are masked out
// of it as they are of the cosines.
import { describe, expect, it } from 'vitest';
import { GateTally } from '../../src/gates/compare.js';
import { largestLogitError } from '../../src/gates/oracle.js';

describe('largestLogitError', () => {
  it('is the largest logits error over all cases, leaving out masked padding rows however wrong they are', () => {
    const V = 4;
    const tally = new GateTally(V);
    // Case 1: one row, off by 0.25 at index 2.
    tally.add('logits', Float32Array.of(1, 2, 3.25, 0), Float32Array.of(1, 2, 3, 0), 'case 1');
    // Case 2: a chunk of 2 rows whose second is padding: forge's padding row holds garbage (100 off).
    const mask = Uint8Array.of(1, 1, 1, 1, 0, 0, 0, 0);
    tally.add('logits', Float32Array.of(1, 2.5, 3, 0, 100, 0, 0, 0), Float32Array.of(1, 2, 3, 0, 0, 0, 0, 0), 'case 2', mask);
    // Another output with a larger error does not count.
    tally.add('hidden_out', Float32Array.of(9), Float32Array.of(0), 'case 1');
    expect(largestLogitError(tally.outputs)).toBe(0.5);
  });

  it('is undefined for a graph without a logits output, and Infinity when a compared logit is non-finite', () => {
    const tally = new GateTally(2);
    tally.add('hidden_out', Float32Array.of(1, 2), Float32Array.of(1, 2), 'case 1');
    expect(largestLogitError(tally.outputs)).toBeUndefined();
    tally.add('logits', Float32Array.of(NaN, 1), Float32Array.of(0, 1), 'case 1');
    expect(largestLogitError(tally.outputs)).toBe(Infinity);
  });
});
