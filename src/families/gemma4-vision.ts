// The Gemma 4 vision encoder (transformers' Gemma4VisionModel + embed_vision) as one graph over a
// fixed patch budget. Unlike Qwen-VL's fixed grid, Gemma 4's processor keeps each image's aspect
// ratio: it resizes to the largest sides that are multiples of pooling·patch within the budget of
// maxSoftTokens·k² patches, so the grid differs per image and the patches' positions are an input.
//
// Graph contract (what the host feeds: exactly the image processor's output for one image):
//   pixel_values        float32 [P, 3·p·p]  channel-last patches, rescaled to [0, 1]; padding rows 0
//   pixel_position_ids  int32   [P, 2]      (x, y) of each patch on the resized grid; padding (−1, −1)
// with P = maxSoftTokens·k² (k = pooling_kernel_size). Output:
//   soft_tokens         float32 [maxSoftTokens, textHidden]: the image's soft tokens in the text
//                       width; the first (real patches)/k² rows are the image's, the rest padding.
// Everything else is derived in the graph from the positions, as HF derives it:
//   - patch embedding: input_proj(2·(x − 0.5)) + table[0][x] + table[1][y] (none for padding);
//   - blocks: sandwich RMSNorms (plain w), q/k RMSNorm over head_dim and a weightless v norm,
//     attention scale 1, bidirectional over the real patches (padding keys masked), 2-D RoPE: the
//     first half of each head rotated by x, the second by y (θ from the config, head_dim/4
//     frequencies each), gated GELU-tanh MLP; linears clipped to the checkpoint's min/max when the
//     config says so;
//   - pooler: each real patch averaged into soft token ⌊x/k⌋ + (⌊(max x + 1)/k⌋)·⌊y/k⌋ (divided
//     by k², as HF), × √hidden, then standardized ((h − std_bias)·std_scale) when configured;
//   - embed_vision: a weightless RMSNorm, then Linear(hidden → text hidden).
import { z } from 'zod';
import type { GraphBuilder } from '../onnx/builder.js';
import { ConfigError, MAX_DIM, parseConfigWith, type GraphInterface, type GraphWeights, type TensorIO } from './types.js';
import { geluTanh, mergeHeads, MASKED, rmsNorm, splitHeads } from './blocks.js';

const dim = z.number().int().positive().max(MAX_DIM);
const VisionSchema = z.object({
  hidden_size: dim,
  intermediate_size: dim,
  num_hidden_layers: z.number().int().positive().max(1024),
  num_attention_heads: dim,
  num_key_value_heads: dim,
  head_dim: dim,
  hidden_activation: z.literal('gelu_pytorch_tanh', { message: 'only gelu_pytorch_tanh is supported' }),
  rms_norm_eps: z.number().positive(),
  pooling_kernel_size: z.number().int().positive().max(16),
  patch_size: z.number().int().positive().max(1024),
  position_embedding_size: dim,
  use_clipped_linears: z.boolean().default(false),
  standardize: z.boolean().default(false),
  attention_bias: z.union([z.literal(false), z.null()], { message: 'the vision graphs are built without attention biases' }).optional(),
  rope_parameters: z.object({ rope_type: z.literal('axial', { message: 'only axial 2-D RoPE is supported' }), rope_theta: z.number().positive() }).passthrough(),
}).passthrough();

/** The soft-token budgets HF's Gemma 4 image processor accepts (image_processing_gemma4 _SUPPORTED_SOFT_TOKENS). */
export const GEMMA4_SOFT_TOKEN_BUDGETS = [70, 140, 280, 560, 1120] as const;

export interface Gemma4VisionConfig {
  hidden: number;
  ffn: number;
  layers: number;
  heads: number;
  headDim: number;
  eps: number;
  pooling: number;
  patch: number;
  /** Entries per axis of the position table ([2, positions, hidden]): the largest patch index + 1 an image may use. */
  positions: number;
  clipped: boolean;
  standardize: boolean;
  ropeTheta: number;
}

