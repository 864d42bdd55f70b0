// Qwen3.5 (GatedDeltaNet hybrid), model_type "qwen3_5". The text decoder is nested in
// `text_config` and its weights live under `model.language_model.*` (the checkpoint also carries a
// vision tower and MTP weights, which forge does not read). What is special:
//  - RMSNorm is x·rsqrt(mean x²+eps)·(1+w) (weights stored centred on 0), also for q_norm/k_norm;
//    the gated norm inside linear attention uses a plain w: w·norm(o)·silu(z).
//  - Three of every four layers are linear attention (Qwen3_5GatedDeltaNet): a causal depthwise
//    conv over a FIFO of the last K in_proj_qkv outputs, then the gated delta rule on a recurrent
//    state S [Hv, dk, dv]. Both are carried from token to token as explicit graph state
//    (conv_state_{i} [1, C, K] in HF's LinearAttentionLayer.conv_states layout, rec_state_{i}
//    [1, Hv, dk, dv]), and the whole next value comes back (new_conv_state_{i}, new_rec_state_{i}).
//    The state math stays float32 in every scheme (only matmul weights are quantized).
//  - Full-attention layers: q_proj gives [H, 2·d] per head (first d = query, second d = an output
//    gate applied as attn·sigmoid(gate) before o_proj); partial rotary (the first
//    d·partial_rotary_factor dims, rotate_half pairing inside them); GQA over an explicit KV cache.
//    M-RoPE with equal text/height/width positions (text tokens) is plain 1-D RoPE.
//  - Batched prefill (N tokens per call): the linear-attention layers run the causal conv over the
//    chunk and HF's chunked delta rule as static ops (delta-rule.ts: the intra-chunk triangular
//    system by matmuls only), the full-attention layers AR-N over the cache; both hand the decode
//    graphs the states after the last real row (padding rows write nothing).
import { z } from 'zod';
import { checkElements, ConfigError, MAX_DIM, parseConfigWith, type Family, type GraphBindings, type GraphInterface, type GraphWeights, type ShardSpec, type TensorIO } from './types.js';
import type { GraphBuilder } from '../onnx/builder.js';
import type { Trace } from '../gates/trace.js';
import type { GraphEntry } from './types.js';
import { type KvLayout, kvDecoderBindings, kvDecoderCases } from './kv-decoder.js';
import type { Feed, GateCase } from './types.js';
import {
  applyPartialRope, cachedAttention, causalConvStep, gatedDeltaStep, gatedRmsNorm, l2Norm, mergeHeads,
  rmsNorm, ropeGather, ropeTables, silu, softplus, splitHeads, gatedMlp, MLP_RESCALE, valueScale, VALUES_RESCALE,
} from './blocks.js';
import { attentionDecoderConfig, decoderComponents, lmHeadGraph, type AttentionDecoderConfig } from './decoder.js';
import { newKv, pastKv, recurrentIn, recurrentOut } from './state-io.js';
import { causalConvChunk, chunkedGatedDelta, realRows } from './delta-rule.js';

const LAYER_TYPES = ['linear_attention', 'full_attention'] as const;
type LayerType = (typeof LAYER_TYPES)[number];

const TextConfigSchema = z.object({
  model_type: z.literal('qwen3_5_text').optional(),
  hidden_size: z.number().int().positive(),
  intermediate_size: z.number().int().positive(),
  num_hidden_layers: z.number().int().positive(),
  num_attention_heads: z.number().int().positive(),
  num_key_value_heads: z.number().int().positive(),
  head_dim: z.number().int().positive().default(256), // HF's default for this family
  vocab_size: z.number().int().positive(),
  rms_norm_eps: z.number().positive(),
  hidden_act: z.string().default('silu'),
  max_position_embeddings: z.number().int().positive(),
  attention_bias: z.boolean().default(false),
  tie_word_embeddings: z.boolean().optional(),
  linear_conv_kernel_dim: z.number().int().positive(),
  linear_num_key_heads: z.number().int().positive(),
  linear_num_value_heads: z.number().int().positive(),
  linear_key_head_dim: z.number().int().positive(),
  linear_value_head_dim: z.number().int().positive(),
  layer_types: z.array(z.enum(LAYER_TYPES)).optional(),
  full_attention_interval: z.number().int().positive().optional(),
  // transformers >= 5 writes rope_parameters; older configs write rope_theta / partial_rotary_factor flat.
  rope_parameters: z.object({
    rope_theta: z.number().positive(),
    rope_type: z.string().default('default'),
    partial_rotary_factor: z.number().positive().max(1).optional(),
    mrope_section: z.array(z.number().int().nonnegative()).optional(),
    mrope_interleaved: z.boolean().optional(),
  }).passthrough().optional(),
  rope_theta: z.number().positive().optional(),
  partial_rotary_factor: z.number().positive().max(1).optional(),
}).passthrough();

