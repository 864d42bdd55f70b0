// A checkpoint whose residual stream outgrows fp16's squares (a Qwen3 twin): layer `layer`'s
// mlp.down_proj is multiplied by `factor`, so from layer `layer`+1 on the residual holds values of a
// few hundred. They fit fp16 (max 65504) but their squares do not: the RMSNorm that reads them
// (x·x, then the mean) overflows on the HTP, which runs float graphs in fp16, while fp32 on the CPU
// and HF are fine. HF's trace is made from this checkpoint, so the reference moves with it: only
// fp16 can fail. The factor is a power of two (exact in bf16) and W8's per-row scale takes it.
import { cpSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { writeSafetensors, type TensorWithData } from '../../src/io/safetensors-writer.js';
import { f32ToBf16Array, f32ToF16Array } from '../../src/io/dtype.js';

export async function makeFp16Hostile(src: string, out: string, layer: number, factor = 64): Promise<void> {
  if (Math.log2(factor) % 1 !== 0) throw new Error(`factor ${factor} is not a power of two`);
  cpSync(src, out, { recursive: true, filter: (p) => !p.endsWith('.safetensors') });
  const files = readdirSync(src).filter((f) => f.endsWith('.safetensors'));
  if (files.length !== 1) throw new Error(`${src}: expected one safetensors file, found ${files.length}`);
  const ckpt = await openCheckpoint(src);
  try {
    const down = `model.layers.${layer}.mlp.down_proj.weight`;
    const tensors: TensorWithData[] = [];
    for (const name of ckpt.names()) {
      const info = ckpt.info(name);
      const data = await ckpt.readF32(name);
      if (name === down) for (let i = 0; i < data.length; i++) data[i] *= factor;
      const dtype = info.dtype;
      if (dtype !== 'F32' && dtype !== 'BF16' && dtype !== 'F16') throw new Error(`${name}: ${dtype} is not a float dtype this helper rewrites`);
      tensors.push({ name, dtype, shape: [...info.shape], data: dtype === 'BF16' ? f32ToBf16Array(data) : dtype === 'F16' ? f32ToF16Array(data) : data });
    }
    if (!tensors.some((t) => t.name === down)) throw new Error(`${src} has no ${down}`);
    await writeSafetensors(join(out, files[0]), tensors);
  } finally {
    await ckpt.close();
  }
}
