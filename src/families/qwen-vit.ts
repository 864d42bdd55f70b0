// The Qwen-VL vision encoder (Qwen3-VL; the block any Qwen-style VLM family can reuse): a still
// image's patches in 2×2 merge-block order → patch embedding (HF's Conv3d with kernel = stride is a
// Linear over C·T·P·P values) + a learned square position table resampled bilinearly to the grid →
// pre-norm blocks (LayerNorm, fused qkv with bias, 2-D RoPE over (row, col), full attention, GELU-tanh
// MLP) → the merger (LayerNorm, 2×2 concat, fc1, GELU(erf), fc2) and the DeepStack mergers (2×2
// concat, LayerNorm over 4·hidden, fc1, GELU, fc2) on the outputs of chosen blocks. The grid is
// fixed per recipe, so positions, interpolation taps and rotary angles are graph constants.
import type { GraphBuilder } from '../onnx/builder.js';
import type { GraphInterface, GraphWeights, TensorIO } from './types.js';
import { geluErf, geluTanh, layerNorm, linear, mergeHeads, splitHeads } from './blocks.js';

export interface VisionConfig {
  depth: number;
  hidden: number;
  ffn: number;
  heads: number;
  patch: number;
  temporal: number;
  merge: number;
  channels: number;
  outHidden: number;
  /** Entries of the square learned position table (side²). */
  positions: number;
  /** Blocks whose outputs feed a DeepStack merger, in merger order. */
  deepstack: number[];
  ropeTheta: number;
}

/** The fixed grid of an image of height × width: patches, their count, and the merged tokens. */
export function visionGrid(v: Pick<VisionConfig, 'patch' | 'merge'>, image: { height: number; width: number }) {
  const gh = image.height / v.patch;
  const gw = image.width / v.patch;
  return { gh, gw, patches: gh * gw, tokens: (gh * gw) / (v.merge * v.merge) };
}

/** (row, col) of every patch in merge-block order: block row, block col, row in block, col in block. */
export function mergeBlockOrder(gh: number, gw: number, merge: number): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (let br = 0; br < gh / merge; br++) {
    for (let bc = 0; bc < gw / merge; bc++) {
      for (let r = 0; r < merge; r++) for (let c = 0; c < merge; c++) out.push([br * merge + r, bc * merge + c]);
    }
  }
  return out;
}

/**
 * Bilinear taps (align_corners) of the side×side table for each patch, as HF's
 * get_vision_interpolation_indices_and_weights computes them in float32: 4 indices and weights per patch.
 */
export function positionTaps(gh: number, gw: number, merge: number, side: number): { indices: BigInt64Array; weights: Float32Array } {
  const order = mergeBlockOrder(gh, gw, merge);
  const axis = (i: number, size: number) => {
    const src = Math.fround(Math.fround(i * (side - 1)) / Math.max(size - 1, 1));
    const floor = Math.floor(src);
    return [0, 1].map((o) => ({ tap: Math.min(Math.max(floor + o, 0), side - 1), weight: Math.max(Math.fround(1 - Math.abs(Math.fround(src - floor - o))), 0) }));
  };
  const indices = new BigInt64Array(order.length * 4);
  const weights = new Float32Array(order.length * 4);
  order.forEach(([row, col], p) => {
    const hs = axis(row, gh);
    const ws = axis(col, gw);
    for (let a = 0; a < 2; a++) {
      for (let b = 0; b < 2; b++) {
        indices[p * 4 + a * 2 + b] = BigInt(hs[a].tap * side + ws[b].tap);
        weights[p * 4 + a * 2 + b] = Math.fround(hs[a].weight * ws[b].weight);
      }
    }
  });
  return { indices, weights };
}

/**
 * The 2-D rotary angles of every patch: head_dim/4 frequencies over the row, the same over the
 * column, concatenated and repeated twice (HF's axial vision RoPE), as [P, headDim] cos and sin.
 */
