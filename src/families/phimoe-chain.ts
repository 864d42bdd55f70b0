// PhiMoE's one-token graphs chained end to end, for the oracle's logit error (the parity gates' tie
// margin; step-chain.ts does this for decoders, whose shards hand the residual from graph to graph).
// Here the host routes each layer's experts between its attention+router graph and the experts graph
// every layer shares, so the chain runs layer by layer: layer l's attention graph fed the chain's
// residual (layer 0: HF's embedding row, as the runtime's), then the experts graph fed that graph's
// attention residual and MoE input, with the experts and weights HF's router chose (routing is
// teacher-forced: a flipped choice is the parity gate's to see), giving the next residual; the
// lm-head last. Every graph is fed HF's KV rows for its step, as the gate feeds them.
import type { GraphEntry } from '../export/graphs.js';
import type { Trace } from '../gates/trace.js';
import { casesOfLayer, type ChainRunner, type GateCase } from './types.js';
import { ROLES, type PhimoeConfig } from './phimoe.js';
import { phimoeCases } from './phimoe-gates.js';

const key = (c: Pick<GateCase, 'prompt' | 'step'>) => `${c.prompt}:${c.step}`;

/** `cases` with `feeds` replaced by the chain's rows at the case's step (`rows(case)`: name → row). */
async function* fed(cases: AsyncIterable<GateCase>, rows: (c: GateCase) => Record<string, Float32Array> | undefined, what: string): AsyncGenerator<GateCase> {
  for await (const c of cases) {
    const r = rows(c);
    if (!r) throw new Error(`phimoe chain: no chained ${what} at prompt ${c.prompt} step ${c.step}`);
    const feeds = { ...c.feeds };
    for (const [name, data] of Object.entries(r)) feeds[name] = { ...feeds[name], data } as GateCase['feeds'][string];
    yield { ...c, feeds, expected: c.expected.logits ? { logits: c.expected.logits } : {} };
  }
}

export async function phimoeChain(c: PhimoeConfig, graphs: GraphEntry[], trace: Trace, maxContext: number, dir: string, run: ChainRunner, logits: (c: GateCase, got: Float32Array) => void): Promise<void> {
  const one = graphs.filter((g) => g.n === 1);
  const find = (role: string, layer?: number) => {
    const g = one.find((x) => x.role === role && (layer === undefined || x.first === layer));
    if (!g) throw new Error(`phimoe chain: the export has no one-token ${role} graph${layer !== undefined ? ` for layer ${layer}` : ''}`);
    return g;
  };
  const experts = find(ROLES.experts);
  let hidden: Map<string, Float32Array> | undefined;
  for (let l = 0; l < c.layers; l++) {
    const attn = find(ROLES.attnRouter, l);
    const handed = new Map<string, Record<string, Float32Array>>();
    const attnCases = phimoeCases(c, attn, trace, maxContext, dir);
    await run(attn, hidden ? fed(attnCases, (x) => (hidden!.has(key(x)) ? { hidden_in: hidden!.get(key(x))! } : undefined), `residual into layer ${l}`) : attnCases, (x, out) => {
      handed.set(key(x), { attn_res: out('attn_res').slice(), moe_in: out('moe_in').slice() });
    });
    const next = new Map<string, Float32Array>();
    await run(experts, fed(casesOfLayer(phimoeCases(c, experts, trace, maxContext, dir), l), (x) => handed.get(key(x)), `attention output of layer ${l}`), (x, out) => {
      next.set(key(x), out('hidden_out').slice());
    });
    hidden = next;
  }
  const head = find(ROLES.lmHead);
  await run(head, fed(phimoeCases(c, head, trace, maxContext, dir), (x) => (hidden!.has(key(x)) ? { hidden: hidden!.get(key(x))! } : undefined), 'last residual'), (x, out) => logits(x, out('logits')));
}
