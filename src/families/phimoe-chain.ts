// PhiMoE's one-token graphs chained end to end, for the oracle's logit error (the parity gates' tie
// margin; step-chain.ts does this for decoders, whose shards hand the residual from graph to graph).
// Here the host routes each layer's experts between its attention+router graph and the experts graph
// every layer shares, so the chain runs layer by layer: layer l's attention graph fed the chain's
// residual (layer 0: HF's embedding row, as the runtime's), then the experts graph fed that graph's
// attention residual and MoE input, with the experts and weights HF's router chose (routing is
// teacher-forced, so one flip does not carry into later layers), giving the next residual; the
// lm-head last. Every graph is fed HF's KV rows for its step, as the gate feeds them. Each layer's
// chained router logits are also ranked as the host ranks them: a step and layer where its top-2 is
// not HF's is a routing flip, which the gate reports and bisect names.
import type { GraphEntry } from '../export/graphs.js';
import type { Trace } from '../gates/trace.js';
import { casesOfLayer, scaleStates, type ChainNotes, type ChainRunner, type GateCase, type RoutingFlip } from './types.js';
import { ROLES, TOP_K, type PhimoeConfig } from './phimoe.js';
import { phimoeCases } from './phimoe-gates.js';

const key = (c: Pick<GateCase, 'prompt' | 'step'>) => `${c.prompt}:${c.step}`;

/** `cases` with `feeds` replaced by the chain's rows at the case's step (`rows(case)`: name → row); HF's logits and router logits kept. */
async function* fed(cases: AsyncIterable<GateCase>, rows: (c: GateCase) => Record<string, Float32Array> | undefined, what: string): AsyncGenerator<GateCase> {
  for await (const c of cases) {
    const r = rows(c);
    if (!r) throw new Error(`phimoe chain: no chained ${what} at prompt ${c.prompt} step ${c.step}`);
    const feeds = { ...c.feeds };
    for (const [name, data] of Object.entries(r)) feeds[name] = { ...feeds[name], data } as GateCase['feeds'][string];
    const { logits, router_logits } = c.expected;
    yield { ...c, feeds, expected: { ...(logits ? { logits } : {}), ...(router_logits ? { router_logits } : {}) } };
  }
}

/** The experts a router's logits pick, best first (sparsemixer's order: the argmax, then the argmax of the rest; a tie to the lower index). */
export function topExperts(logits: Float32Array, k: number): number[] {
  const order = Array.from(logits.keys()).sort((a, b) => logits[b] - logits[a] || a - b);
  return order.slice(0, k);
}

/**
 * The flip at one step and layer, or undefined where the shipped router picks HF's experts in HF's
 * order (the order sets each expert's weight). `hfGap`: at the first rank where the two differ, how
 * far HF's logits put its expert above the one the shipped router ranked there.
 */
export function routingFlip(at: { prompt: number; step: number; layer: number }, hfLogits: Float32Array, shippedLogits: Float32Array, k: number): RoutingFlip | undefined {
  const hf = topExperts(hfLogits, k);
  const shipped = topExperts(shippedLogits, k);
  const i = hf.findIndex((e, r) => e !== shipped[r]);
  if (i < 0) return undefined;
  return { ...at, hf, shipped, hfGap: hfLogits[hf[i]] - hfLogits[shipped[i]] };
}

export async function phimoeChain(c: PhimoeConfig, graphs: GraphEntry[], trace: Trace, maxContext: number, dir: string, run: ChainRunner, logits: (c: GateCase, got: Float32Array) => void): Promise<ChainNotes> {
  const one = graphs.filter((g) => g.n === 1);
  const find = (role: string, layer?: number) => {
    const g = one.find((x) => x.role === role && (layer === undefined || x.first === layer));
    if (!g) throw new Error(`phimoe chain: the export has no one-token ${role} graph${layer !== undefined ? ` for layer ${layer}` : ''}`);
    return g;
  };
  const experts = find(ROLES.experts);
  let hidden: Map<string, Float32Array> | undefined;
  const flips: RoutingFlip[] = [];
  let decisions = 0;
  for (let l = 0; l < c.layers; l++) {
    const attn = find(ROLES.attnRouter, l);
    const handed = new Map<string, Record<string, Float32Array>>();
    const attnCases = scaleStates(attn, phimoeCases(c, attn, trace, maxContext, dir));
    await run(attn, hidden ? fed(attnCases, (x) => (hidden!.has(key(x)) ? { hidden_in: hidden!.get(key(x))! } : undefined), `residual into layer ${l}`) : attnCases, (x, out) => {
      handed.set(key(x), { attn_res: out('attn_res').slice(), moe_in: out('moe_in').slice() });
      const hf = x.expected.router_logits;
      if (!hf) throw new Error(`phimoe chain: no HF router logits for layer ${l} at prompt ${x.prompt} step ${x.step}`);
      decisions++;
      const flip = routingFlip({ prompt: x.prompt, step: x.step, layer: l }, hf, out('router_logits'), TOP_K);
      if (flip) flips.push(flip);
    });
    const next = new Map<string, Float32Array>();
    await run(experts, fed(casesOfLayer(phimoeCases(c, experts, trace, maxContext, dir), l), (x) => handed.get(key(x)), `attention output of layer ${l}`), (x, out) => {
      next.set(key(x), out('hidden_out').slice());
    });
    hidden = next;
  }
  const head = find(ROLES.lmHead);
  await run(head, fed(phimoeCases(c, head, trace, maxContext, dir), (x) => (hidden!.has(key(x)) ? { hidden: hidden!.get(key(x))! } : undefined), 'last residual'), (x, out) => logits(x, out('logits')));
  flips.sort((a, b) => a.prompt - b.prompt || a.step - b.step || a.layer - b.layer);
  return { routing: { decisions, flips } };
}
