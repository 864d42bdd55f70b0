// The parity gate's rule for near-ties: every mismatch is reported with HF's margin at that step; a
// mismatch whose margin is within twice the precision's measured logit error is a tie, counted and
// bounded by maxTies; any other mismatch fails. Fakes stand in for the runtime and the trace.
import { describe, expect, it } from 'vitest';
import { checkParity, MAX_LISTED_MISMATCHES, paritySummary, tieMarginFor, variantOk } from '../../src/gates/parity.js';
import type { Trace } from '../../src/gates/trace.js';
import type { GenerateRequest, Target } from '../../src/targets/target.js';

const VOCAB = 16;
const timings = { load_ms: 1, prefill_ms: 1, decode_ms_per_token: 1, host_overhead_ms_per_token: 0 };

/**
 * Two prompts, 6 generated tokens each. At every step HF's token has logit 10 and a runner-up
 * (HF's token + 1) has 10 - margin, every other token 0; `margins[p][k]` sets that margin.
 */
function fakeTrace(margins: number[][]): Trace {
  const prompts = [
    { prompt_tokens: [1, 2], generated: [3, 4, 5, 6, 7, 8] },
    { prompt_tokens: [9], generated: [2, 2, 3, 3, 4, 4] },
  ];
  return {
    meta: { prompts, vocab: VOCAB },
    async get(p: number, t: number, what: string) {
      expect(what).toBe('logits');
      const k = t - (prompts[p].prompt_tokens.length - 1);
      const logits = new Float32Array(VOCAB);
      const hf = prompts[p].generated[k];
      logits[hf] = 10;
      logits[(hf + 1) % VOCAB] = 10 - margins[p][k];
      return logits;
    },
  } as unknown as Trace;
}

/** A runtime that chooses HF's token except where `swaps` says it chose the runner-up; it records the forced ids it was given. */
function fakeRuntime(trace: Trace, swaps: Array<[number, number]>, seen: GenerateRequest[] = []): Target {
  return {
    name: 'fake',
    async generate(req) {
      seen.push(req);
      const p = trace.meta.prompts.findIndex((x) => x.prompt_tokens.join() === req.promptIds.join());
      const ids = trace.meta.prompts[p].generated.slice(0, req.maxNewTokens);
      for (const [sp, k] of swaps) if (sp === p) ids[k] = (ids[k] + 1) % VOCAB;
      return { generatedIds: ids, timings, backend: 'cpu' };
    },
  };
}

const flat = (m: number) => [Array(6).fill(m), Array(6).fill(m)];

