// Shared pieces of decoder families: the config fields every Qwen3-style attention decoder has, the
// frame of a dense decoder shard (hidden/position/mask in, layers, final norm, optional lm-head),
// the lm-head graph, and the components of a decoder cut into layer shards (prefill and decode
// variants sharing one weight set, then the lm-head). A family composes these with its own layer.
import { checkElements, ConfigError, MAX_DIM, MAX_LAYERS, type Component, type ComponentLayout, type GraphInterface, type GraphWeights, type ShardSpec, type TensorIO } from './types.js';
import { z } from 'zod';
import type { GraphBuilder } from '../onnx/builder.js';
import { rmsNorm, ropeGather, ropeTables } from './blocks.js';

/** The config fields of a Qwen3-style attention decoder, as zod reads them (Qwen3's top level, Qwen3-VL's text_config). */
export const ATTENTION_DECODER_FIELDS = {
  hidden_size: z.number().int().positive(),
  intermediate_size: z.number().int().positive(),
  num_hidden_layers: z.number().int().positive(),
  num_attention_heads: z.number().int().positive(),
  num_key_value_heads: z.number().int().positive(),
  head_dim: z.number().int().positive().optional(),
  vocab_size: z.number().int().positive(),
  rms_norm_eps: z.number().positive(),
  max_position_embeddings: z.number().int().positive(),
  attention_bias: z.boolean().default(false),
};

/** Component kinds of a decoder cut into layer shards (read by the kv-decoder gate cases). */
export const SHARD_KIND = 'shard';
export const LM_HEAD_KIND = 'lm_head';