const ConfigSchema = z.object({
  model_type: z.literal('qwen3_5'),
  text_config: TextConfigSchema,
  // HF ties the lm-head by the top-level flag of Qwen3_5ForConditionalGeneration.
  tie_word_embeddings: z.boolean().optional(),
}).passthrough();

/** The attention decoder's fields (for the full-attention layers) plus the hybrid's own. */
export interface Qwen35Config extends AttentionDecoderConfig {
  /** Rotated dims at the front of each full-attention head (head_dim · partial_rotary_factor). */
  rotaryDim: number;
  layerTypes: LayerType[];
  linear: {
    kHeads: number;
    vHeads: number;
    kDim: number;
    vDim: number;
    convKernel: number;
    /** Conv channels = in_proj_qkv rows: q and k (kHeads·kDim each) then v (vHeads·vDim). */
    convDim: number;
  };
}

export function parseQwen35Config(raw: unknown, file: string): Qwen35Config {
  const parsed = parseConfigWith(ConfigSchema, raw, file);
  const t = parsed.text_config;
  const f = (name: string) => `text_config.${name}`;
  // HF ties the lm-head by the top-level flag of Qwen3_5ForConditionalGeneration.
  const base = attentionDecoderConfig(t, parsed.tie_word_embeddings ?? t.tie_word_embeddings ?? false, file, 'text_config.');
  // HF's config class defaults the factor to 0.25 for configs that predate it.
  const factor = t.rope_parameters?.partial_rotary_factor ?? t.partial_rotary_factor ?? 0.25;
  const rotaryDim = Math.floor(t.head_dim * factor);
  if (rotaryDim < 2 || rotaryDim % 2 !== 0) {
    throw new ConfigError(file, f('rope_parameters.partial_rotary_factor'), `${factor} of head_dim ${t.head_dim} gives ${rotaryDim} rotated dims (need an even number >= 2)`);
  }
  if (t.hidden_act !== 'silu') throw new ConfigError(file, f('hidden_act'), `'${t.hidden_act}' is not supported (only silu)`);
  if (t.linear_num_value_heads % t.linear_num_key_heads !== 0) {
    throw new ConfigError(file, f('linear_num_key_heads'), `${t.linear_num_key_heads} does not divide linear_num_value_heads ${t.linear_num_value_heads}`);
  }
  const n = t.num_hidden_layers;
  let layerTypes: LayerType[];
  if (t.layer_types) {
    if (t.layer_types.length !== n) throw new ConfigError(file, f('layer_types'), `${t.layer_types.length} entries for ${n} layers`);
    layerTypes = t.layer_types;
  } else {
    const every = t.full_attention_interval ?? 4;
    layerTypes = Array.from({ length: n }, (_, i) => ((i + 1) % every === 0 ? 'full_attention' : 'linear_attention'));
  }
  const { linear_num_key_heads: kHeads, linear_num_value_heads: vHeads, linear_key_head_dim: kDim, linear_value_head_dim: vDim } = t;
  for (const [field, v] of Object.entries({ linear_num_key_heads: kHeads, linear_num_value_heads: vHeads, linear_key_head_dim: kDim, linear_value_head_dim: vDim, linear_conv_kernel_dim: t.linear_conv_kernel_dim })) {
    if (v > MAX_DIM) throw new ConfigError(file, f(field), `${v} is above ${MAX_DIM}`);
  }
  checkElements(file, f('linear_key_head_dim'), [2 * kHeads * kDim + vHeads * vDim, t.hidden_size], 'in_proj_qkv');
  checkElements(file, f('linear_value_head_dim'), [vHeads * vDim, t.hidden_size], 'in_proj_z');
  checkElements(file, f('linear_conv_kernel_dim'), [2 * kHeads * kDim + vHeads * vDim, t.linear_conv_kernel_dim], 'the conv state');
  return {
    ...base,
    rotaryDim,
    layerTypes,
    linear: { kHeads, vHeads, kDim, vDim, convKernel: t.linear_conv_kernel_dim, convDim: 2 * kHeads * kDim + vHeads * vDim },
  };
}