describe('parity gate: ties', () => {
  it('runs teacher-forced on HF\'s greedy tokens and passes N/N with no mismatch', async () => {
    const trace = fakeTrace(flat(1));
    const seen: GenerateRequest[] = [];
    const r = await checkParity(fakeRuntime(trace, [], seen), '/b', trace, 6, 0.1);
    expect(seen.map((s) => s.forceIds)).toEqual([[3, 4, 5, 6, 7, 8], [2, 2, 3, 3, 4, 4]]);
    expect(r).toMatchObject({ matched: 12, total: 12, ties: 0, mismatchCount: 0, mismatches: [], logitError: 0.1, tieMargin: 0.2, firstDivergence: null });
    expect(variantOk(r, 1, 0)).toBe(true);
  });

  it('counts a mismatch within twice the logit error as a tie, lists it with HF\'s logits and margin, and passes within maxTies', async () => {
    const margins = flat(1);
    margins[0][2] = 0.05; // within 2 × 0.03
    const trace = fakeTrace(margins);
    const r = await checkParity(fakeRuntime(trace, [[0, 2]]), '/b', trace, 6, 0.03);
    expect(r.ties).toBe(1);
    expect(r.mismatchCount).toBe(1);
    expect(r.mismatches).toEqual([{ prompt: 0, step: 2, hf: { token: 5, logit: 10 }, runtime: { token: 6, hfLogit: Math.fround(9.95) }, margin: 10 - Math.fround(9.95), tie: true }]);
    // matched is the free-running prefix: 2 tokens of prompt 0 before the tie, all 6 of prompt 1.
    expect(r.matched).toBe(8);
    expect(r.perPrompt).toEqual([{ matched: 2, total: 6, mismatches: 1 }, { matched: 6, total: 6 }]);
    expect(variantOk(r, 1, 1)).toBe(true);
    expect(variantOk(r, 1, 0)).toBe(false); // the default bound: no ties
  });

  it('fails a mismatch above the tie margin even when maxTies would allow many ties', async () => {
    const margins = flat(1);
    margins[1][4] = 0.5; // above 2 × 0.03
    const trace = fakeTrace(margins);
    const r = await checkParity(fakeRuntime(trace, [[1, 4]]), '/b', trace, 6, 0.03);
    expect(r).toMatchObject({ ties: 0, mismatchCount: 1 });
    expect(r.mismatches[0]).toMatchObject({ prompt: 1, step: 4, margin: 0.5, tie: false });
    expect(variantOk(r, 1, 100)).toBe(false);
  });

  it('fails when the ties exceed maxTies', async () => {
    const trace = fakeTrace(flat(0.01));
    const r = await checkParity(fakeRuntime(trace, [[0, 1], [1, 3], [1, 5]]), '/b', trace, 6, 0.03);
    expect(r).toMatchObject({ ties: 3, mismatchCount: 3 });
    expect(r.mismatches.every((m) => m.tie)).toBe(true);
    expect(variantOk(r, 1, 3)).toBe(true);
    expect(variantOk(r, 1, 2)).toBe(false);
  });

  it('counts nothing as a tie when no finite logit error was measured', async () => {
    expect(tieMarginFor(null)).toBeNull();
    expect(tieMarginFor(Infinity)).toBeNull();
    expect(tieMarginFor(0.25)).toBe(0.5);
    const trace = fakeTrace(flat(0));
    const r = await checkParity(fakeRuntime(trace, [[0, 0]]), '/b', trace, 6, null);
    expect(r).toMatchObject({ ties: 0, mismatchCount: 1, tieMargin: null, logitError: null });
    expect(variantOk(r, 1, 10)).toBe(false);
  });

  it('lists at most MAX_LISTED_MISMATCHES mismatches, with the count of all, in the record; states the rule and the bound', async () => {
    const trace = fakeTrace(flat(1));
    const everyStep = [0, 1].flatMap((p) => [0, 1, 2, 3, 4, 5].map((k) => [p, k] as [number, number]));
    const a = await checkParity(fakeRuntime(trace, everyStep), '/b', trace, 6, 0.01);
    const b = await checkParity(fakeRuntime(trace, everyStep), '/b', trace, 6, 0.01);
    const s = paritySummary('host', { export: a, quantize: b }, { minMatch: 1, maxTies: 0 });
    expect(s).toMatchObject({ matched: 0, total: 24, ties: 0, maxTies: 0, thresholds: { minMatch: 1, maxTies: 0 } });
    expect(s.mismatches.count).toBe(24);
    expect(s.mismatches.listed).toHaveLength(MAX_LISTED_MISMATCHES);
    expect(s.mismatches.listed[0]).toMatchObject({ variant: 'export', prompt: 0, step: 0, tie: false });
    expect(s.mismatches.listed[12]).toMatchObject({ variant: 'quantize', prompt: 0, step: 0 });
    expect(s.variants.export).toMatchObject({ ok: false, ties: 0, mismatches: 12, logitError: 0.01, tieMargin: 0.02 });
    expect(s.rule).toMatch(/teacher-forced on HF's greedy token.*at most 2 × the precision's measured largest \|logit − HF logit\|.*any other mismatch fails; at most 0 ties per variant/);
    expect(s).not.toHaveProperty('tiesWhy');
    const allowed = paritySummary('host', { quantize: b }, { minMatch: 1, maxTies: 3, tiesWhy: 'synthetic random weights' });
    expect(allowed).toMatchObject({ maxTies: 3, tiesWhy: 'synthetic random weights' });
    expect(allowed.rule).toMatch(/at most 3 ties per variant$/);
  });
});