export interface AttentionDecoderConfig {
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
 * Checks and maps what attention decoders share: default RoPE with a theta, attention biases as the
 * family's graphs build them (Qwen3/3.5 none, PhiMoE on q/k/v/o), GQA heads that divide. `at`
 * prefixes field paths in errors (e.g. 'text_config.').
 */
export function attentionDecoderConfig(c: AttentionDecoderFields, tied: boolean, file: string, at = '', attentionBias = false): AttentionDecoderConfig {
  const ropeTheta = c.rope_parameters?.rope_theta ?? c.rope_theta;
  if (ropeTheta === undefined) throw new ConfigError(file, `${at}rope_parameters.rope_theta`, 'missing (neither rope_parameters nor rope_theta is set)');
  if (c.rope_parameters && c.rope_parameters.rope_type !== 'default') {
    throw new ConfigError(file, `${at}rope_parameters.rope_type`, `'${c.rope_parameters.rope_type}' is not supported (only default RoPE)`);
  }
  if (c.attention_bias !== attentionBias) throw new ConfigError(file, `${at}attention_bias`, `the graphs are built ${attentionBias ? 'with' : 'without'} attention biases`);
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

/**
 * What a family changes in the dense shard's frame: how positions enter and become RoPE rows
 * (default: int32 [N], one table row each), and what joins the residual after a layer (Qwen3-VL's
 * DeepStack features).
 */
export interface ShardFrame {
  rope?(g: GraphBuilder, n: number, tables: { cos: string; sin: string }): { input: TensorIO; rope: { cos: string; sin: string } };
  afterLayer?(g: GraphBuilder, x: string, layer: number, n: number): { x: string; inputs: TensorIO[] };
}

/** The common frame of a dense decoder shard: hidden/position/mask inputs, layers, final norm. */
export async function denseDecoderShard(
  g: GraphBuilder, c: { hidden: number; headDim: number; ropeTheta: number; eps: number; vocab: number }, s: ShardSpec, w: GraphWeights,
  names: { finalNorm: string; lmHead: string },
  layerFn: (x: string, layer: number, io: { rope: { cos: string; sin: string }; mask: string; n: number; ctx: number }) => Promise<{ out: string; inputs: TensorIO[]; outputs: TensorIO[] }>,
  frame: ShardFrame = {},
): Promise<GraphInterface> {
  const { n, maxContext: ctx } = s;
  const H = c.hidden;
  const f32 = 'float32' as const;
  const x0 = g.input('hidden_in', f32, [1, n, H]);
  const tables = ropeTables(ctx, c.headDim, c.ropeTheta);
  const ropeTable = { cos: g.initializer('rope.cos', tables.cos, [ctx, c.headDim]), sin: g.initializer('rope.sin', tables.sin, [ctx, c.headDim]) };
  const positions = frame.rope ? frame.rope(g, n, ropeTable) : (() => {
    const position = g.input('position', 'int32', [n]);
    return { input: { name: position, dtype: 'int32' as const, shape: [n] }, rope: ropeGather(g, position, ropeTable, n, c.headDim) };
  })();
  const rope = positions.rope;
  const mask = g.input('attn_mask', f32, [1, 1, n, ctx + n]);
  const inputs: TensorIO[] = [{ name: x0, dtype: f32, shape: [1, n, H] }, positions.input, { name: mask, dtype: f32, shape: [1, 1, n, ctx + n] }];
  const outputs: TensorIO[] = [];
  const probes: Record<string, TensorIO> = {};
  let x = x0;
  for (let i = s.first; i <= s.last; i++) {
    // Every node of layer i is named layers.i/… (forge bisect names the op that leaves the reference).
    const r = await g.scoped(`layers.${i}`, () => layerFn(x, i, { rope, mask, n, ctx }));
    inputs.push(...r.inputs);
    outputs.push(...r.outputs);
    x = r.out;
    if (frame.afterLayer) {
      const after = frame.afterLayer(g, x, i, n);
      inputs.push(...after.inputs);
      x = after.x;
    }
    if (i < s.last || s.isLast) probes[x] = { name: `h.${i + 1}`, dtype: f32, shape: [1, n, H] };
  }
  if (s.isLast) {
    x = rmsNorm(g, x, await w.store.small(g, names.finalNorm, [H]), c.eps, 'final_norm');
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


/** Why a decoder's batched prefill may be dropped: the runtime decodes over the prompt instead (same tokens, slower first token). */
export const PREFILL_OPTIONAL = 'batched prefill: without it the runtime decodes over the prompt one token at a time';

/**
 * A decoder cut into layer shards: per shard one context whose prefill (N = prefillLength, when
 * set; optional) and decode (N = 1) graphs share its weights, then the lm-head context unless it is
 * inside the last shard.
 */
export function decoderComponents(layout: ComponentLayout, build: {
  shard(g: GraphBuilder, s: ShardSpec, w: GraphWeights): Promise<GraphInterface>;
  lmHead(g: GraphBuilder, w: GraphWeights): Promise<GraphInterface>;
}): Component[] {
  const calls = [...(layout.prefillLength > 0 ? [{ name: 'prefill', n: layout.prefillLength, optional: PREFILL_OPTIONAL }] : []), { name: 'decode', n: 1 }];
  const out: Component[] = layout.shards.map(({ first, last, isLast }, index) => ({
    name: `shard${index}`,
    kind: SHARD_KIND,
    weights: 'layers',
    entry: {
      shard: index, first, last, isLast,
      stream: { input: 'hidden_in', from: first === 0 ? null : `h.${first}`, output: 'hidden_out', to: isLast ? 'final' : `h.${last + 1}` },
    },
    variants: calls.map((c) => ({
      ...c,
      build: (g: GraphBuilder, w: GraphWeights) => build.shard(g, { first, last, n: c.n, maxContext: layout.maxContext, prefillLength: layout.prefillLength, isLast, lmHeadInside: layout.lmHeadInside }, w),
    })),
  }));
  if (!layout.lmHeadInside) {
    out.push({
      name: 'lm_head', kind: LM_HEAD_KIND, weights: 'lmHead',
      entry: { stream: { input: 'hidden', from: 'final' } },
      variants: [{ name: '', n: 1, build: (g, w) => build.lmHead(g, w) }],
    });
  }
  return out;
}