const PREFIX = 'model.language_model';
const layerPrefix = (i: number) => `${PREFIX}.layers.${i}`;
const isFull = (c: Qwen35Config, i: number) => c.layerTypes[i] === 'full_attention';

// ---- state layout -----------------------------------------------------------------------------

/** Every full-attention layer's KV cache has the same heads and head size. */
const kvLayout = (c: Qwen35Config, maxContext: number): KvLayout => ({ maxContext, layer: () => ({ kvHeads: c.kvHeads, headDim: c.headDim }) });

/** The per-layer state a graph exchanges, by graph input name. */
function stateShapes(c: Qwen35Config, maxContext: number, n = 1) {
  const { vHeads, kDim, vDim, convDim, convKernel } = c.linear;
  return {
    conv: [1, convDim, convKernel],
    rec: [1, vHeads, kDim, vDim],
    kvCache: [1, c.kvHeads, maxContext, c.headDim],
    kvRow: [1, c.kvHeads, n, c.headDim],
  };
}

/** Qwen3.5's recurrent states per linear-attention layer: the conv FIFO and the delta-rule state. */
const CONV = 'conv';
const REC = 'rec';

const EMBEDDING = `${PREFIX}.embed_tokens.weight`;
const lmHeadWeight = (c: Qwen35Config) => (c.tied ? EMBEDDING : 'lm_head.weight');

export const qwen3_5: Family<Qwen35Config> = {
  id: 'qwen3_5',
  hostOp: 'qwen3_5_generate',
  parseConfig: parseQwen35Config,
  numLayers: (c) => c.layers,
  hostTables: (c) => [{ name: 'embedding', use: 'embedding', tensor: EMBEDDING, shape: [c.vocab, c.hidden], dtype: 'float16' }],
  components: (c, layout) => decoderComponents(layout, {
    shard: (g, s, w) => qwen35Shard(g, c, s, w),
    lmHead: (g, w) => lmHeadGraph(g, c.hidden, c.vocab, lmHeadWeight(c), w),
  }),
  gateCases: (c, entry, trace, maxContext) => qwen35Cases(c, entry, trace, maxContext),
  bindings: (c, entry, maxContext) => qwen35Bindings(c, entry, maxContext),
  // The full-attention layers' values; the linear-attention layers have no exact pair: a SiLU follows
  // the causal conv over q, k and v, and the gate z, and the output norm undoes any scale of the values.
  rescalePairs: [MLP_RESCALE, VALUES_RESCALE],
};

// ---- graphs -----------------------------------------------------------------------------------

/** (1+w) as stored: Qwen3.5 norm weights are centred on 0. */
const onePlus = (x: Float32Array) => Float32Array.from(x, (v) => 1 + v);

interface LayerIO {
  rope?: { cos: string; sin: string };
  mask?: string;
  ctx: number;
  /** Tokens per call. */
  n: number;
  /** Prefill: which rows are real, [1, 1, N, 1] (delta-rule.ts realRows). */
  real?: string;
}

interface LayerResult {
  out: string;
  inputs: TensorIO[];
  outputs: TensorIO[];
}

/**
 * The GatedDeltaNet token mixer on the normed input xn [1, N, H]; returns [1, N, H]. One token steps
 * the conv FIFO and the recurrent state; N tokens (a prefill call) run the causal conv over the
 * chunk and the chunked delta rule (delta-rule.ts), padding rows (lio.real) writing no state.
 */
