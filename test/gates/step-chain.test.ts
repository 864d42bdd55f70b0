// The precision's logit error end to end (step-chain.ts): each one-token graph fed what the previous
// one gave at the same step, the last one's logits measured against HF's.
import { describe, expect, it } from 'vitest';
import { StepChain } from '../../src/gates/step-chain.js';
import type { GraphEntry } from '../../src/export/graphs.js';
import type { GateCase } from '../../src/families/types.js';

// The chain reads only the residual stream each graph declares (its component's), never its kind.
const shard = (name: string, first: number, last: number, isLast = false) =>
  ({ name, n: 1, stream: { input: 'hidden_in', from: first === 0 ? null : `h.${first}`, output: 'hidden_out', to: isLast ? 'final' : `h.${last + 1}` } }) as unknown as GraphEntry;
const lmHead = { name: 'lm_head', n: 1, stream: { input: 'hidden', from: 'final' } } as unknown as GraphEntry;
const f32 = (...v: number[]) => Float32Array.from(v);
const hfCase = (input: string, step: number, hf: Float32Array, expected: GateCase['expected']): GateCase =>
  ({ prompt: 0, step, feeds: { [input]: { dtype: 'float32', data: hf, dims: [1, 1, hf.length] }, position: { dtype: 'int32', data: Int32Array.of(step), dims: [1] } }, expected });
async function* of(...cases: GateCase[]) { yield* cases; }
const collect = async (it: AsyncIterable<GateCase>) => { const out: GateCase[] = []; for await (const c of it) out.push(c); return out; };

describe('StepChain', () => {
  it('feeds each graph the previous graph\'s own output at the same step, and measures the last graph\'s logits', async () => {
    const chain = new StepChain();
    const s0 = shard('shard0.decode', 0, 1), s1 = shard('shard1.decode', 2, 3, true);
    // The first shard is fed the embedding: its gate case is the chain's first link.
    expect(StepChain.source(s0)).toBeNull();
    expect(StepChain.applies(s0)).toBe(true);
    expect(StepChain.applies({ name: 'experts', n: 1 } as unknown as GraphEntry)).toBe(false); // off the residual stream: not chained
    chain.record(s0, hfCase('hidden_in', 0, f32(9, 9), { hidden_out: f32(1, 1) }), () => f32(1.5, 1));
    // The second shard gets shard0's output (1.5, 1) in place of HF's h.2, and keeps its other feeds.
    const [c1] = await collect(chain.cases(s1, of(hfCase('hidden_in', 0, f32(1, 1), { hidden_out: f32(2, 2), new_k_2: f32(0) }))));
    expect(c1.feeds.hidden_in.data).toEqual(f32(1.5, 1));
    expect(c1.feeds.position.data).toEqual(Int32Array.of(0));
    expect(Object.keys(c1.expected)).toEqual(['hidden_out']); // the K/V of a chained run are not compared
    chain.record(s1, c1, () => f32(2.25, 2));
    const [c2] = await collect(chain.cases(lmHead, of(hfCase('hidden', 0, f32(2, 2), { logits: f32(3, 1, 0) }))));
    expect(c2.feeds.hidden.data).toEqual(f32(2.25, 2));
    expect(chain.logitError).toBeUndefined(); // no logits chained yet
    chain.record(lmHead, c2, () => f32(3.25, 0.5, 0));
    expect(chain.logitError).toBe(0.5);
    expect(chain.graphs).toEqual(['shard0.decode', 'shard1.decode', 'lm_head']);
  });

  it('refuses a graph whose input no earlier graph of the chain wrote, and a step it has no row for', async () => {
    const chain = new StepChain();
    await expect(collect(chain.cases(lmHead, of(hfCase('hidden', 0, f32(1), {}))))).rejects.toThrow(/lm_head reads final, which no earlier one-token graph/);
    chain.record(shard('shard0.decode', 0, 3, true), hfCase('hidden_in', 0, f32(1), { hidden_out: f32(1) }), () => f32(1));
    await expect(collect(chain.cases(lmHead, of(hfCase('hidden', 7, f32(1), { logits: f32(1) }))))).rejects.toThrow(/no chained final for lm_head at prompt 0 step 7/);
  });

  it('gives no bound when a chained logit is non-finite', () => {
    const chain = new StepChain();
    const whole = { ...shard('shard0.decode', 0, 3, true) } as GraphEntry;
    chain.record(whole, hfCase('hidden_in', 0, f32(1), { logits: f32(1, 2) }), () => f32(1, NaN));
    expect(chain.logitError).toBeUndefined();
  });
});
