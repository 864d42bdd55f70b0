// A checkpoint that computes what its source computes but whose one layer W4 cannot take: in layer
// `layer`'s MLP, every 32nd intermediate channel j gets up_proj row j divided by `scale` and
// down_proj column j multiplied by it (a power of two: exact in any float format, so HF's outputs do
// not move). down_proj then holds one outlier per W4 block of every row, and a block's scale is set
// by its outlier: the 31 other weights of the block round to zero or ±1. W8's per-row scale keeps
// them (scale/127 instead of scale/7). SmoothQuant's equivalence, used backwards.
import { cpSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { writeSafetensors, type TensorWithData } from '../../src/io/safetensors-writer.js';
import { f32ToBf16Array, f32ToF16Array } from '../../src/io/dtype.js';

export async function makeW4Hostile(src: string, out: string, layer: number, scale = 16): Promise<void> {
  if (Math.log2(scale) % 1 !== 0) throw new Error(`scale ${scale} is not a power of two: the checkpoint's function would move`);
  cpSync(src, out, { recursive: true, filter: (p) => !p.endsWith('.safetensors') });
  const files = readdirSync(src).filter((f) => f.endsWith('.safetensors'));
  if (files.length !== 1) throw new Error(`${src}: expected one safetensors file, found ${files.length}`);
  const ckpt = await openCheckpoint(src);
  try {
    const up = `model.layers.${layer}.mlp.up_proj.weight`;
    const down = `model.layers.${layer}.mlp.down_proj.weight`;
    const tensors: TensorWithData[] = [];
    for (const name of ckpt.names()) {
      const info = ckpt.info(name);
      const data = await ckpt.readF32(name);
      const [rows, cols] = info.shape;
      if (name === up) for (let j = 0; j < rows; j += 32) for (let c = 0; c < cols; c++) data[j * cols + c] /= scale;
      if (name === down) for (let r = 0; r < rows; r++) for (let j = 0; j < cols; j += 32) data[r * cols + j] *= scale;
      const dtype = info.dtype;
      if (dtype !== 'F32' && dtype !== 'BF16' && dtype !== 'F16') throw new Error(`${name}: ${dtype} is not a float dtype this helper rewrites`);
      tensors.push({ name, dtype, shape: [...info.shape], data: dtype === 'BF16' ? f32ToBf16Array(data) : dtype === 'F16' ? f32ToF16Array(data) : data });
    }
    await writeSafetensors(join(out, files[0]), tensors);
  } finally {
    await ckpt.close();
  }
}