export function visionRope(gh: number, gw: number, merge: number, headDim: number, theta: number): { cos: Float32Array; sin: Float32Array } {
  const spatial = headDim / 2;
  const freqs = Array.from({ length: spatial / 2 }, (_, i) => Math.fround(1 / Math.fround(Math.pow(theta, Math.fround((2 * i) / spatial)))));
  const order = mergeBlockOrder(gh, gw, merge);
  const cos = new Float32Array(order.length * headDim);
  const sin = new Float32Array(order.length * headDim);
  order.forEach(([row, col], p) => {
    const angles = [...freqs.map((f) => Math.fround(row * f)), ...freqs.map((f) => Math.fround(col * f))];
    angles.forEach((a, j) => {
      cos[p * headDim + j] = cos[p * headDim + j + spatial] = Math.cos(a);
      sin[p * headDim + j] = sin[p * headDim + j + spatial] = Math.sin(a);
    });
  });
  return { cos, sin };
}

/** Names of the encoder's graph inputs and outputs (the trace's are `vision.*`). */
export const PIXELS = 'pixel_values';
export const IMAGE_EMBEDS = 'image_embeds';
export const deepstackOutput = (k: number) => `deepstack_${k}`;

/**
 * The whole encoder as one graph: pixel_values [P, C·T·p·p] → image_embeds [tokens, outHidden] and
 * deepstack_k [tokens, outHidden]. `prefix` is the checkpoint's (`model.visual`).
 */