async function linearAttention(g: GraphBuilder, c: Qwen35Config, layer: number, xn: string, w: GraphWeights, lio: LayerIO, io: { inputs: TensorIO[]; outputs: TensorIO[] }): Promise<string> {
  const { hidden: H, eps } = c;
  const { kHeads: Hk, vHeads: Hv, kDim: dk, vDim: dv, convDim: C, convKernel: K } = c.linear;
  const n = lio.n;
  const p = `${layerPrefix(layer)}.linear_attn`;
  // Ops named as the checkpoint's modules under the caller's `layers.i` scope (forge bisect names them).
  const lin = (x: string, name: string, shape: [number, number]) => g.scoped(`linear_attn.${name}`, () => w.store.linear(g, x, `${p}.${name}.weight`, shape, w.scheme, n));
  const shapes = stateShapes(c, 0);
  const f32 = 'float32' as const;

  const convIn = g.input(recurrentIn(CONV, layer), f32, shapes.conv);
  const recIn = g.input(recurrentIn(REC, layer), f32, shapes.rec);
  io.inputs.push({ name: convIn, dtype: f32, shape: shapes.conv }, { name: recIn, dtype: f32, shape: shapes.rec });

  const qkv = await lin(xn, 'in_proj_qkv', [C, H]);
  const z = await lin(xn, 'in_proj_z', [Hv * dv, H]);
  const b = await lin(xn, 'in_proj_b', [Hv, H]);
  const a = await lin(xn, 'in_proj_a', [Hv, H]);

  // Causal depthwise conv over the FIFO, then SiLU.
  const taps = g.op('Reshape', [await w.store.small(g, `${p}.conv1d.weight`, [C, 1, K]), g.constInt64([1, C, K])]);
  const channels = n === 1 ? g.op('Reshape', [qkv, g.constInt64([1, C, 1])]) : g.op('Transpose', [qkv], { perm: [0, 2, 1] }); // [1, C, N]
  const conv = await g.scoped('linear_attn.conv1d', async () => (n === 1 ? causalConvStep(g, convIn, channels, taps, K) : causalConvChunk(g, convIn, channels, taps, K, n, lio.real!)));
  const convOut = g.output(conv.next, recurrentOut(CONV, layer), { shape: shapes.conv });
  io.outputs.push({ name: convOut, dtype: f32, shape: shapes.conv });
  const mixed = silu(g, n === 1 ? conv.out : g.op('Transpose', [conv.out], { perm: [0, 2, 1] })); // [1, C] or [1, N, C]
  const [q0, k0, v0] = g.op('Split', [mixed, g.constInt64([Hk * dk, Hk * dk, Hv * dv])], { axis: -1 }, 3);

  // l2-normalised q and k (eps 1e-6, as HF/FLA), q / sqrt(dk); key head ⌊h·Hk/Hv⌋ serves value head h.
  const byHead = (x: string, heads: number, d: number) => (n === 1
    ? g.op('Reshape', [x, g.constInt64([1, heads, 1, d])])
    : g.op('Transpose', [g.op('Reshape', [x, g.constInt64([1, n, heads, d])])], { perm: [0, 2, 1, 3] })); // [1, heads, N, d]
  const heads = (x: string) => {
    const normed = l2Norm(g, byHead(x, Hk, dk), 1e-6);
    if (Hk === Hv) return normed;
    const r = Hv / Hk;
    return g.op('Reshape', [g.op('Expand', [g.op('Reshape', [normed, g.constInt64([1, Hk, 1, n, dk])]), g.constInt64([1, Hk, r, n, dk])]), g.constInt64([1, Hv, n, dk])]);
  };
  const q = g.op('Div', [heads(q0), g.constFloat32([Math.sqrt(dk)], [])]);
  const k = heads(k0);
  const v = byHead(v0, Hv, dv);

  // β = sigmoid(b); g = -exp(A_log)·softplus(a + dt_bias); the state decays by exp(g). Per head
  // and token as [1, Hv, N, 1]; padding rows get β = 0 and g = 0 (no write, no decay).
  const perHead = (x: string) => (n === 1 ? g.op('Reshape', [x, g.constInt64([1, Hv, 1, 1])])
    : g.op('Mul', [g.op('Reshape', [g.op('Transpose', [x], { perm: [0, 2, 1] }), g.constInt64([1, Hv, n, 1])]), lio.real!]));
  const beta = perHead(g.op('Sigmoid', [b]));
  const dtBias = await w.store.small(g, `${p}.dt_bias`, [Hv]);
  const aLog = await w.store.small(g, `${p}.A_log`, [Hv]);
  const logDecay = perHead(g.op('Mul', [g.op('Neg', [g.op('Exp', [aLog])]), softplus(g, g.op('Add', [a, dtBias]))]));

  const step = await g.scoped('linear_attn.delta_rule', async () => (n === 1
    ? gatedDeltaStep(g, { q, k, v, beta, decay: g.op('Exp', [logDecay]), state: recIn })
    : chunkedGatedDelta(g, { q, k, v, beta, logDecay, state: recIn }, n)));
  const recOut = g.output(step.next, recurrentOut(REC, layer), { shape: shapes.rec });
  io.outputs.push({ name: recOut, dtype: f32, shape: shapes.rec });

  // Per-head gated RMSNorm with z (plain weight), then out_proj.
  const o = n === 1 ? g.op('Reshape', [step.out, g.constInt64([1, 1, Hv, dv])]) : g.op('Transpose', [step.out], { perm: [0, 2, 1, 3] }); // [1, N, Hv, dv]
  const zh = g.op('Reshape', [z, g.constInt64([1, n, Hv, dv])]);
  const normW = await w.store.small(g, `${p}.norm.weight`, [dv]);
  const normed = await g.scoped('linear_attn.norm', async () => gatedRmsNorm(g, o, zh, normW, eps));
  return lin(g.op('Reshape', [normed, g.constInt64([1, n, Hv * dv])]), 'out_proj', [H, Hv * dv]);
}

