// A Gemma-4 twin that computes what its source computes but whose residual stream past layer
// `layer` is 2^k times larger: too large for an f16 hand-off between contexts. Gemma-4's residual
// (transformers' Gemma4TextDecoderLayer) is written in four places per layer: the post-attention,
// post-feedforward and post-per-layer-input norms' outputs are added to it (each `weight · x/rms(x)`,
// so scaled by its weight), and the sum is multiplied by `layer_scalar`. Every read of it is an
// RMSNorm (scale-invariant) but one: per_layer_input_gate takes the raw residual. So: layer
// `layer`'s layer_scalar × 2^k, and in every later layer the three norm weights × 2^k and
// per_layer_input_gate ÷ 2^k. A power of two is exact in bf16; only RMSNorm's eps sees the scale
// (its relative weight shrinks by 4^k): HF's logits move by float rounding only.
import { cpSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { writeSafetensors, type TensorWithData } from '../../src/io/safetensors-writer.js';
import { f32ToBf16Array, f32ToF16Array } from '../../src/io/dtype.js';

export async function makeHandoffHostile(src: string, out: string, layer: number, log2Scale: number): Promise<void> {
  const scale = 2 ** log2Scale;
  cpSync(src, out, { recursive: true, filter: (p) => !p.endsWith('.safetensors') });
  const files = readdirSync(src).filter((f) => f.endsWith('.safetensors'));
  if (files.length !== 1) throw new Error(`${src}: expected one safetensors file, found ${files.length}`);
  const ckpt = await openCheckpoint(src);
  try {
    const at = /^model\.language_model\.layers\.(\d+)\.(.+)$/;
    let scalarFound = false;
    const tensors: TensorWithData[] = [];
    for (const name of ckpt.names()) {
      const info = ckpt.info(name);
      const data = await ckpt.readF32(name);
      const m = at.exec(name);
      const i = m ? Number(m[1]) : -1;
      const what = m?.[2];
      let factor = 1;
      if (i === layer && what === 'layer_scalar') [factor, scalarFound] = [scale, true];
      if (i > layer && ['post_attention_layernorm.weight', 'post_feedforward_layernorm.weight', 'post_per_layer_input_norm.weight'].includes(what!)) factor = scale;
      if (i > layer && what === 'per_layer_input_gate.weight') factor = 1 / scale;
      if (factor !== 1) for (let j = 0; j < data.length; j++) data[j] *= factor;
      const dtype = info.dtype;
      if (dtype !== 'F32' && dtype !== 'BF16' && dtype !== 'F16') throw new Error(`${name}: ${dtype} is not a float dtype this helper rewrites`);
      tensors.push({ name, dtype, shape: [...info.shape], data: dtype === 'BF16' ? f32ToBf16Array(data) : dtype === 'F16' ? f32ToF16Array(data) : data });
    }
    if (!scalarFound) throw new Error(`${src}: no model.language_model.layers.${layer}.layer_scalar: not a Gemma-4 text checkpoint this helper knows`);
    await writeSafetensors(join(out, files[0]), tensors);
  } finally {
    await ckpt.close();
  }
}
