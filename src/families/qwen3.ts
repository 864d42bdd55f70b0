// Qwen3 (dense), model_type "qwen3". What is special: RMSNorm over head_dim on q and k (q_norm,
// k_norm) before RoPE; GQA; head_dim set explicitly (128 on 4B, not hidden/heads); no biases;
// SiLU-gated MLP; Qwen3-4B ties the lm-head to the embedding.
import { z } from 'zod';
import { checkElements, ConfigError, MAX_DIM, MAX_LAYERS, parseConfigWith, type Family, type GraphInterface, type GraphWeights, type ShardSpec, type TensorIO, type TensorSpec } from './types.js';
import type { GraphBuilder } from '../onnx/builder.js';
import { kvDecoderBindings, kvDecoderCases } from './kv-decoder.js';
import { newKv, pastKv } from './state-io.js';
import { applyRope, cachedAttention, mergeHeads, rmsNorm, ropeGather, ropeTables, splitHeads, swiGate } from './blocks.js';

const ConfigSchema = z.object({
  model_type: z.literal('qwen3'),
  hidden_size: z.number().int().positive(),
  intermediate_size: z.number().int().positive(),
  num_hidden_layers: z.number().int().positive(),
  num_attention_heads: z.number().int().positive(),
  num_key_value_heads: z.number().int().positive(),
  head_dim: z.number().int().positive().optional(),
  vocab_size: z.number().int().positive(),
  rms_norm_eps: z.number().positive(),
  tie_word_embeddings: z.boolean().default(false),
  max_position_embeddings: z.number().int().positive(),
  // transformers >= 5 writes rope_parameters; older checkpoints write rope_theta at top level.
  rope_theta: z.number().positive().optional(),
  rope_parameters: z.object({ rope_theta: z.number().positive(), rope_type: z.string().default('default') }).passthrough().optional(),
  attention_bias: z.boolean().default(false),
  use_sliding_window: z.boolean().default(false),
}).passthrough();

export interface Qwen3Config {
  hidden: number;
  ffn: number;
  layers: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  vocab: number;
  eps: number;
  ropeTheta: number;
  tied: boolean;
  maxPositions: number;
}

/** The config fields every Qwen3-style decoder has (Qwen3.5 keeps them under text_config). */
export interface AttentionDecoderFields {
  hidden_size: number;
  intermediate_size: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads: number;
  head_dim?: number;
  vocab_size: number;
  rms_norm_eps: number;
  max_position_embeddings: number;
  rope_theta?: number;
  rope_parameters?: { rope_theta: number; rope_type: string };
  attention_bias: boolean;
}

/**
 * Checks and maps what Qwen3 and Qwen3.5 share: default RoPE with a theta, no attention biases, GQA
 * heads that divide. `at` prefixes field paths in errors (e.g. 'text_config.').
 */
export function attentionDecoderConfig(c: AttentionDecoderFields, tied: boolean, file: string, at = ''): Qwen3Config {
  const ropeTheta = c.rope_parameters?.rope_theta ?? c.rope_theta;
  if (ropeTheta === undefined) throw new ConfigError(file, `${at}rope_parameters.rope_theta`, 'missing (neither rope_parameters nor rope_theta is set)');
  if (c.rope_parameters && c.rope_parameters.rope_type !== 'default') {
    throw new ConfigError(file, `${at}rope_parameters.rope_type`, `'${c.rope_parameters.rope_type}' is not supported (only default RoPE)`);
  }
  if (c.attention_bias) throw new ConfigError(file, `${at}attention_bias`, 'the graphs are built without attention biases');
  for (const field of ['hidden_size', 'intermediate_size', 'num_attention_heads', 'num_key_value_heads', 'head_dim', 'vocab_size', 'max_position_embeddings'] as const) {
    const v = c[field];
    if (v !== undefined && v > MAX_DIM) throw new ConfigError(file, `${at}${field}`, `${v} is above ${MAX_DIM}`);
  }
  if (c.num_hidden_layers > MAX_LAYERS) throw new ConfigError(file, `${at}num_hidden_layers`, `${c.num_hidden_layers} is above ${MAX_LAYERS} (taken as corrupt)`);
  if (c.head_dim === undefined && c.hidden_size % c.num_attention_heads !== 0) {
    throw new ConfigError(file, `${at}head_dim`, `missing, and hidden_size ${c.hidden_size} is not a multiple of num_attention_heads ${c.num_attention_heads}`);
  }
  if (c.num_attention_heads % c.num_key_value_heads !== 0) {
    throw new ConfigError(file, `${at}num_key_value_heads`, `${c.num_key_value_heads} does not divide num_attention_heads ${c.num_attention_heads}`);
  }
  const headDim = c.head_dim ?? c.hidden_size / c.num_attention_heads;
  checkElements(file, `${at}head_dim`, [c.num_attention_heads, headDim, c.hidden_size], 'q_proj');
  checkElements(file, `${at}intermediate_size`, [c.intermediate_size, c.hidden_size], 'an MLP weight');
  checkElements(file, `${at}vocab_size`, [c.vocab_size, c.hidden_size], 'the embedding');
  return {
    hidden: c.hidden_size,
    ffn: c.intermediate_size,
    layers: c.num_hidden_layers,
    heads: c.num_attention_heads,
    kvHeads: c.num_key_value_heads,
    headDim,
    vocab: c.vocab_size,
    eps: c.rms_norm_eps,
    ropeTheta,
    tied,
    maxPositions: c.max_position_embeddings,
  };
}