/** Gated full attention over the KV cache on the normed input xn [1, N, H]; returns [1, N, H]. */
async function fullAttention(g: GraphBuilder, c: Qwen35Config, layer: number, xn: string, w: GraphWeights, lio: LayerIO, io: { inputs: TensorIO[]; outputs: TensorIO[] }): Promise<string> {
  const { hidden: H, heads, kvHeads, headDim: d, eps } = c;
  const n = lio.n;
  const p = `${layerPrefix(layer)}.self_attn`;
  const lin = (x: string, name: string, shape: [number, number], scale = 1) => g.scoped(`self_attn.${name}`, () => w.store.linear(g, x, `${p}.${name}.weight`, shape, w.scheme, n, undefined, undefined, scale));
  const norm = (name: string) => w.store.small(g, `${p}.${name}.weight`, [d], onePlus);
  const shapes = stateShapes(c, lio.ctx, n);
  const f32 = 'float32' as const;

  const pastK = g.input(pastKv('k', layer), f32, shapes.kvCache);
  const pastV = g.input(pastKv('v', layer), f32, shapes.kvCache);
  io.inputs.push({ name: pastK, dtype: f32, shape: shapes.kvCache }, { name: pastV, dtype: f32, shape: shapes.kvCache });

  // q_proj rows are [head][query d | gate d].
  const qg = g.op('Reshape', [await lin(xn, 'q_proj', [heads * d * 2, H]), g.constInt64([1, n, heads, 2 * d])]);
  const [q0, gate0] = g.op('Split', [qg, g.constInt64([d, d])], { axis: -1 }, 2);
  const q = g.op('Transpose', [q0], { perm: [0, 2, 1, 3] });
  const gate = g.op('Reshape', [gate0, g.constInt64([1, n, heads * d])]);
  const k = splitHeads(g, await lin(xn, 'k_proj', [kvHeads * d, H]), kvHeads, d, n);
  const vs = valueScale(g, pastV, newKv('v', layer));
  const v = splitHeads(g, await lin(xn, 'v_proj', [kvHeads * d, H], vs), kvHeads, d, n);
  const qr = applyPartialRope(g, rmsNorm(g, q, await norm('q_norm'), eps, 'self_attn.q_norm'), lio.rope!, c.rotaryDim, d);
  const kr = applyPartialRope(g, rmsNorm(g, k, await norm('k_norm'), eps, 'self_attn.k_norm'), lio.rope!, c.rotaryDim, d);
  const newK = g.output(kr, newKv('k', layer), { shape: shapes.kvRow });
  const newV = g.output(v, newKv('v', layer), { shape: shapes.kvRow });
  io.outputs.push({ name: newK, dtype: f32, shape: shapes.kvRow }, { name: newV, dtype: f32, shape: shapes.kvRow });
  const attn = cachedAttention(g, qr, newK, newV, pastK, pastV, lio.mask!, { heads, kvHeads, headDim: d, n, ctx: lio.ctx, scale: 1 / Math.sqrt(d) });
  const gated = g.op('Mul', [mergeHeads(g, attn, heads, d, n), g.op('Sigmoid', [gate])]);
  return lin(gated, 'o_proj', [H, heads * d], 1 / vs);
}

