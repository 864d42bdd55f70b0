// Checkpoints that compute what their source computes but hold one op fp16 cannot (a Qwen3 or Gemma-4 twin). On
// the HTP, which runs float graphs in fp16 (max 65504), that op overflows; fp32 on the CPU is fine.
// Every factor is a power of two: exact in bf16, and W8's per-row scale takes it whole.
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { rewriteCheckpoint, type TensorEdits } from './rewrite-checkpoint.js';

/**
 * Layer `layer`'s q_proj × `factor`. q_norm, an RMSNorm over each head, is scale-invariant, so HF's
 * outputs do not move (ε aside: 1e-6 against a mean square of thousands); but q now holds values in
 * the thousands, which fit fp16, and q_norm squares them (x·x), which does not.
 */
export async function makeFp16Hostile(src: string, out: string, layer: number, factor = 1024): Promise<void> {
  const q = `model.layers.${layer}.self_attn.q_proj.weight`;
  await rewrite(src, out, factor, { [q]: (data) => scaleAll(data, factor) });
}

/**
 * Layer `layer`'s MLP with up_proj × `factor` and down_proj ÷ `factor`: down(silu(gate)·up) does not
 * move, but the intermediate silu(gate)·up, down_proj's input, grows by `factor` past fp16's range
 * (the drift of the hand-made Gemma-4 audio path, planted).
 */
export async function makeMlpFp16Hostile(src: string, out: string, layer: number, factor = 2 ** 13): Promise<void> {
  const at = await layerTensors(src, layer, 'mlp.up_proj');
  await rewrite(src, out, factor, { [at('mlp.up_proj')]: (data) => scaleAll(data, factor), [at('mlp.down_proj')]: (data) => scaleAll(data, 1 / factor) });
}

/**
 * Layer `layer`'s attention with v_proj × `factor` and o_proj ÷ `factor`: attention is linear in V,
 * so HF's outputs do not move, but V (what the KV cache holds and o_proj reads) grows past fp16's range.
 */
export async function makeValuesFp16Hostile(src: string, out: string, layer: number, factor = 2 ** 15): Promise<void> {
  const at = await layerTensors(src, layer, 'self_attn.v_proj');
  await rewrite(src, out, factor, { [at('self_attn.v_proj')]: (data) => scaleAll(data, factor), [at('self_attn.o_proj')]: (data) => scaleAll(data, 1 / factor) });
}

/** A layer's weight names: a text decoder's layers are under model.layers (Qwen3) or model.language_model.layers (Gemma-4). */
async function layerTensors(src: string, layer: number, probe: string): Promise<(m: string) => string> {
  const ckpt = await openCheckpoint(src);
  const prefix = ckpt.names().find((n) => n.endsWith(`layers.${layer}.${probe}.weight`))?.slice(0, -`${probe}.weight`.length);
  await ckpt.close();
  if (!prefix) throw new Error(`${src} has no layers.${layer}.${probe}.weight`);
  return (m) => `${prefix}${m}.weight`;
}

const scaleAll = (data: Float32Array, by: number) => data.forEach((x, i) => (data[i] = x * by));

async function rewrite(src: string, out: string, factor: number, edits: TensorEdits): Promise<void> {
  if (Math.log2(factor) % 1 !== 0) throw new Error(`factor ${factor} is not a power of two`);
  await rewriteCheckpoint(src, out, edits);
}
