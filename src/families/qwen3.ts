// Qwen3 (dense), model_type "qwen3". What is special: RMSNorm over head_dim on q and k (q_norm,
// k_norm) before RoPE; GQA; head_dim set explicitly (128 on 4B, not hidden/heads); no biases;
// SiLU-gated MLP; Qwen3-4B ties the lm-head to the embedding.
import { z } from 'zod';
import { ConfigError, type Family, type TensorSpec } from './types.js';

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

export function parseQwen3Config(raw: unknown, file: string): Qwen3Config {
  const r = ConfigSchema.safeParse(raw);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new ConfigError(file, i.path.join('.') || '(root)', i.message);
  }
  const c = r.data;
  const ropeTheta = c.rope_parameters?.rope_theta ?? c.rope_theta;
  if (ropeTheta === undefined) throw new ConfigError(file, 'rope_parameters.rope_theta', 'missing (neither rope_parameters nor rope_theta is set)');
  if (c.rope_parameters && c.rope_parameters.rope_type !== 'default') {
    throw new ConfigError(file, 'rope_parameters.rope_type', `'${c.rope_parameters.rope_type}' is not supported (only default RoPE)`);
  }
  if (c.attention_bias) throw new ConfigError(file, 'attention_bias', 'Qwen3 graphs are built without attention biases');
  if (c.use_sliding_window) throw new ConfigError(file, 'use_sliding_window', 'sliding-window Qwen3 is not supported');
  if (c.num_attention_heads % c.num_key_value_heads !== 0) {
    throw new ConfigError(file, 'num_key_value_heads', `${c.num_key_value_heads} does not divide num_attention_heads ${c.num_attention_heads}`);
  }
  return {
    hidden: c.hidden_size,
    ffn: c.intermediate_size,
    layers: c.num_hidden_layers,
    heads: c.num_attention_heads,
    kvHeads: c.num_key_value_heads,
    headDim: c.head_dim ?? c.hidden_size / c.num_attention_heads,
    vocab: c.vocab_size,
    eps: c.rms_norm_eps,
    ropeTheta,
    tied: c.tie_word_embeddings,
    maxPositions: c.max_position_embeddings,
  };
}

/** Weight names of a Qwen3-style decoder layer under `prefix` (Qwen3-VL reuses it). */
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
  parseConfig: parseQwen3Config,
  numLayers: (c) => c.layers,
  layerTensors: (c, i) => qwen3LayerTensors(c, `model.layers.${i}`),
  embedding: (c) => ({ name: 'model.embed_tokens.weight', shape: [c.vocab, c.hidden], role: 'embedding' }),
  finalTensors: (c) => [{ name: 'model.norm.weight', shape: [c.hidden], role: 'norm' }],
  lmHead: (c) => (c.tied
    ? { name: 'model.embed_tokens.weight', shape: [c.vocab, c.hidden], role: 'matmul' }
    : { name: 'lm_head.weight', shape: [c.vocab, c.hidden], role: 'matmul' }),
};
