// forge bisect --target emulation: the link after quantization. When the shipped graphs hold on the
// CPU (the oracle gate passed) and the compiled ones do not on the x86 HTP simulator (the emulation
// gate, teacher-forced per graph), what moved the numbers is the compile for the HTP and its fp16
// activations: link `compile/fp16`. This module names the first graph and output that leave the
// simulator's tolerance, then the op inside it (probe.ts), and builds the fixes fp16 allows.
//
// Which fixes: the QNN EP's enable_htp_fp16_precision is one switch per session (per context), so
// "fp32 for an op" is not something the HTP offers inside a graph. What keeps an op out of fp16's
// range problem without leaving the graph is an exact rewrite: a power-of-two scale before the op,
// undone after it (for an RMSNorm, which is scale-invariant, nothing needs undoing: ε takes s²; for a
// pair the family declares, one matrix scaled down and the one reading it scaled back up: a gated
// MLP's up_proj and down_proj, attention's v_proj and o_proj).
// The recipe's `rescale` lines say which op scopes get one (recipe/schema.ts RescaleSchema).
import type { EmulationRan, SimulatedGraph } from '../gates/emulation.js';
import type { Rescale } from '../recipe/schema.js';
import type { OpFigure, ProbeResult } from './probe.js';
import type { RescalePair, TensorSpec } from '../families/types.js';
import { shortName } from './fixes.js';
import { FP16_MAX } from './probe.js';

export interface SimulatorMiss {
  link: 'compile/fp16';
  graph: string;
  /** The output with the lowest cosine (a non-finite one first), as the gate kept it. */
  output: string;
  cosine: number;
  threshold: number;
  worst: string;
  nonFinite?: string;
  top1?: string;
  /** The layer of a per-layer output (new_k_2), when the worst one is. */
  layer: number | null;
}

const layerOfOutput = (name: string) => {
  const m = /_(\d+)$/.exec(name);
  return m && /^(new|present|past)_/.test(name) ? Number(m[1]) : null;
};

/**
 * The first graph (in export order) the simulator gate failed, and its worst output. Parity alone
 * failing (every graph within its cosine) is a miss too: it names no graph, the free-running chain
 * does; undefined then, the caller says so.
 */
export function simulatorMiss(r: EmulationRan, order: string[]): SimulatorMiss | undefined {
  const graphs = Object.entries(r.oracle.graphs).sort(([a], [b]) => order.indexOf(a) - order.indexOf(b));
  const failed = graphs.find(([, g]) => !g.ok);
  if (!failed) return undefined;
  const [graph, g] = failed;
  const outs = Object.entries(g.outputs).sort(([, a], [, b]) => Number(!a.nonFinite) - Number(!b.nonFinite) || a.minCosine - b.minCosine);
  const [output, t] = outs[0];
  return {
    link: 'compile/fp16', graph, output, cosine: t.nonFinite ? -1 : t.minCosine, threshold: r.thresholds.minCosine, worst: t.worst, layer: layerOfOutput(output),
    ...(t.nonFinite ? { nonFinite: t.nonFinite } : {}), ...(g.top1 ? { top1: g.top1 } : {}),
  };
}

/** Per graph, the simulator's figures the report shows. */
export function simulatorFigures(r: EmulationRan): Array<{ graph: string; ok: boolean; minCosine: number; top1?: string; nonFinite?: string }> {
  return Object.entries(r.oracle.graphs).map(([graph, g]: [string, SimulatedGraph]) => ({ graph, ok: g.ok, minCosine: g.minCosine, ...(g.top1 ? { top1: g.top1 } : {}), ...(g.nonFinite ? { nonFinite: g.nonFinite } : {}) }));
}

/** The norms this build can rescale, by the last part of their scope (blocks.ts rmsNorm with a name). */
const NORM = /(?:^|\/)(?:[\w.]*_layernorm|self_attn\.[qk]_norm|final_norm)$/;
/** The norms that read the residual stream: what a large residual reaches after the first. */
const RESIDUAL_NORM = /(?:^|\/)(?:input_layernorm|post_attention_layernorm|final_norm)$/;

export interface RescaleCandidate {
  label: string;
  rescale: Rescale[];
  /** Ops the rewrite adds to the graphs: one Mul per norm, none for a pair (its weights are scaled): the fix's cost. */
  addedOps: number;
  /** A pair's rewrite in words (`v_proj ÷ 2^4, o_proj × 2^4; …`). */
  what?: string;
  scopes: string[];
}

/** A power of two that brings `maxAbs` to 16 or under: its square, and a mean of squares, fit fp16 with room. */
export const scaleFor = (maxAbs: number) => 2 ** -Math.max(1, Math.ceil(Math.log2(maxAbs / 16)));

const escapeRe = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** The checkpoint matrix an op multiplies, from its scope (`layers.1/self_attn.v_proj` → `….layers.1.self_attn.v_proj.weight`); undefined for any other op. */
export function opMatrix(tensors: TensorSpec[], scope: string, layer: number): TensorSpec | undefined {
  return tensors.find((t) => t.role === 'matmul' && scope.endsWith(`/${shortName(t.name, layer)}`));
}

