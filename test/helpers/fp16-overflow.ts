// A checkpoint that computes what its source computes but whose one op fp16 cannot hold (a Qwen3
// twin): layer `layer`'s q_proj is multiplied by `factor`. q_norm, an RMSNorm over each head, is
// scale-invariant, so HF's outputs do not move (ε aside: 1e-6 against a mean square of thousands);
// but q now holds values in the thousands, which fit fp16, and q_norm squares them (x·x), which does
// not (max 65504). On the HTP, which runs float graphs in fp16, that square overflows; fp32 on the CPU
// is fine. The factor is a power of two (exact in bf16) and W8's per-row scale takes it whole.
import { cpSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { writeSafetensors, type TensorWithData } from '../../src/io/safetensors-writer.js';
import { f32ToBf16Array, f32ToF16Array } from '../../src/io/dtype.js';

export async function makeFp16Hostile(src: string, out: string, layer: number, factor = 1024): Promise<void> {
  if (Math.log2(factor) % 1 !== 0) throw new Error(`factor ${factor} is not a power of two`);
  cpSync(src, out, { recursive: true, filter: (p) => !p.endsWith('.safetensors') });
  const files = readdirSync(src).filter((f) => f.endsWith('.safetensors'));
  if (files.length !== 1) throw new Error(`${src}: expected one safetensors file, found ${files.length}`);
  const ckpt = await openCheckpoint(src);
  try {
    const q = `model.layers.${layer}.self_attn.q_proj.weight`;
    const tensors: TensorWithData[] = [];
    for (const name of ckpt.names()) {
      const info = ckpt.info(name);
      const data = await ckpt.readF32(name);
      if (name === q) for (let i = 0; i < data.length; i++) data[i] *= factor;
      const dtype = info.dtype;
      if (dtype !== 'F32' && dtype !== 'BF16' && dtype !== 'F16') throw new Error(`${name}: ${dtype} is not a float dtype this helper rewrites`);
      tensors.push({ name, dtype, shape: [...info.shape], data: dtype === 'BF16' ? f32ToBf16Array(data) : dtype === 'F16' ? f32ToF16Array(data) : data });
    }
    if (!tensors.some((t) => t.name === q)) throw new Error(`${src} has no ${q}`);
    await writeSafetensors(join(out, files[0]), tensors);
  } finally {
    await ckpt.close();
  }
}
