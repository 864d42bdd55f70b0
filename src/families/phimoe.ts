// PhiMoE (Phi-tiny-MoE, Phi-3.5-MoE), model_type "phimoe". What is special: every layer routes on
// the host between attention and experts. Per layer, an attention+router graph (LayerNorm with
// bias, biased q/k/v/o, GQA, default RoPE over head_dim) gives the attention residual, the normed
// MoE input (handed to the experts graph) and 16 router logits; the host runs HF's sparsemixer
// (top-2, not renormalised; native/src/phimoe_generate/phimoe_route.cpp) and feeds the two chosen
// experts' rows from host tables to ONE experts graph shared by every layer (int8 rows with per-row
// scales in W8). The final LayerNorm and the biased, untied lm-head are one graph after the last
// layer. Batched prefill (optional: the planner may drop it): per layer the same attention+router
// graph over N tokens, then one experts-prefill graph run once per expert any of the N tokens chose
// (HF's expert order), each adding its expert's weighted output to a running sum.
// HF semantics, sources and where HF and the shipped remote code differ: docs/phimoe-semantics.md.
import { z } from 'zod';
import { ConfigError, MAX_DIM, MAX_LAYERS, checkElements, parseConfigWith, type Component, type ComponentLayout, type Family, type GraphInterface, type GraphVariant, type GraphWeights, type TensorIO } from './types.js';
import type { GraphBuilder } from '../onnx/builder.js';
import type { ElemType } from '../onnx/dtype.js';
import type { QuantScheme } from '../recipe/schema.js';
import { PREFILL_OPTIONAL, attentionDecoderConfig, type AttentionDecoderConfig } from './decoder.js';
import { applyRope, cachedAttention, layerNorm, linear, mergeHeads, ropeGather, ropeTables, splitHeads, swiGate, valueScale, VALUES_RESCALE } from './blocks.js';
import { newKv, pastKv } from './state-io.js';
import { EXPERT_ROW_DTYPE, expertTables, int8Rows, type ExpertMatrix } from './expert-tables.js';
import { phimoeBindings, phimoeCases } from './phimoe-gates.js';
import { phimoeChain } from './phimoe-chain.js';

const ConfigSchema = z.object({
  model_type: z.literal('phimoe'),
  hidden_size: z.number().int().positive().max(MAX_DIM),
  intermediate_size: z.number().int().positive().max(MAX_DIM),
  num_hidden_layers: z.number().int().positive().max(MAX_LAYERS),
  num_attention_heads: z.number().int().positive().max(MAX_DIM),
  num_key_value_heads: z.number().int().positive().max(MAX_DIM),
  head_dim: z.number().int().positive().max(MAX_DIM).optional(),
  num_local_experts: z.number().int().min(2).max(MAX_DIM),
  num_experts_per_tok: z.literal(2, { message: 'sparsemixer routing is top-2 only' }),
  router_jitter_noise: z.number().nonnegative(),
  vocab_size: z.number().int().positive().max(MAX_DIM),
  rms_norm_eps: z.number().positive(),
  max_position_embeddings: z.number().int().positive(),
  // The real config.json has the legacy top-level rope_theta; transformers >= 5 writes rope_parameters.
  rope_theta: z.number().positive().optional(),
  rope_parameters: z.object({ rope_theta: z.number().positive(), rope_type: z.string().default('default') }).passthrough().optional(),
  rope_scaling: z.null({ message: 'only default RoPE is supported (LongRoPE Phi-3.5-MoE is not)' }).optional(),
  attention_bias: z.literal(true, { message: 'the graphs are built with q/k/v/o biases' }),
  lm_head_bias: z.literal(true, { message: 'the lm-head graph is built with its bias' }),
  tie_word_embeddings: z.literal(false, { message: 'a tied PhiMoE lm-head is not supported' }).default(false),
  sliding_window: z.number().int().positive().nullable().optional(),
}).passthrough();

/** The attention decoder's fields (lm-head untied), and the experts'. */
export interface PhimoeConfig extends AttentionDecoderConfig {
  experts: number;
  jitterEps: number;
  /** HF masks keys older than this many positions (Phi-tiny-MoE: 2047); null: none. */
  slidingWindow: number | null;
}

