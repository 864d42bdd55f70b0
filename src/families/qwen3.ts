// Qwen3 (dense), model_type "qwen3". What is special: RMSNorm over head_dim on q and k (q_norm,
// k_norm) before RoPE; GQA; head_dim set explicitly (128 on 4B, not hidden/heads); no biases;
// SiLU-gated MLP; Qwen3-4B ties the lm-head to the embedding.
import { z } from 'zod';
import { ConfigError, parseConfigWith, type Family, type GraphWeights, type TensorIO } from './types.js';
import type { GraphBuilder } from '../onnx/builder.js';
import { kvDecoderBindings, kvDecoderCases } from './kv-decoder.js';
import { newKv, pastKv } from './state-io.js';
import { applyRope, cachedAttention, gatedMlp, mergeHeads, MLP_RESCALE, rmsNorm, silu, splitHeads, valueScale, VALUES_RESCALE } from './blocks.js';
import { ATTENTION_DECODER_FIELDS, attentionDecoderConfig, decoderComponents, denseDecoderShard, lmHeadGraph, type AttentionDecoderConfig } from './decoder.js';

const ConfigSchema = z.object({
  model_type: z.literal('qwen3'),
  ...ATTENTION_DECODER_FIELDS,
  tie_word_embeddings: z.boolean().default(false),
  // transformers >= 5 writes rope_parameters; older checkpoints write rope_theta at top level.
  rope_theta: z.number().positive().optional(),
  rope_parameters: z.object({ rope_theta: z.number().positive(), rope_type: z.string().default('default') }).passthrough().optional(),
  use_sliding_window: z.boolean().default(false),
}).passthrough();

/** Qwen3's config is the shared attention-decoder config as is. */
export type Qwen3Config = AttentionDecoderConfig;

export function parseQwen3Config(raw: unknown, file: string): Qwen3Config {
  const c = parseConfigWith(ConfigSchema, raw, file);
  if (c.use_sliding_window) throw new ConfigError(file, 'use_sliding_window', 'sliding-window Qwen3 is not supported');
  return attentionDecoderConfig(c, c.tie_word_embeddings, file);
}

const EMBEDDING = 'model.embed_tokens.weight';
const lmHeadWeight = (c: Qwen3Config) => (c.tied ? EMBEDDING : 'lm_head.weight');
const kvLayout = (c: Qwen3Config, maxContext: number) => ({ maxContext, layer: () => ({ kvHeads: c.kvHeads, headDim: c.headDim }) });

export const qwen3: Family<Qwen3Config> = {
  id: 'qwen3',
  hostOp: 'decoder_generate',
  parseConfig: parseQwen3Config,
  numLayers: (c) => c.layers,
  hostTables: (c) => [{ name: 'embedding', use: 'embedding', tensor: EMBEDDING, shape: [c.vocab, c.hidden], dtype: 'float16' }],
  components: (c, layout) => decoderComponents(layout, {
    shard: (g, s, w) => denseDecoderShard(g, c, s, w, { finalNorm: 'model.norm.weight', lmHead: lmHeadWeight(c) },
      (x, layer, io) => qwen3Layer(g, c, 'model.layers', layer, x, io, w)),
    lmHead: (g, w) => lmHeadGraph(g, c.hidden, c.vocab, lmHeadWeight(c), w),
  }),
  gateCases: (c, entry, trace, maxContext) => kvDecoderCases(entry, trace, kvLayout(c, maxContext)),
  bindings: (c, entry, maxContext) => kvDecoderBindings(entry, kvLayout(c, maxContext)),
  rescalePairs: [MLP_RESCALE, VALUES_RESCALE],
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
  // Each projection's ops scoped by its name (`layers.2/self_attn.o_proj/…`): bisect names the matrix an op multiplies.
  const lin = (x: string, name: string, shape: [number, number], scale = 1) => g.scoped(name, () => w.store.linear(g, x, `${p}.${name}.weight`, shape, w.scheme, n, undefined, undefined, scale));
  const norm = (name: string, size: number) => w.store.small(g, `${p}.${name}.weight`, [size]);

  const pastK = g.input(pastKv('k', layer), 'float32', [1, kvHeads, ctx, d]);
  const pastV = g.input(pastKv('v', layer), 'float32', [1, kvHeads, ctx, d]);
  const xn = rmsNorm(g, x, await norm('input_layernorm', H), eps, 'input_layernorm');
  const q = splitHeads(g, await lin(xn, 'self_attn.q_proj', [heads * d, H]), heads, d, n);
  const k = splitHeads(g, await lin(xn, 'self_attn.k_proj', [kvHeads * d, H]), kvHeads, d, n);
  const vs = valueScale(g, pastV, newKv('v', layer));
  const v = splitHeads(g, await lin(xn, 'self_attn.v_proj', [kvHeads * d, H], vs), kvHeads, d, n);
  const qr = applyRope(g, rmsNorm(g, q, await norm('self_attn.q_norm', d), eps, 'self_attn.q_norm'), io.rope);
  const kr = applyRope(g, rmsNorm(g, k, await norm('self_attn.k_norm', d), eps, 'self_attn.k_norm'), io.rope);
  const newK = g.output(kr, newKv('k', layer), { shape: [1, kvHeads, n, d] });
  const newV = g.output(v, newKv('v', layer), { shape: [1, kvHeads, n, d] });
  const attn = cachedAttention(g, qr, newK, newV, pastK, pastV, io.mask, { heads, kvHeads, headDim: d, n, ctx, scale: 1 / Math.sqrt(d) });
  const o = await lin(mergeHeads(g, attn, heads, d, n), 'self_attn.o_proj', [H, heads * d], 1 / vs);
  const h1 = g.op('Add', [x, o]);
  const mlpIn = rmsNorm(g, h1, await norm('post_attention_layernorm', H), eps, 'post_attention_layernorm');
  const mlp = await gatedMlp(g, mlpIn, silu, (x, m, s) => w.store.linear(g, x, `${p}.mlp.${m}.weight`, m === 'down_proj' ? [H, ffn] : [ffn, H], w.scheme, n, undefined, undefined, s));
  const out = g.op('Add', [h1, mlp], {}, 1, { outputs: [`h.${layer + 1}`] });
  const kv = (name: string) => ({ name, dtype: 'float32' as const, shape: [1, kvHeads, ctx, d] });
  const kvNew = (name: string) => ({ name, dtype: 'float32' as const, shape: [1, kvHeads, n, d] });
  return { out, inputs: [kv(pastK), kv(pastV)], outputs: [kvNew(newK), kvNew(newV)] };
}