/** One decoder layer (token mixer by layer type, then the SwiGLU MLP); returns the residual output h.{layer+1}. */
async function qwen35Layer(g: GraphBuilder, c: Qwen35Config, layer: number, x: string, w: GraphWeights, lio: LayerIO): Promise<LayerResult> {
  const { hidden: H, ffn, eps } = c;
  const p = layerPrefix(layer);
  const io = { inputs: [] as TensorIO[], outputs: [] as TensorIO[] };
  const xn = rmsNorm(g, x, await w.store.small(g, `${p}.input_layernorm.weight`, [H], onePlus), eps, 'input_layernorm');
  const mixed = isFull(c, layer)
    ? await fullAttention(g, c, layer, xn, w, lio, io)
    : await linearAttention(g, c, layer, xn, w, lio, io);
  const h1 = g.op('Add', [x, mixed]);
  const mlpIn = rmsNorm(g, h1, await w.store.small(g, `${p}.post_attention_layernorm.weight`, [H], onePlus), eps, 'post_attention_layernorm');
  const mlp = await gatedMlp(g, mlpIn, silu, (x, m, s) => w.store.linear(g, x, `${p}.mlp.${m}.weight`, m === 'down_proj' ? [H, ffn] : [ffn, H], w.scheme, lio.n, undefined, undefined, s));
  const out = g.op('Add', [h1, mlp], {}, 1, { outputs: [`h.${layer + 1}`] });
  return { out, ...io };
}

/**
 * A shard over N tokens per call (1: decode; N: a prefill chunk): hidden_in [1, N, H], every layer's
 * state, and the position and mask when it holds a full-attention layer. A prefill shard always takes
 * the mask: its linear-attention layers read from it which rows are real.
 */