export function parsePhimoeConfig(raw: unknown, file: string): PhimoeConfig {
  const c = parseConfigWith(ConfigSchema, raw, file);
  // The shared checks (RoPE theta present and default, heads, sizes); PhimoeConfig's own default
  // theta (1e6) is never a fallback: a config without one is refused there.
  const base = attentionDecoderConfig(c, false, file, '', true);
  checkElements(file, 'num_local_experts', [c.num_hidden_layers, c.num_local_experts, 2 * c.intermediate_size, c.hidden_size], 'the experts table');
  return {
    ...base, experts: c.num_local_experts, jitterEps: c.router_jitter_noise,
    slidingWindow: c.sliding_window ?? null,
  };
}

const EMBEDDING = 'model.embed_tokens.weight';
const layerName = (l: number, rest: string) => `model.layers.${l}.${rest}`;
const expertName = (l: number, e: number, w: 'w1' | 'w2' | 'w3') => layerName(l, `block_sparse_moe.experts.${e}.${w}.weight`);

/** The experts' host tables: gate and up rows stacked (w1 then w3, as HF's gate_up_proj), and down. */
export const EXPERT_TABLES = { gateUp: 'experts.gate_up', down: 'experts.down' } as const;

function expertMatrices(c: PhimoeConfig): ExpertMatrix[] {
  return [
    { name: EXPERT_TABLES.gateUp, rows: 2 * c.ffn, cols: c.hidden, tensors: (l, e) => [{ name: expertName(l, e, 'w1'), rows: c.ffn }, { name: expertName(l, e, 'w3'), rows: c.ffn }] },
    { name: EXPERT_TABLES.down, rows: c.hidden, cols: c.ffn, tensors: (l, e) => [{ name: expertName(l, e, 'w2'), rows: c.hidden }] },
  ];
}

/** Graph roles, as the runtime's phimoe_generate host-op runs them. */
export const ROLES = {
  attnRouter: 'attn_router', experts: 'experts', lmHead: 'lm_head',
  attnRouterPrefill: 'attn_router_prefill', expertsPrefill: 'experts_prefill',
} as const;

function components(c: PhimoeConfig, layout: ComponentLayout): Component[] {
  // A dry build (the planner's per-layer tensors; maxContext 0) asks for a shard with the lm-head
  // inside: it has none here, the lm-head is always its own graph after the shared experts graph.
  const dry = layout.maxContext === 0;
  if (layout.lmHeadInside && !dry) throw new ConfigError('recipe', 'arch.lmHead.placement', "'last-shard' is not possible for phimoe: the last layer ends in the experts graph every layer shares, so the lm-head is its own graph ('separate')");
  // HF transformers masks keys older than sliding_window positions (Phi-tiny-MoE: 2047), the remote
  // code the model ships does not below 2048 keys (its SDPA mask is plain causal): they agree up to
  // position sliding_window − 1, and the graphs are plain causal, so the cache holds at most
  // sliding_window + 1 positions (2048 for Phi-tiny-MoE; the oracle's prompts stay far below).
  if (!dry && c.slidingWindow !== null && layout.maxContext > c.slidingWindow + 1) {
    throw new ConfigError('recipe', 'arch.maxContext', `${layout.maxContext} is over the model's sliding_window ${c.slidingWindow} + 1: past it HF masks keys the graphs attend to`);
  }
  const N = layout.prefillLength;
  const out: Component[] = layout.shards.map(({ first, last }, index) => ({
    name: `shard${index}`,
    kind: 'attn_router',
    weights: 'layers',
    entry: { shard: index, first, last },
    variants: Array.from({ length: last - first + 1 }, (_, k) => first + k).flatMap((l): GraphVariant[] => [
      { name: `layer${l}`, n: 1, role: ROLES.attnRouter, entry: { first: l, last: l }, build: (g, w) => attnRouterGraph(g, c, l, layout.maxContext, 1, w) },
      ...(N > 0 ? [{
        name: `layer${l}.prefill`, n: N, role: ROLES.attnRouterPrefill, entry: { first: l, last: l }, optional: PREFILL_OPTIONAL,
        build: (g: GraphBuilder, w: GraphWeights) => attnRouterGraph(g, c, l, layout.maxContext, N, w),
      }] : []),
    ]),
  }));
  out.push({
    name: 'experts', kind: 'experts', weights: 'layers', entry: {},
    variants: [
      { name: '', n: 1, role: ROLES.experts, build: (g, w) => expertsGraph(g, c, w.scheme) },
      ...(N > 0 ? [{ name: 'prefill', n: N, role: ROLES.expertsPrefill, optional: PREFILL_OPTIONAL, build: (g: GraphBuilder, w: GraphWeights) => expertsPrefillGraph(g, c, w.scheme, N) }] : []),
    ],
  });
  if (!layout.lmHeadInside) out.push({ name: 'lm_head', kind: 'lm_head', weights: 'lmHead', entry: {}, variants: [{ name: '', n: 1, role: ROLES.lmHead, build: (g, w) => lmHeadGraph(g, c, w) }] });
  return out;
}

