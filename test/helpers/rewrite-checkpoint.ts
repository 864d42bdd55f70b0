// What the planted-fault helpers share: a copy of a one-file safetensors checkpoint (its other files
// alongside) with some tensors edited in float32 and written back in their own dtype.
import { cpSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { writeSafetensors, type TensorWithData } from '../../src/io/safetensors-writer.js';
import { f32ToBf16Array, f32ToF16Array } from '../../src/io/dtype.js';

/** Each edit gets its tensor's data (float32, row-major) and shape; a named tensor the checkpoint lacks is an error. */
export type TensorEdits = Record<string, (data: Float32Array, shape: number[]) => void>;

export async function rewriteCheckpoint(src: string, out: string, edits: TensorEdits): Promise<void> {
  cpSync(src, out, { recursive: true, filter: (p) => !p.endsWith('.safetensors') });
  const files = readdirSync(src).filter((f) => f.endsWith('.safetensors'));
  if (files.length !== 1) throw new Error(`${src}: expected one safetensors file, found ${files.length}`);
  const ckpt = await openCheckpoint(src);
  try {
    const missing = Object.keys(edits).filter((n) => !ckpt.names().includes(n));
    if (missing.length) throw new Error(`${src} has no ${missing.join(', ')}`);
    const tensors: TensorWithData[] = [];
    for (const name of ckpt.names()) {
      const info = ckpt.info(name);
      const data = await ckpt.readF32(name);
      edits[name]?.(data, [...info.shape]);
      const dtype = info.dtype;
      if (dtype !== 'F32' && dtype !== 'BF16' && dtype !== 'F16') throw new Error(`${name}: ${dtype} is not a float dtype this helper rewrites`);
      tensors.push({ name, dtype, shape: [...info.shape], data: dtype === 'BF16' ? f32ToBf16Array(data) : dtype === 'F16' ? f32ToF16Array(data) : data });
    }
    await writeSafetensors(join(out, files[0]), tensors);
  } finally {
    await ckpt.close();
  }
}