export function parseQwen3Config(raw: unknown, file: string): Qwen3Config {
  const c = parseConfigWith(ConfigSchema, raw, file);
  if (c.use_sliding_window) throw new ConfigError(file, 'use_sliding_window', 'sliding-window Qwen3 is not supported');
  return attentionDecoderConfig(c, c.tie_word_embeddings, file);
}

export function qwen3LayerTensors(c: Qwen3Config, prefix: string): TensorSpec[] {
  const { hidden: h, ffn, heads, kvHeads, headDim: d } = c;
  const p = prefix;
  return [
    { name: `${p}.input_layernorm.weight`, shape: [h], role: 'norm' },
    { name: `${p}.self_attn.q_proj.weight`, shape: [heads * d, h], role: 'matmul' },
    { name: `${p}.self_attn.k_proj.weight`, shape: [kvHeads * d, h], role: 'matmul' },
    { name: `${p}.self_attn.v_proj.weight`, shape: [kvHeads * d, h], role: 'matmul' },
    { name: `${p}.self_attn.o_proj.weight`, shape: [h, heads * d], role: 'matmul' },
    { name: `${p}.self_attn.q_norm.weight`, shape: [d], role: 'norm' },
    { name: `${p}.self_attn.k_norm.weight`, shape: [d], role: 'norm' },
    { name: `${p}.post_attention_layernorm.weight`, shape: [h], role: 'norm' },
    { name: `${p}.mlp.gate_proj.weight`, shape: [ffn, h], role: 'matmul' },
    { name: `${p}.mlp.up_proj.weight`, shape: [ffn, h], role: 'matmul' },
    { name: `${p}.mlp.down_proj.weight`, shape: [h, ffn], role: 'matmul' },
  ];
}

export const qwen3: Family<Qwen3Config> = {
  id: 'qwen3',
  hostOp: 'decoder_generate',
  parseConfig: parseQwen3Config,
  numLayers: (c) => c.layers,
  layerTensors: (c, i) => qwen3LayerTensors(c, `model.layers.${i}`),
  embedding: (c) => ({ name: 'model.embed_tokens.weight', shape: [c.vocab, c.hidden], role: 'embedding' }),
  finalTensors: (c) => [{ name: 'model.norm.weight', shape: [c.hidden], role: 'norm' }],
  lmHead: (c) => (c.tied
    ? { name: 'model.embed_tokens.weight', shape: [c.vocab, c.hidden], role: 'matmul' }
    : { name: 'lm_head.weight', shape: [c.vocab, c.hidden], role: 'matmul' }),
  buildShard: (g, c, s, w) => denseDecoderShard(g, c, s, w,
    { finalNorm: 'model.norm.weight', lmHead: qwen3.lmHead(c).name },
    (x, layer, io) => qwen3Layer(g, c, 'model.layers', layer, x, io, w)),
  buildLmHead: (g, c, w) => lmHeadGraph(g, c.hidden, c.vocab, qwen3.lmHead(c).name, w),
  gateCases: (c, entry, trace, maxContext) => kvDecoderCases(entry, trace, { kvHeads: c.kvHeads, headDim: c.headDim, maxContext }),
  bindings: (c, entry, maxContext) => kvDecoderBindings(entry, { kvHeads: c.kvHeads, headDim: c.headDim, maxContext }),
};

// ---- graphs ----------------------------------------------------------------------------------