/** Experts per token: sparsemixer routes top-2 (the config refuses any other num_experts_per_tok). */
export const TOP_K = 2;

export const phimoe: Family<PhimoeConfig> = {
  id: 'phimoe',
  hostOp: 'phimoe_generate',
  parseConfig: parsePhimoeConfig,
  numLayers: (c) => c.layers,
  hostTables: (c) => [{ name: 'embedding', use: 'embedding', tensor: EMBEDDING, shape: [c.vocab, c.hidden], dtype: 'float16' }],
  // w3's rows (after w1's in the gate_up table) scale the intermediate linearly; w2's columns read it.
  madeTables: (c, scheme, equalize) => expertTables(expertMatrices(c), c.layers, c.experts, scheme, { pair: { up: EXPERT_TABLES.gateUp, upRow: c.ffn, down: EXPERT_TABLES.down, channels: c.ffn }, rules: equalize ?? [] }),
  hostOpParams: (c) => ({ experts: c.experts, top_k: TOP_K, router_jitter_eps: c.jitterEps }),
  components,
  gateCases: (c, entry, trace, maxContext, dir) => phimoeCases(c, entry, trace, maxContext, dir),
  chain: phimoeChain,
  // transformers' PhiMoE keeps each layer's experts stacked (gate_up_proj, down_proj): its loader
  // concatenates the checkpoint's per-expert w1/w3/w2 into them, a private copy in bf16 (5.6 GB at
  // Phi-tiny-MoE's size; the trace measured 6.64 GB private where 1.38 GB had been predicted).
  hfLoadCopies: (c) => ({ bytes: c.layers * c.experts * 3 * c.ffn * c.hidden * 2, what: `each layer's ${c.experts} experts stacked by HF's loader, bf16` }),
  bindings: (c, entry, maxContext) => phimoeBindings(c, entry, maxContext),
  // The attention's values (no dense MLP: an expert's channels are equalized in its host tables instead).
  rescalePairs: [VALUES_RESCALE],
};

// ---- graphs ----------------------------------------------------------------------------------

const f32 = 'float32' as const;
const io = (name: string, shape: number[], dtype: ElemType = f32): TensorIO => ({ name, dtype, shape });

/**
 * An op's name scope within its layer's (`self_attn.q_proj` for model.layers.3.self_attn.q_proj,
 * `final_norm` for model.norm, as decoder.ts names it): with the caller's `layers.i` its nodes read `layers.3/self_attn.q_proj/Gemm`,
 * as qwen3's do, which forge bisect's probes name.
 */
const opScope = (name: string) => (name === 'model.norm' ? 'final_norm' : name.replace(/^model\.(layers\.\d+\.)?/, ''));

/**
 * x·Wᵀ + b. A rescale pair's power of two: `out` scales the whole output (weight and bias: the values
 * v_proj gives), `input` undoes a scale of x (the weight alone: o_proj reading values scaled by 1/input).
 */
async function biasedLinear(g: GraphBuilder, w: GraphWeights, x: string, name: string, shape: [number, number], n: number, scale: { out?: number; input?: number } = {}): Promise<string> {
  const { out = 1, input = 1 } = scale;
  return g.scoped(opScope(name), async () => {
    const y = await w.store.linear(g, x, `${name}.weight`, shape, w.scheme, n, undefined, undefined, out * input);
    return g.op('Add', [y, await w.store.small(g, `${name}.bias`, [shape[0]], out === 1 ? undefined : (b) => b.map((v) => v * out))]);
  });
}

async function norm(g: GraphBuilder, w: GraphWeights, x: string, name: string, size: number, eps: number): Promise<string> {
  return g.scoped(opScope(name), async () => layerNorm(g, x, await w.store.small(g, `${name}.weight`, [size]), await w.store.small(g, `${name}.bias`, [size]), eps));
}

/** Layer l's attention and router over n tokens: h.l → attn_res (residual), moe_in (hand-off), router_logits, new K/V rows. */
async function attnRouterGraph(g: GraphBuilder, c: PhimoeConfig, l: number, ctx: number, n: number, w: GraphWeights): Promise<GraphInterface> {
  return g.scoped(`layers.${l}`, () => attnRouterOps(g, c, l, ctx, n, w));
}