/** A layer's scope (`layers.2`, `model/layers.2`) and the op scope under it, as a probe names an op's. */
const IN_LAYER = /^((?:[\w.]+\/)*layers\.\d+)\/(.+)$/;
/** What a pair's rescale aims the divided values' peak at: 2^13, room for 8× more on inputs the trace did not show. */
const PAIR_PEAK = 2 ** 13;

/**
 * The candidate fixes for an op the probe named inside one of the family's rescale pairs (families'
 * `rescalePairs`: a gated MLP's up_proj with down_proj, attention's v_proj with o_proj) whose divided
 * values leave fp16's range on the CPU: the pair rescaled by the smallest power of two that brings
 * their peak to 2^13 first, then one 2^4 smaller. The peak: what the pair's `grows` ops make, and
 * what its `reads` op takes in.
 */
export function pairRescaleCandidates(probe: ProbeResult, pairs: readonly RescalePair[]): RescaleCandidate[] {
  const first = probe.first;
  const m = first ? IN_LAYER.exec(first.scope) : null;
  const pair = m ? pairs.find((p) => p.ops.includes(m[2])) : undefined;
  if (!m || !pair) return [];
  const under = (x: string) => `${m[1]}/${x}`;
  const peak = Math.max(...probe.ops.filter((o) => pair.grows.some((x) => o.scope === under(x))).map((o) => o.cpuMaxAbs), ...probe.ops.filter((o) => o.scope === under(pair.reads)).map((o) => o.inputMaxAbs));
  if (!(peak > FP16_MAX)) return [];
  const scope = under(pair.scope);
  const why = `forge bisect: ${m[1]}'s ${pair.values} reaches ${peak.toPrecision(4)} on the CPU > ${FP16_MAX}, beyond fp16 on the HTP`;
  const k = Math.max(1, Math.ceil(Math.log2(peak / PAIR_PEAK)));
  return [k, k + 4].map((e) => ({ label: `rescale ${scope} (${pair.what(e)})`, rescale: [{ match: escapeRe(scope), scale: 2 ** -e, why }], addedOps: 0, scopes: [scope], what: pair.what(e) }));
}

/**
 * The candidate fixes for an op the probe named, when it is inside a rescalable norm: that norm and
 * every other the probe shows overflowing; then every residual-stream norm from it on (a residual
 * too large for fp16's squares reaches each later one, in this graph and in the layers of graphs
 * after it, named by pattern). The scale is set by the largest input any of them saw on the CPU.
 */
export function rescaleCandidates(probe: ProbeResult, layers: number, pairs: readonly RescalePair[] = []): RescaleCandidate[] {
  const first = probe.first;
  // A pair's op is no norm (NORM names none of their scopes): an op in a pair whose values fit fp16 gets nothing here either.
  const paired = pairRescaleCandidates(probe, pairs);
  if (paired.length) return paired;
  if (!first || !NORM.test(first.scope)) return [];
  const why = `forge bisect: ${first.node} overflows fp16 on the HTP (|x| up to ${first.inputMaxAbs.toPrecision(4)}, its result up to ${first.cpuMaxAbs.toPrecision(4)} > ${FP16_MAX})`;
  const inputMax = (scopes: string[]) => Math.max(first.inputMaxAbs, ...probe.ops.filter((o: OpFigure) => scopes.includes(o.scope) && o.op === 'Mul').map((o) => o.inputMaxAbs));
  // The norms the probe shows overflowing (a square fp16 cannot hold from inputs it can): a fix that
  // leaves one of them in place cannot pass, so the first candidate covers them all.
  const overflowing = probe.ops.filter((o) => NORM.test(o.scope) && o.cpuMaxAbs > FP16_MAX && o.inputMaxAbs <= FP16_MAX).map((o) => o.scope).filter((x, i, a) => a.indexOf(x) === i);
  const one = overflowing.includes(first.scope) ? overflowing : [first.scope, ...overflowing];
  const out: RescaleCandidate[] = [{
    label: one.length === 1 ? `rescale ${first.scope}` : `rescale the ${one.length} norms that overflow (${one.join(', ')})`,
    rescale: [{ match: one.map(escapeRe).join('|'), scale: scaleFor(inputMax(one)), why }], addedOps: one.length, scopes: one,
  }];
  if (first.layer !== null && RESIDUAL_NORM.test(first.scope)) {
    const idx = probe.ops.indexOf(first);
    const later = probe.ops.slice(idx).map((o) => o.scope).filter((s, i, a) => RESIDUAL_NORM.test(s) && a.indexOf(s) === i);
    // Layers past this graph's last one: their two norms, and the final norm.
    const seenLayers = new Set(probe.ops.map((o) => o.layer).filter((l): l is number => l !== null));
    const beyond = Array.from({ length: layers }, (_, l) => l).filter((l) => l > Math.max(...seenLayers)).flatMap((l) => [`layers.${l}/input_layernorm`, `layers.${l}/post_attention_layernorm`]);
    const scopes = [...later, ...beyond, ...(later.includes('final_norm') ? [] : ['final_norm'])];
    if (scopes.some((x) => !one.includes(x))) {
      out.push({
        label: `rescale ${scopes.length} residual norms from ${first.scope} on`, addedOps: scopes.length, scopes,
        rescale: [{ match: scopes.map(escapeRe).join('|'), scale: scaleFor(inputMax(scopes)), why }],
      });
    }
  }
  return out;
}