/** One Qwen3 decoder layer over N tokens with an explicit KV cache; returns the residual output. */
export async function qwen3Layer(
  g: GraphBuilder, c: Qwen3Config, prefix: string, layer: number, x: string,
  io: { rope: { cos: string; sin: string }; mask: string; n: number; ctx: number }, w: GraphWeights,
): Promise<{ out: string; inputs: TensorIO[]; outputs: TensorIO[] }> {
  const { hidden: H, heads, kvHeads, headDim: d, ffn, eps } = c;
  const { n, ctx } = io;
  const p = `${prefix}.${layer}`;
  const lin = (x: string, name: string, shape: [number, number]) => w.store.linear(g, x, `${p}.${name}.weight`, shape, w.scheme, n);
  const norm = (name: string, size: number) => w.store.small(g, `${p}.${name}.weight`, [size]);

  const pastK = g.input(pastKv('k', layer), 'float32', [1, kvHeads, ctx, d]);
  const pastV = g.input(pastKv('v', layer), 'float32', [1, kvHeads, ctx, d]);
  const xn = rmsNorm(g, x, await norm('input_layernorm', H), eps);
  const q = splitHeads(g, await lin(xn, 'self_attn.q_proj', [heads * d, H]), heads, d, n);
  const k = splitHeads(g, await lin(xn, 'self_attn.k_proj', [kvHeads * d, H]), kvHeads, d, n);
  const v = splitHeads(g, await lin(xn, 'self_attn.v_proj', [kvHeads * d, H]), kvHeads, d, n);
  const qr = applyRope(g, rmsNorm(g, q, await norm('self_attn.q_norm', d), eps), io.rope);
  const kr = applyRope(g, rmsNorm(g, k, await norm('self_attn.k_norm', d), eps), io.rope);
  const newK = g.output(kr, newKv('k', layer), { shape: [1, kvHeads, n, d] });
  const newV = g.output(v, newKv('v', layer), { shape: [1, kvHeads, n, d] });
  const attn = cachedAttention(g, qr, newK, newV, pastK, pastV, io.mask, { heads, kvHeads, headDim: d, n, ctx, scale: 1 / Math.sqrt(d) });
  const o = await lin(mergeHeads(g, attn, heads, d, n), 'self_attn.o_proj', [H, heads * d]);
  const h1 = g.op('Add', [x, o]);
  const mlpIn = rmsNorm(g, h1, await norm('post_attention_layernorm', H), eps);
  const gate = await lin(mlpIn, 'mlp.gate_proj', [ffn, H]);
  const up = await lin(mlpIn, 'mlp.up_proj', [ffn, H]);
  const mlp = await lin(swiGate(g, gate, up), 'mlp.down_proj', [H, ffn]);
  const out = g.op('Add', [h1, mlp], {}, 1, { outputs: [`h.${layer + 1}`] });
  const kv = (name: string) => ({ name, dtype: 'float32' as const, shape: [1, kvHeads, ctx, d] });
  const kvNew = (name: string) => ({ name, dtype: 'float32' as const, shape: [1, kvHeads, n, d] });
  return { out, inputs: [kv(pastK), kv(pastV)], outputs: [kvNew(newK), kvNew(newV)] };
}

/** The common frame of a dense decoder shard: hidden/position/mask inputs, layers, final norm. */
export async function denseDecoderShard(
  g: GraphBuilder, c: { hidden: number; headDim: number; ropeTheta: number; eps: number; vocab: number }, s: ShardSpec, w: GraphWeights,
  names: { finalNorm: string; lmHead: string },
  layerFn: (x: string, layer: number, io: { rope: { cos: string; sin: string }; mask: string; n: number; ctx: number }) => Promise<{ out: string; inputs: TensorIO[]; outputs: TensorIO[] }>,
): Promise<GraphInterface> {
  const { n, maxContext: ctx } = s;
  const H = c.hidden;
  const f32 = 'float32' as const;
  const x0 = g.input('hidden_in', f32, [1, n, H]);
  const position = g.input('position', 'int32', [n]);
  const mask = g.input('attn_mask', f32, [1, 1, n, ctx + n]);
  const tables = ropeTables(ctx, c.headDim, c.ropeTheta);
  const rope = ropeGather(g, position, { cos: g.initializer('rope.cos', tables.cos, [ctx, c.headDim]), sin: g.initializer('rope.sin', tables.sin, [ctx, c.headDim]) }, n, c.headDim);
  const inputs: TensorIO[] = [{ name: x0, dtype: f32, shape: [1, n, H] }, { name: position, dtype: 'int32', shape: [n] }, { name: mask, dtype: f32, shape: [1, 1, n, ctx + n] }];
  const outputs: TensorIO[] = [];
  const probes: Record<string, TensorIO> = {};
  let x = x0;
  for (let i = s.first; i <= s.last; i++) {
    const r = await layerFn(x, i, { rope, mask, n, ctx });
    inputs.push(...r.inputs);
    outputs.push(...r.outputs);
    x = r.out;
    if (i < s.last || s.isLast) probes[x] = { name: `h.${i + 1}`, dtype: f32, shape: [1, n, H] };
  }
  if (s.isLast) {
    x = rmsNorm(g, x, await w.store.small(g, names.finalNorm, [H]), c.eps);
  }
  const hiddenOut = g.output(x, 'hidden_out', { shape: [1, n, H] });
  outputs.unshift({ name: hiddenOut, dtype: f32, shape: [1, n, H] });
  if (s.isLast && s.lmHeadInside) {
    const logits = g.output(await w.store.linear(g, hiddenOut, names.lmHead, [c.vocab, H], w.lmHeadScheme, n), 'logits', { shape: [1, n, c.vocab] });
    outputs.push({ name: logits, dtype: f32, shape: [1, n, c.vocab] });
  }
  return { inputs, outputs, probes };
}

/** Final-normed hidden [1,1,H] → logits [1,1,V]. */
export async function lmHeadGraph(g: GraphBuilder, hidden: number, vocab: number, weight: string, w: GraphWeights): Promise<GraphInterface> {
  const x = g.input('hidden', 'float32', [1, 1, hidden]);
  const logits = g.output(await w.store.linear(g, x, weight, [vocab, hidden], w.lmHeadScheme, 1), 'logits', { shape: [1, 1, vocab] });
  return { inputs: [{ name: x, dtype: 'float32', shape: [1, 1, hidden] }], outputs: [{ name: logits, dtype: 'float32', shape: [1, 1, vocab] }], probes: {} };
}
