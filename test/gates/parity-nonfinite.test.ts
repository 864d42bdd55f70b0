// The parity gate when the runtime refuses NaN/Inf logits: a failure of its own, with the runtime's
// message, never counted as tokens that happen to match (an argmax over NaN is token 0 on both sides).
import { describe, expect, it } from 'vitest';
import { checkParity, variantOk } from '../../src/gates/parity.js';
import type { Trace } from '../../src/gates/trace.js';
import { NonFiniteLogitsError, qhxFailure, type Target } from '../../src/targets/target.js';

const timings = { load_ms: 1, prefill_ms: 1, decode_ms_per_token: 1, host_overhead_ms_per_token: 0 };
// checkParity reads the prompts (and HF's logits only at a divergence, which these cases do not reach).
const trace = { meta: { prompts: [{ prompt_tokens: [1, 2], generated: [0, 0, 0] }, { prompt_tokens: [3], generated: [5, 6, 7] }] } } as unknown as Trace;

describe('parity over non-finite logits', () => {
  it('qhx_generate exit 3 becomes a NonFiniteLogitsError carrying its message; other exits stay plain errors', () => {
    const e = qhxFailure('host', 3, 'loading...\nqhx_generate: non-finite logits at generation step 2 (position 4): 7 of 9 values are NaN or Inf (first at index 0)\n');
    expect(e).toBeInstanceOf(NonFiniteLogitsError);
    expect(e.message).toBe('non-finite logits at generation step 2 (position 4): 7 of 9 values are NaN or Inf (first at index 0)');
    const other = qhxFailure('R5CT', '1', 'qhx_generate: QNN backend could not open the context');
    expect(other).not.toBeInstanceOf(NonFiniteLogitsError);
    expect(other.message).toBe('qhx_generate on R5CT exited 1: qhx_generate: QNN backend could not open the context');
  });

  it('fails the variant naming prompt and step, even where HF\'s own tokens are all 0 (what argmax over NaN gives)', async () => {
    const target: Target = {
      name: 'fake',
      async generate(req) {
        if (req.promptIds[0] === 1) throw new NonFiniteLogitsError('non-finite logits at generation step 0 (position 1): 9 of 9 values are NaN or Inf (first at index 0); refusing to take their argmax');
        return { generatedIds: [5, 6, 7], timings, backend: 'cpu' };
      },
    };
    const r = await checkParity(target, '/nowhere', trace, 3, 0.01);
    expect(r.nonFinite).toBe('prompt 0: non-finite logits at generation step 0 (position 1): 9 of 9 values are NaN or Inf (first at index 0); refusing to take their argmax');
    expect(r.perPrompt).toEqual([{ matched: 0, total: 3, nonFinite: r.nonFinite }, { matched: 3, total: 3 }]);
    expect(r.firstDivergence).toBeNull(); // not reported as a token mismatch
    expect(variantOk(r, 0, 0)).toBe(false); // even a recipe asking for 0% parity
    expect(variantOk({ ...r, nonFinite: undefined, matched: 6 }, 1, 0)).toBe(true);
  });
});