/** Reads `vision_config` of a Gemma 4 config.json; errors name the field. */
export function parseGemma4VisionConfig(raw: unknown, file: string, field = 'vision_config'): Gemma4VisionConfig {
  // Parsed under its field's name, so every refusal names the whole path (vision_config.head_dim).
  const v = parseConfigWith(z.object({ [field]: VisionSchema }), { [field]: raw }, file)[field];
  const f = (name: string) => `${field}.${name}`;
  if (v.num_key_value_heads !== v.num_attention_heads) throw new ConfigError(file, f('num_key_value_heads'), `${v.num_key_value_heads} differs from num_attention_heads ${v.num_attention_heads} (grouped vision attention is not built)`);
  if (v.head_dim % 4 !== 0) throw new ConfigError(file, f('head_dim'), `${v.head_dim} is not divisible by 4 (2-D RoPE rotates pairs in each half)`);
  return {
    hidden: v.hidden_size, ffn: v.intermediate_size, layers: v.num_hidden_layers, heads: v.num_attention_heads, headDim: v.head_dim,
    eps: v.rms_norm_eps, pooling: v.pooling_kernel_size, patch: v.patch_size, positions: v.position_embedding_size,
    clipped: v.use_clipped_linears, standardize: v.standardize, ropeTheta: v.rope_parameters.rope_theta,
  };
}

/** Patches per image at a soft-token budget. */
export const gemma4Patches = (v: Pick<Gemma4VisionConfig, 'pooling'>, maxSoftTokens: number) => maxSoftTokens * v.pooling * v.pooling;

/** The graph's names (the trace's values are `vision.*`). */
export const VISION_PIXELS = 'pixel_values';
export const VISION_POSITIONS = 'pixel_position_ids';
export const SOFT_TOKENS = 'soft_tokens';
const TOWER = 'model.vision_tower';

/** HF's axial inverse frequencies: head_dim/4 of them, over half the head (fp32 as its init). */
function axialInvFreq(headDim: number, theta: number): Float32Array {
  const spatial = headDim / 2;
  return Float32Array.from({ length: spatial / 2 }, (_, i) => 1 / Math.fround(Math.pow(theta, Math.fround((2 * i) / spatial))));
}

/** cos/sin of every position 0..n−1 on one axis, [n, headDim/2] (frequencies repeated twice, HF's layout within a half). */
function axisTables(n: number, inv: Float32Array): { cos: Float32Array; sin: Float32Array } {
  const w = inv.length * 2;
  const cos = new Float32Array(n * w);
  const sin = new Float32Array(n * w);
  for (let p = 0; p < n; p++) {
    inv.forEach((f, i) => {
      const a = Math.fround(p * f);
      cos[p * w + i] = cos[p * w + i + inv.length] = Math.cos(a);
      sin[p * w + i] = sin[p * w + i + inv.length] = Math.sin(a);
    });
  }
  return { cos, sin };
}

/**
 * The whole encoder for one image: pixel_values and pixel_position_ids in, soft_tokens out (the
 * trace's vision.tokens), with probes vision.embed and vision.block.j [P, hidden].
 */
