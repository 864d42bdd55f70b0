// Specification of how gate outputs are compared with the oracle: non-finite values on either side
// are failures with their own message; only the padding a case's mask names is skipped.
import { describe, expect, it } from 'vitest';
import { compare, describeNonFinite, GateTally, top1 } from '../../src/gates/compare.js';
import { rowMask } from '../../src/families/kv-decoder.js';

describe('compare', () => {
  it('scores equal vectors cosine 1 and a scaled one by its angle', () => {
    expect(compare([1, 2, 3], [1, 2, 3]).cosine).toBeCloseTo(1, 12);
    expect(compare([1, 0], [0, 1]).cosine).toBeCloseTo(0, 12);
    expect(compare([1, 2], [1, 2.5]).maxAbs).toBeCloseTo(0.5, 12);
  });

  it('fails an all-NaN oracle instead of scoring it cosine 1', () => {
    const r = compare([1, 2, 3], [NaN, NaN, NaN]);
    expect(r.cosine).toBe(-1);
    expect(r.nonFinite).toEqual({ oracle: { count: 3, first: 0 } });
    expect(describeNonFinite(r.nonFinite!)).toBe('3 non-finite values in the oracle (first at index 0)');
  });

  it("names non-finite values in forge's output, and both sides when both have some", () => {
    const r = compare([0, 1, Infinity, NaN, 4], [0, 1, 2, 3, -Infinity]);
    expect(r.nonFinite).toEqual({ forge: { count: 2, first: 2 }, oracle: { count: 1, first: 4 } });
    expect(describeNonFinite(r.nonFinite!)).toBe("2 non-finite values in forge's output (first at index 2); 1 non-finite value in the oracle (first at index 4)");
  });

  it('skips exactly the entries the mask leaves out, and nothing else', () => {
    const mask = Uint8Array.from([1, 1, 0, 0]);
    expect(compare([1, 2, NaN, 99], [1, 2, 0, 0], mask)).toEqual({ cosine: expect.closeTo(1, 12), maxAbs: 0 });
    expect(compare([1, NaN, 0, 0], [1, 2, 0, 0], mask).nonFinite).toEqual({ forge: { count: 1, first: 1 } });
    expect(() => compare([1, 2], [1, 2], Uint8Array.from([1]))).toThrow(/mask of 1 entries for 2 values/);
  });
});

describe('top1', () => {
  it('counts rows whose argmax agrees, over the rows the mask keeps', () => {
    const actual = [0, 5, 1, /**/ 3, 0, 0, /**/ 9, 9, 9];
    const expected = [0, 4, 1, /**/ 0, 0, 3, /**/ 0, 0, 0];
    expect(top1(actual, expected, 3)).toEqual({ agree: 2, rows: 3 });
    expect(top1(actual, expected, 3, rowMask(1, 3, 3, 2))).toEqual({ agree: 1, rows: 2 });
  });

  it('leaves logits that predict a placeholder (an image\'s soft token) out of top-1, comparing them by cosine still', () => {
    const t = new GateTally(3);
    t.add('logits', [0, 5, 1], [0, 4, 1], 'prompt 0 step 0');
    t.add('logits', [3, 0, 0], [0, 0, 3], 'prompt 0 step 1', undefined, false);
    expect(t.top1).toEqual({ agree: 1, rows: 1 });
    expect(t.outputs.get('logits')!.minCosine).toBeLessThan(0.5);
  });

  it('never counts a row with a NaN logit as agreeing (argmax over NaN is 0 on both sides)', () => {
    expect(top1([NaN, NaN, NaN], [NaN, NaN, NaN], 3)).toEqual({ agree: 0, rows: 1 });
    expect(top1([1, NaN, 0], [1, 0, 0], 3)).toEqual({ agree: 0, rows: 1 });
  });
});

describe('rowMask', () => {
  it('marks the first `valid` rows of each outer block of a [outer, n, inner] tensor', () => {
    expect([...rowMask(2, 3, 2, 1)]).toEqual([1, 1, 0, 0, 0, 0, /**/ 1, 1, 0, 0, 0, 0]);
  });
});

describe('GateTally', () => {
  it('keeps the first non-finite case of each output with what was found, and fails its cosine', () => {
    const tally = new GateTally(2);
    tally.add('new_k_2', [1, 2], [1, 2], 'shard0.decode prompt 0 step 2');
    tally.add('new_k_2', [1, NaN], [1, 2], 'shard0.decode prompt 0 step 3');
    tally.add('new_k_2', [NaN, NaN], [1, 2], 'shard0.decode prompt 0 step 4');
    const t = tally.outputs.get('new_k_2')!;
    expect(t.nonFinite).toBe("shard0.decode prompt 0 step 3 output new_k_2: 1 non-finite value in forge's output (first at index 1)");
    expect(t.minCosine).toBe(-1);
  });

  it('counts top-1 on logits only over masked-in rows', () => {
    const tally = new GateTally(2);
    tally.add('logits', [0, 1, 5, 0], [0, 1, 0, 0], 'x', Uint8Array.from([1, 1, 0, 0]));
    expect(tally.top1).toEqual({ agree: 1, rows: 1 });
    expect(tally.outputs.get('logits')!.nonFinite).toBeUndefined();
  });
});