export async function qwen35Shard(g: GraphBuilder, c: Qwen35Config, s: ShardSpec, w: GraphWeights): Promise<GraphInterface> {
  const { hidden: H } = c;
  const ctx = s.maxContext;
  const n = s.n;
  const f32 = 'float32' as const;
  const x0 = g.input('hidden_in', f32, [1, n, H]);
  const inputs: TensorIO[] = [{ name: x0, dtype: f32, shape: [1, n, H] }];
  const outputs: TensorIO[] = [];
  const probes: Record<string, TensorIO> = {};
  const lio: LayerIO = { ctx, n };
  const layers = Array.from({ length: s.last - s.first + 1 }, (_, k) => s.first + k);
  const hasFull = layers.some((i) => isFull(c, i));
  if (hasFull) {
    // Positions only matter to full-attention layers; a linear-only decode shard takes no mask either.
    const position = g.input('position', 'int32', [n]);
    const tables = ropeTables(ctx, c.rotaryDim, c.ropeTheta);
    lio.rope = ropeGather(g, position, {
      cos: g.initializer('rope.cos', tables.cos, [ctx, c.rotaryDim]), sin: g.initializer('rope.sin', tables.sin, [ctx, c.rotaryDim]),
    }, n, c.rotaryDim);
    inputs.push({ name: position, dtype: 'int32', shape: [n] });
  }
  if (hasFull || n > 1) {
    const mask = g.input('attn_mask', f32, [1, 1, n, ctx + n]);
    lio.mask = mask;
    if (n > 1) lio.real = realRows(g, mask, ctx, n);
    inputs.push({ name: mask, dtype: f32, shape: [1, 1, n, ctx + n] });
  }
  let x = x0;
  for (const i of layers) {
    const r = await g.scoped(`layers.${i}`, () => qwen35Layer(g, c, i, x, w, lio));
    inputs.push(...r.inputs);
    outputs.push(...r.outputs);
    x = r.out;
    if (i < s.last || s.isLast) probes[x] = { name: `h.${i + 1}`, dtype: f32, shape: [1, n, H] };
  }
  if (s.isLast) x = rmsNorm(g, x, await w.store.small(g, `${PREFIX}.norm.weight`, [H], onePlus), c.eps, 'final_norm');
  const hiddenOut = g.output(x, 'hidden_out', { shape: [1, n, H] });
  outputs.unshift({ name: hiddenOut, dtype: f32, shape: [1, n, H] });
  if (s.isLast && s.lmHeadInside) {
    const logits = g.output(await w.store.linear(g, hiddenOut, lmHeadWeight(c), [c.vocab, H], w.lmHeadScheme, n), 'logits', { shape: [1, n, c.vocab] });
    outputs.push({ name: logits, dtype: f32, shape: [1, n, c.vocab] });
  }
  return { inputs, outputs, probes };
}

// ---- trace → graph inputs ---------------------------------------------------------------------

/**
 * Teacher-forced calls (kvDecoderCases: decode steps one by one, prefill chunks over the prompt),
 * the KV caches of the full-attention layers only; each linear-attention layer gets the conv and
 * recurrent state HF held after step start - 1 (zeros at 0) and must give back the states HF held
 * after the call's last real step.
 */
export function qwen35Cases(c: Qwen35Config, entry: GraphEntry, trace: Trace, maxContext: number): AsyncGenerator<GateCase> {
  const shapes = stateShapes(c, maxContext);
  const zeros = { conv: new Float32Array(shapes.conv.reduce((a, b) => a * b, 1)), rec: new Float32Array(shapes.rec.reduce((a, b) => a * b, 1)) };
  const f = (data: Float32Array, dims: number[]): Feed => ({ dtype: 'float32', data, dims });
  return kvDecoderCases(entry, trace, kvLayout(c, maxContext), {
    kvLayers: (layers) => layers.filter((i) => isFull(c, i)),
    extra: async ({ prompt: p, start, valid, layers }, feeds, expected) => {
      for (const i of layers.filter((l) => !isFull(c, l))) {
        feeds[recurrentIn(CONV, i)] = f(start === 0 ? zeros.conv : await trace.get(p, start - 1, `${CONV}.${i}`), shapes.conv);
        feeds[recurrentIn(REC, i)] = f(start === 0 ? zeros.rec : await trace.get(p, start - 1, `${REC}.${i}`), shapes.rec);
        expected[recurrentOut(CONV, i)] = await trace.get(p, start + valid - 1, `${CONV}.${i}`);
        expected[recurrentOut(REC, i)] = await trace.get(p, start + valid - 1, `${REC}.${i}`);
      }
    },
  });
}

/** How the runtime binds each input/output: KV caches by rows, conv/recurrent states replaced whole. */
export function qwen35Bindings(c: Qwen35Config, entry: GraphEntry, maxContext: number): GraphBindings {
  const shapes = stateShapes(c, maxContext);
  return kvDecoderBindings(entry, kvLayout(c, maxContext), (kind) => {
    if (kind === CONV) return shapes.conv;
    if (kind === REC) return shapes.rec;
    throw new Error(`${entry.name}: qwen3_5 keeps no '${kind}' state`);
  });
}