async function attnRouterOps(g: GraphBuilder, c: PhimoeConfig, l: number, ctx: number, n: number, w: GraphWeights): Promise<GraphInterface> {
  const { hidden: H, heads, kvHeads, headDim: d } = c;
  const x = g.input('hidden_in', f32, [1, n, H]);
  const position = g.input('position', 'int32', [n]);
  const mask = g.input('attn_mask', f32, [1, 1, n, ctx + n]);
  const pastK = g.input(pastKv('k', l), f32, [1, kvHeads, ctx, d]);
  const pastV = g.input(pastKv('v', l), f32, [1, kvHeads, ctx, d]);
  const tables = ropeTables(ctx, d, c.ropeTheta);
  const rope = ropeGather(g, position, { cos: g.initializer('rope.cos', tables.cos, [ctx, d]), sin: g.initializer('rope.sin', tables.sin, [ctx, d]) }, n, d);
  const p = (rest: string) => layerName(l, rest);
  const xn = await norm(g, w, x, p('input_layernorm'), H, c.eps);
  const q = splitHeads(g, await biasedLinear(g, w, xn, p('self_attn.q_proj'), [heads * d, H], n), heads, d, n);
  const k = splitHeads(g, await biasedLinear(g, w, xn, p('self_attn.k_proj'), [kvHeads * d, H], n), kvHeads, d, n);
  const vs = valueScale(g, pastV, newKv('v', l));
  const v = splitHeads(g, await biasedLinear(g, w, xn, p('self_attn.v_proj'), [kvHeads * d, H], n, { out: vs }), kvHeads, d, n);
  const newK = g.output(applyRope(g, k, rope), newKv('k', l), { shape: [1, kvHeads, n, d] });
  const newV = g.output(v, newKv('v', l), { shape: [1, kvHeads, n, d] });
  const attn = cachedAttention(g, applyRope(g, q, rope), newK, newV, pastK, pastV, mask, { heads, kvHeads, headDim: d, n, ctx, scale: 1 / Math.sqrt(d) });
  const o = await biasedLinear(g, w, mergeHeads(g, attn, heads, d, n), p('self_attn.o_proj'), [H, heads * d], n, { input: 1 / vs });
  const attnRes = g.output(g.op('Add', [x, o]), 'attn_res', { shape: [1, n, H] });
  const moeIn = g.output(await norm(g, w, attnRes, p('post_attention_layernorm'), H, c.eps), 'moe_in', { shape: [1, n, H] });
  const router = await g.scoped('block_sparse_moe.gate', () => w.store.linear(g, moeIn, p('block_sparse_moe.gate.weight'), [c.experts, H], w.scheme, n));
  const logits = g.output(router, 'router_logits', { shape: [1, n, c.experts] });
  return {
    inputs: [io(x, [1, n, H]), io(position, [n], 'int32'), io(mask, [1, 1, n, ctx + n]), io(pastK, [1, kvHeads, ctx, d]), io(pastV, [1, kvHeads, ctx, d])],
    outputs: [io(attnRes, [1, n, H]), io(moeIn, [1, n, H]), io(logits, [1, n, c.experts]), io(newK, [1, kvHeads, n, d]), io(newV, [1, kvHeads, n, d])],
    probes: {},
  };
}

/** The experts' rows as graph inputs: `expert_<table>_<slot>`, and W8's per-row scales. */
export const expertInput = (table: string, slot: number) => `${table.replace(/^experts\./, 'expert_')}_${slot}`;
export const expertScaleInput = (table: string, slot: number) => `${expertInput(table, slot)}_scale`;


/**
 * One expert's rows as a graph input (`expert_<table>_<slot>`, in the scheme's dtype) and x [1,n,in]
 * through them → [1,n,out]. W8 (and W4: EXPERT_ROW_DTYPE): the int8 rows enter as a quantized tensor of scale 1 (a static
 * DequantizeLinear, which QNN takes as an int8 input; a Cast from int8 it cannot place on the HTP)
 * and each output is multiplied by its row's scale (`…_scale`) after the product: the same numbers
 * as dequantizing the rows first (one scale per row), without an [out, in] multiply.
 */
