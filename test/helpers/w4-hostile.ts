// A checkpoint that computes what its source computes but whose one layer W4 cannot take (a Qwen3
// or Qwen3.5 twin): in layer `layer`'s MLP, every 32nd intermediate channel j gets up_proj row j divided by
// `scale` and down_proj column j multiplied by it, and in its attention every 32nd value channel the
// same between v_proj's rows and o_proj's columns (attention is linear in V, so each query head's
// column of o_proj follows its kv head's channel). The scale is a power of two: exact in any float
// format, so HF's outputs do not move. down_proj and o_proj then hold one outlier per W4 block of
// every row, and a block's scale is set by its outlier: the 31 other weights of the block round to
// zero. W8's per-row scale keeps them (scale/127 instead of scale/7). SmoothQuant's equivalence,
// used backwards.
import { cpSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { writeSafetensors, type TensorWithData } from '../../src/io/safetensors-writer.js';
import { f32ToBf16Array, f32ToF16Array } from '../../src/io/dtype.js';
import { rewriteCheckpoint, type TensorEdits } from './rewrite-checkpoint.js';

export async function makeW4Hostile(src: string, out: string, layer: number, scale = 16): Promise<void> {
  if (Math.log2(scale) % 1 !== 0) throw new Error(`scale ${scale} is not a power of two: the checkpoint's function would move`);
  const ckpt = await openCheckpoint(src);
  const names = ckpt.names();
  await ckpt.close();
  const c = JSON.parse(readFileSync(join(src, 'config.json'), 'utf8')) as { num_attention_heads: number; num_key_value_heads: number; head_dim: number };
  const group = c.num_attention_heads / c.num_key_value_heads;
  // Qwen3's layers are under model.layers, Qwen3.5's under model.language_model.layers.
  const prefix = names.find((n) => n.endsWith(`layers.${layer}.mlp.up_proj.weight`))?.replace(/mlp\.up_proj\.weight$/, '');
  if (!prefix) throw new Error(`${src} has no layers.${layer}.mlp.up_proj.weight`);
  const at = (m: string) => `${prefix}${m}.weight`;
  // o_proj's input column of query head h, channel d, is value channel (h / group)·head_dim + d.
  const vRow = (col: number) => Math.floor(col / c.head_dim / group) * c.head_dim + (col % c.head_dim);
  const vScaled = new Set(Array.from({ length: Math.ceil((c.num_attention_heads * c.head_dim) / 32) }, (_, i) => vRow(i * 32)));
  const edits: TensorEdits = {
    [at('mlp.up_proj')]: (data, [rows, cols]) => { for (let j = 0; j < rows; j += 32) for (let k = 0; k < cols; k++) data[j * cols + k] /= scale; },
    [at('mlp.down_proj')]: (data, [rows, cols]) => { for (let r = 0; r < rows; r++) for (let j = 0; j < cols; j += 32) data[r * cols + j] *= scale; },
  };
  // A layer without V and O (Qwen3.5's linear attention) gets its MLP made hostile alone. Every
  // o_proj column that reads a scaled value channel is scaled back (each 32nd among them).
  if (names.includes(at('self_attn.v_proj')) && Number.isFinite(group)) {
    edits[at('self_attn.o_proj')] = (data, [rows, cols]) => { for (let r = 0; r < rows; r++) for (let j = 0; j < cols; j++) if (vScaled.has(vRow(j))) data[r * cols + j] *= scale; };
    edits[at('self_attn.v_proj')] = (data, [, cols]) => { for (const j of vScaled) for (let k = 0; k < cols; k++) data[j * cols + k] /= scale; };
  }
  await rewriteCheckpoint(src, out, edits);
}

/**
 * The same trick on the lm-head (a tied Qwen3 twin): untied first (lm_head.weight a copy of the
 * embedding, `tie_word_embeddings` false: the same function), then every 32nd hidden channel j gets
 * lm_head column j multiplied by `scale` and the final norm's weight j divided by it. logits =
 * W·(γ ⊙ x̂) do not move; the lm-head holds one outlier per W4 block of every row.
 */
export async function makeLmHeadW4Hostile(src: string, out: string, scale = 16): Promise<void> {
  if (Math.log2(scale) % 1 !== 0) throw new Error(`scale ${scale} is not a power of two: the checkpoint's function would move`);
  cpSync(src, out, { recursive: true, filter: (p) => !p.endsWith('.safetensors') });
  const files = readdirSync(src).filter((f) => f.endsWith('.safetensors'));
  if (files.length !== 1) throw new Error(`${src}: expected one safetensors file, found ${files.length}`);
  const config = JSON.parse(readFileSync(join(src, 'config.json'), 'utf8')) as Record<string, unknown>;
  writeFileSync(join(out, 'config.json'), JSON.stringify({ ...config, tie_word_embeddings: false }, null, 2));
  const ckpt = await openCheckpoint(src);
  try {
    const names = ckpt.names();
    const head = names.includes('lm_head.weight') ? 'lm_head.weight' : 'model.embed_tokens.weight';
    const tensors: TensorWithData[] = [];
    const keep = (name: string, dtype: string, shape: number[], data: Float32Array) =>
      tensors.push({ name, dtype: dtype as TensorWithData['dtype'], shape, data: dtype === 'BF16' ? f32ToBf16Array(data) : dtype === 'F16' ? f32ToF16Array(data) : data });
    for (const name of names) {
      const info = ckpt.info(name);
      const data = await ckpt.readF32(name);
      if (name === 'model.norm.weight') for (let j = 0; j < data.length; j += 32) data[j] /= scale;
      if (name !== 'lm_head.weight') keep(name, info.dtype, [...info.shape], data);
      if (name === head) {
        const w = Float32Array.from(data);
        const [rows, cols] = info.shape;
        for (let r = 0; r < rows; r++) for (let j = 0; j < cols; j += 32) w[r * cols + j] *= scale;
        keep('lm_head.weight', info.dtype, [...info.shape], w);
      }
    }
    await writeSafetensors(join(out, files[0]), tensors);
  } finally {
    await ckpt.close();
  }
}

/**
 * One expert of a PhiMoE twin that W8 cannot take, the same function: in layer `layer`'s expert
 * `expert`, intermediate channel 0 gets w3's row divided by `scale` and w2's column multiplied by it
 * (the expert is w2·(silu(w1·x) ⊙ w3·x), linear in w3's row). Every row of w2 then holds one
 * outlier, and its int8 row scale rounds the row's other weights to a few codes.
 */
export async function makeExpertW8Hostile(src: string, out: string, layer: number, expert: number, scale = 256): Promise<void> {
  if (Math.log2(scale) % 1 !== 0) throw new Error(`scale ${scale} is not a power of two: the checkpoint's function would move`);
  const at = (w: string) => `model.layers.${layer}.block_sparse_moe.experts.${expert}.${w}.weight`;
  await rewriteCheckpoint(src, out, {
    [at('w3')]: (data, [, cols]) => { for (let c = 0; c < cols; c++) data[c] /= scale; },
    [at('w2')]: (data, [rows, cols]) => { for (let r = 0; r < rows; r++) data[r * cols] *= scale; },
  });
}