export async function visionEncoderGraph(g: GraphBuilder, v: VisionConfig, image: { height: number; width: number }, prefix: string, w: GraphWeights): Promise<GraphInterface> {
  const { gh, gw, patches: P, tokens: T } = visionGrid(v, image);
  const D = v.channels * v.temporal * v.patch * v.patch;
  const Hv = v.hidden;
  const hd = Hv / v.heads;
  const f32 = 'float32' as const;
  const small = (name: string, shape: number[]) => w.store.small(g, `${prefix}.${name}`, shape);
  const lin = async (x: string, name: string, shape: [number, number], n: number) =>
    w.store.linear(g, x, `${prefix}.${name}.weight`, shape, w.scheme, n, await small(`${name}.bias`, [shape[0]]));
  const probes: Record<string, TensorIO> = {};
  const probe = (value: string, name: string, rows: number, width: number) => { probes[value] = { name, dtype: f32, shape: [rows, width] }; };

  const pixels = g.input(PIXELS, f32, [P, D]);
  // Patch embedding: the Conv3d's weight [Hv, C, T, p, p] read whole (fp32, inline) and used as [Hv, D].
  const convW = g.op('Reshape', [await small('patch_embed.proj.weight', [Hv, v.channels, v.temporal, v.patch, v.patch]), g.constInt64([Hv, D])]);
  let x = linear(g, g.op('Reshape', [pixels, g.constInt64([1, P, D])]), convW, D, Hv, P, await small('patch_embed.proj.bias', [Hv]));
  // The learned table resampled to the grid: 4 constant taps per patch, weighted and summed as HF does.
  const side = Math.round(Math.sqrt(v.positions));
  const taps = positionTaps(gh, gw, v.merge, side);
  const table = await small('pos_embed.weight', [v.positions, Hv]);
  const rows = g.op('Gather', [table, g.initializer('vision.pos_taps', taps.indices, [P, 4], 'int64')], { axis: 0 });
  const pos = g.op('ReduceSum', [g.op('Mul', [rows, g.initializer('vision.pos_weights', taps.weights, [P, 4, 1])]), g.constInt64([1])], { keepdims: 0 });
  x = g.op('Add', [x, g.op('Reshape', [pos, g.constInt64([1, P, Hv])])], {}, 1, { outputs: ['vision.embed'] });
  probe(x, 'vision.embed', P, Hv);

  const angles = visionRope(gh, gw, v.merge, hd, v.ropeTheta);
  const rope = { cos: g.initializer('vision.rope.cos', angles.cos, [1, 1, P, hd]), sin: g.initializer('vision.rope.sin', angles.sin, [1, 1, P, hd]) };
  const rotate = (t: string) => {
    const [a, b] = g.op('Split', [t], { axis: -1 }, 2);
    return g.op('Add', [g.op('Mul', [t, rope.cos]), g.op('Mul', [g.op('Concat', [g.op('Neg', [b]), a], { axis: -1 }), rope.sin])]);
  };
  const outputs: TensorIO[] = [];
  const inputs: TensorIO[] = [{ name: pixels, dtype: f32, shape: [P, D] }];
  const merger = async (name: string, h: string, postShuffle: boolean, output: string) => {
    const W4 = 4 * Hv;
    const norm = async (t: string, size: number) => layerNorm(g, t, await small(`${name}.norm.weight`, [size]), await small(`${name}.norm.bias`, [size]), 1e-6);
    // 2×2 concat: merge-block order puts a block's four patches on consecutive rows.
    const shuffled = postShuffle ? await norm(g.op('Reshape', [h, g.constInt64([1, T, W4])]), W4) : g.op('Reshape', [await norm(h, Hv), g.constInt64([1, T, W4])]);
    const y = await lin(geluErf(g, await lin(shuffled, `${name}.linear_fc1`, [W4, W4], T)), `${name}.linear_fc2`, [v.outHidden, W4], T);
    const out = g.output(g.op('Reshape', [y, g.constInt64([T, v.outHidden])]), output, { shape: [T, v.outHidden] });
    outputs.push({ name: out, dtype: f32, shape: [T, v.outHidden] });
  };
  for (let j = 0; j < v.depth; j++) {
    const b = `blocks.${j}`;
    x = await g.scoped(`vision.${b}`, async () => {
      const h = layerNorm(g, x, await small(`${b}.norm1.weight`, [Hv]), await small(`${b}.norm1.bias`, [Hv]), 1e-6);
      const [q, k, val] = g.op('Split', [await lin(h, `${b}.attn.qkv`, [3 * Hv, Hv], P)], { axis: -1 }, 3);
      const heads = (t: string) => splitHeads(g, t, v.heads, hd, P);
      const scores = g.op('Mul', [g.op('MatMul', [rotate(heads(q)), g.op('Transpose', [rotate(heads(k))], { perm: [0, 1, 3, 2] })]), g.constFloat32([1 / Math.sqrt(hd)], [])]);
      const attn = g.op('MatMul', [g.op('Softmax', [scores], { axis: -1 }), heads(val)]);
      const x1 = g.op('Add', [x, await lin(mergeHeads(g, attn, v.heads, hd, P), `${b}.attn.proj`, [Hv, Hv], P)]);
      const m = layerNorm(g, x1, await small(`${b}.norm2.weight`, [Hv]), await small(`${b}.norm2.bias`, [Hv]), 1e-6);
      const mlp = await lin(geluTanh(g, await lin(m, `${b}.mlp.linear_fc1`, [v.ffn, Hv], P)), `${b}.mlp.linear_fc2`, [Hv, v.ffn], P);
      return g.op('Add', [x1, mlp], {}, 1, { outputs: [`vision.block.${j}`] }) as string;
    });
    probe(x, `vision.block.${j}`, P, Hv);
    const k = v.deepstack.indexOf(j);
    if (k >= 0) await g.scoped(`vision.deepstack.${k}`, () => merger(`deepstack_merger_list.${k}`, x, true, deepstackOutput(k)));
  }
  await g.scoped('vision.merger', () => merger('merger', x, false, IMAGE_EMBEDS));
  // image_embeds first: the host splices it into the prompt; the DeepStack features follow in order.
  outputs.sort((a, b) => (a.name === IMAGE_EMBEDS ? -1 : b.name === IMAGE_EMBEDS ? 1 : a.name.localeCompare(b.name, undefined, { numeric: true })));
  return { inputs, outputs, probes };
}