function expertProject(g: GraphBuilder, scheme: QuantScheme, inputs: TensorIO[], x: string, table: string, slot: number, shape: [number, number], n: number): string {
  const name = g.input(expertInput(table, slot), EXPERT_ROW_DTYPE[scheme], shape);
  inputs.push(io(name, shape, EXPERT_ROW_DTYPE[scheme]));
  if (!int8Rows(scheme)) return linear(g, x, scheme === 'fp16' ? g.op('Cast', [name], { to: 1 }) : name, shape[1], shape[0], n);
  const w = g.op('DequantizeLinear', [name, g.constFloat32([1], []), g.initializer(`${name}.zero`, Int8Array.of(0), [], 'int8')]);
  const scale = g.input(expertScaleInput(table, slot), f32, [shape[0]]);
  inputs.push(io(scale, [shape[0]]));
  return g.op('Mul', [linear(g, x, w, shape[1], shape[0], n), scale]);
}

/** The expert of `slot` over x [1,n,H]: gate/up rows, SwiGLU, down rows → [1,n,H], unweighted. */
function expertFfn(g: GraphBuilder, c: PhimoeConfig, scheme: QuantScheme, inputs: TensorIO[], x: string, slot: number, n: number): string {
  const gateUp = expertProject(g, scheme, inputs, x, EXPERT_TABLES.gateUp, slot, [2 * c.ffn, c.hidden], n);
  const [gate, up] = g.op('Split', [gateUp], { axis: -1 }, 2);
  return expertProject(g, scheme, inputs, swiGate(g, gate, up), EXPERT_TABLES.down, slot, [c.hidden, c.ffn], n);
}

/**
 * The two selected experts over one token, for any layer: moe_in (hand-off) through each slot's
 * gate/up and down rows (fed from the host tables), weighted by the host's routing weights, added
 * to the attention residual.
 */
async function expertsGraph(g: GraphBuilder, c: PhimoeConfig, scheme: QuantScheme): Promise<GraphInterface> {
  const H = c.hidden;
  const res = g.input('attn_res', f32, [1, 1, H]);
  const moeIn = g.input('moe_in', f32, [1, 1, H]);
  const routing = g.input('routing', f32, [2]);
  const inputs: TensorIO[] = [io(res, [1, 1, H]), io(moeIn, [1, 1, H]), io(routing, [2])];
  let sum: string | undefined;
  for (const slot of [0, 1]) {
    const weighted = g.op('Mul', [expertFfn(g, c, scheme, inputs, moeIn, slot, 1), g.op('Gather', [routing, g.constInt64([slot], [])], { axis: 0 })]);
    sum = sum ? g.op('Add', [sum, weighted]) : weighted;
  }
  const out = g.output(g.op('Add', [res, sum!]), 'hidden_out', { shape: [1, 1, H] });
  return { inputs, outputs: [io(out, [1, 1, H])], probes: {} };
}

/**
 * One expert over a prefill chunk of n tokens, for any layer and expert: acc + routing ⊙ FFN_e(moe_in),
 * routing [n] being each token's weight for this expert (0 where the token chose others). The host
 * runs it once per expert the chunk chose, threading acc from the attention residual; its rows are
 * slot 0's.
 */
async function expertsPrefillGraph(g: GraphBuilder, c: PhimoeConfig, scheme: QuantScheme, n: number): Promise<GraphInterface> {
  const H = c.hidden;
  const acc = g.input('acc', f32, [1, n, H]);
  const moeIn = g.input('moe_in', f32, [1, n, H]);
  const routing = g.input('routing', f32, [n]);
  const inputs: TensorIO[] = [io(acc, [1, n, H]), io(moeIn, [1, n, H]), io(routing, [n])];
  const y = expertFfn(g, c, scheme, inputs, moeIn, 0, n);
  const weighted = g.op('Mul', [y, g.op('Reshape', [routing, g.constInt64([1, n, 1])])]);
  const out = g.output(g.op('Add', [acc, weighted]), 'hidden_out', { shape: [1, n, H] });
  return { inputs, outputs: [io(out, [1, n, H])], probes: {} };
}

/** The last layer's residual [1,1,H] → final LayerNorm → biased lm-head → logits [1,1,V]. */
async function lmHeadGraph(g: GraphBuilder, c: PhimoeConfig, w: GraphWeights): Promise<GraphInterface> {
  const x = g.input('hidden', f32, [1, 1, c.hidden]);
  const xn = await norm(g, w, x, 'model.norm', c.hidden, c.eps);
  const y = await w.store.linear(g, xn, 'lm_head.weight', [c.vocab, c.hidden], w.lmHeadScheme, 1);
  const logits = g.output(g.op('Add', [y, await w.store.small(g, 'lm_head.bias', [c.vocab])]), 'logits', { shape: [1, 1, c.vocab] });
  return { inputs: [io(x, [1, 1, c.hidden])], outputs: [io(logits, [1, 1, c.vocab])], probes: {} };
}