export async function gemma4VisionEncoderGraph(g: GraphBuilder, v: Gemma4VisionConfig, textHidden: number, maxSoftTokens: number, w: GraphWeights): Promise<GraphInterface> {
  const P = gemma4Patches(v, maxSoftTokens);
  const L = maxSoftTokens;
  const Hv = v.hidden;
  const hd = v.headDim;
  const D = 3 * v.patch * v.patch;
  const f32 = 'float32' as const;
  const small = (name: string, shape: number[]) => w.store.small(g, `${TOWER}.${name}`, shape);
  const probes: Record<string, TensorIO> = {};
  const probe = (value: string, name: string, rows: number, width: number) => { probes[value] = { name, dtype: f32, shape: [rows, width] }; };
  const scalar = (x: number) => g.constFloat32([x], []);

  // A linear of the tower, clipped to the checkpoint's recorded input and output ranges when configured.
  const clippedLinear = async (x: string, name: string, shape: [number, number]) => {
    const clip = async (t: string, which: 'input' | 'output') => (v.clipped
      ? g.op('Max', [g.op('Min', [t, await small(`${name}.${which}_max`, [])]), await small(`${name}.${which}_min`, [])])
      : t);
    const y = await g.scoped(name, async () => w.store.linear(g, await clip(x, 'input'), `${TOWER}.${name}.linear.weight`, shape, w.scheme, P));
    return clip(y, 'output');
  };

  const pixels = g.input(VISION_PIXELS, f32, [P, D]);
  const positions = g.input(VISION_POSITIONS, 'int32', [P, 2]);
  const axis = (a: number) => g.op('Reshape', [g.op('Gather', [positions, g.constInt64([a])], { axis: 1 }), g.constInt64([P])]);
  const [x0, y0] = [axis(0), axis(1)];
  // Padding patches are (−1, −1): valid where x ≥ 0; lookups use the clamped index, as HF's clamp(min=0).
  const zero = g.initializer('vision.zero_i32', Int32Array.from([0]), [], 'int32');
  const valid = g.op('Cast', [g.op('Not', [g.op('Less', [x0, zero])])], { to: 1 }); // [P]
  const px = g.op('Max', [x0, zero]);
  const py = g.op('Max', [y0, zero]);
  const validCol = g.op('Reshape', [valid, g.constInt64([P, 1])]);

  // Patch embedding: input_proj over 2(x − 0.5), plus the x and y position rows (zero for padding).
  const scaled = g.op('Mul', [g.op('Sub', [pixels, scalar(0.5)]), scalar(2)]);
  const proj = await g.scoped('patch_embedder.input_proj', () => w.store.linear(g, g.op('Reshape', [scaled, g.constInt64([1, P, D])]), `${TOWER}.patch_embedder.input_proj.weight`, [Hv, D], w.scheme, P));
  const table = await small('patch_embedder.position_embedding_table', [2, v.positions, Hv]);
  const [tx, ty] = g.op('Split', [table], { axis: 0 }, 2).map((t) => g.op('Reshape', [t, g.constInt64([v.positions, Hv])]));
  const pos = g.op('Mul', [g.op('Add', [g.op('Gather', [tx, px], { axis: 0 }), g.op('Gather', [ty, py], { axis: 0 })]), validCol]);
  let x = g.op('Add', [proj, g.op('Reshape', [pos, g.constInt64([1, P, Hv])])], {}, 1, { outputs: ['vision.embed'] }) as string;
  probe(x, 'vision.embed', P, Hv);

  // 2-D RoPE rows per patch: [cos(x·f), cos(x·f), cos(y·f), cos(y·f)] over the head, from per-axis tables.
  const tables = axisTables(v.positions, axialInvFreq(hd, v.ropeTheta));
  const rows = (t: Float32Array, name: string) => {
    const tab = g.initializer(`vision.rope.${name}`, t, [v.positions, hd / 2]);
    return g.op('Reshape', [g.op('Concat', [g.op('Gather', [tab, px], { axis: 0 }), g.op('Gather', [tab, py], { axis: 0 })], { axis: -1 }), g.constInt64([1, 1, P, hd])]);
  };
  const rope = { cos: rows(tables.cos, 'cos'), sin: rows(tables.sin, 'sin') };
  // rotate_half within each half of the head: [a, b | c, d] → [−b, a | −d, c].
  const rotate = (t: string) => {
    const [a, b, c, d] = g.op('Split', [t], { axis: -1 }, 4);
    return g.op('Add', [g.op('Mul', [t, rope.cos]), g.op('Mul', [g.op('Concat', [g.op('Neg', [b]), a, g.op('Neg', [d]), c], { axis: -1 }), rope.sin])]);
  };
  // Keys of padding patches are masked for every query (HF's bidirectional mask over the real patches).
  const keyBias = g.op('Reshape', [g.op('Mul', [g.op('Sub', [scalar(1), valid]), scalar(MASKED)]), g.constInt64([1, 1, 1, P])]);

  const norm = async (t: string, name: string, size: number) => rmsNorm(g, t, await small(`${name}.weight`, [size]), v.eps, name);
  for (let j = 0; j < v.layers; j++) {
    const b = `encoder.layers.${j}`;
    x = await g.scoped(`vision.${b}`, async () => {
      const h = await norm(x, `${b}.input_layernorm`, Hv);
      const heads = async (name: string) => splitHeads(g, await clippedLinear(h, `${b}.self_attn.${name}`, [v.heads * hd, Hv]), v.heads, hd, P);
      const q = rotate(await norm(await heads('q_proj'), `${b}.self_attn.q_norm`, hd));
      const k = rotate(await norm(await heads('k_proj'), `${b}.self_attn.k_norm`, hd));
      const val = rmsNorm(g, await heads('v_proj'), scalar(1), v.eps, `${b}.self_attn.v_norm`);
      const scores = g.op('Add', [g.op('MatMul', [q, g.op('Transpose', [k], { perm: [0, 1, 3, 2] })]), keyBias]);
      const attn = g.op('MatMul', [g.op('Softmax', [scores], { axis: -1 }), val]);
      const o = await clippedLinear(mergeHeads(g, attn, v.heads, hd, P), `${b}.self_attn.o_proj`, [Hv, v.heads * hd]);
      const x1 = g.op('Add', [x, await norm(o, `${b}.post_attention_layernorm`, Hv)]);
      const m = await norm(x1, `${b}.pre_feedforward_layernorm`, Hv);
      const gate = await clippedLinear(m, `${b}.mlp.gate_proj`, [v.ffn, Hv]);
      const up = await clippedLinear(m, `${b}.mlp.up_proj`, [v.ffn, Hv]);
      const mlp = await clippedLinear(g.op('Mul', [geluTanh(g, gate), up]), `${b}.mlp.down_proj`, [Hv, v.ffn]);
      return g.op('Add', [x1, await norm(mlp, `${b}.post_feedforward_layernorm`, Hv)], {}, 1, { outputs: [`vision.block.${j}`] }) as string;
    });
    probe(x, `vision.block.${j}`, P, Hv);
  }

  const tokens = await g.scoped('vision.pooler', async () => {
    // Soft token of each patch: ⌊x/k⌋ + ⌊(max x + 1)/k⌋·⌊y/k⌋ (integer division of non-negative ints floors).
    const k = g.initializer('vision.pool_k', Int32Array.from([v.pooling]), [], 'int32');
    const width = g.op('Div', [g.op('Add', [g.op('ReduceMax', [px], { keepdims: 1 }), g.initializer('vision.one_i32', Int32Array.from([1]), [], 'int32')]), k]);
    const index = g.op('Add', [g.op('Div', [px, k]), g.op('Mul', [width, g.op('Div', [py, k])])]);
    const slots = g.initializer('vision.pool_slots', Int32Array.from({ length: L }, (_, i) => i), [1, L], 'int32');
    const onehot = g.op('Cast', [g.op('Equal', [g.op('Reshape', [index, g.constInt64([P, 1])]), slots])], { to: 1 }); // [P, L]
    const weights = g.op('Mul', [onehot, g.op('Mul', [validCol, scalar(Math.fround(1 / (v.pooling * v.pooling)))])]);
    let pooled = g.op('MatMul', [g.op('Transpose', [weights], { perm: [1, 0] }), g.op('Reshape', [x, g.constInt64([P, Hv])])]); // [L, Hv]
    pooled = g.op('Mul', [pooled, scalar(Math.fround(Math.sqrt(Hv)))]);
    if (v.standardize) pooled = g.op('Mul', [g.op('Sub', [pooled, await small('std_bias', [Hv])]), await small('std_scale', [Hv])]);
    const normed = rmsNorm(g, g.op('Reshape', [pooled, g.constInt64([1, L, Hv])]), scalar(1), v.eps, 'embed_vision.embedding_pre_projection_norm');
    const out = await g.scoped('embed_vision.embedding_projection', () => w.store.linear(g, normed, 'model.embed_vision.embedding_projection.weight', [textHidden, Hv], w.scheme, L));
    return g.op('Reshape', [out, g.constInt64([L, textHidden])]);
  });
  const out = g.output(tokens, SOFT_TOKENS, { shape: [L, textHidden] });
  return {
    inputs: [{ name: pixels, dtype: f32, shape: [P, D] }, { name: positions, dtype: 'int32', shape: [P, 2] }],
    outputs: [{ name: out, dtype: f32, shape: [L, textHidden] }],
    probes,
  };
}
