// A tiny attention-shaped graph covering the ops and weight dtypes forge exports use, plus
// a plain-TS reference of what it computes.
import * as ort from 'onnxruntime-node';
import { GraphBuilder, attr, fromFloat16, toFloat16, type GraphBuilderOptions } from '../../src/onnx/index.js';

export const S = 4; // tokens
export const H = 16; // hidden
export const HEADS = 2;
export const HD = H / HEADS;
export const VOCAB = 32;

export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296 - 0.5; // [-0.5, 0.5)
  };
}

export interface Weights {
  embed: Float32Array; // [VOCAB, H] float32
  wq: Uint16Array; // [H, H] float16 bits
  wkv: Int8Array; // [H, 2H] int8, per-column (axis 1) scale + zero point
  wkvScale: Float32Array; // [2H]
  wkvZero: Int8Array; // [2H]
  bias: Float32Array; // [H]
}

export function makeWeights(seed = 1): Weights {
  const r = rng(seed);
  const f = (n: number, s = 1) => Float32Array.from({ length: n }, () => r() * s);
  return {
    embed: f(VOCAB * H),
    wq: toFloat16(f(H * H)),
    wkv: Int8Array.from({ length: H * 2 * H }, () => Math.round(r() * 254)),
    wkvScale: Float32Array.from({ length: 2 * H }, () => 0.002 + (r() + 0.5) * 0.01),
    wkvZero: Int8Array.from({ length: 2 * H }, () => Math.round(r() * 8)),
    bias: f(H),
  };
}

/** Build the graph; inputs x [1,S,H] float32 and ids [1,S] int64, outputs out [1,S,H] and k_out [1,S,H]. */
export function buildGraph(w: Weights, opts: GraphBuilderOptions = {}): GraphBuilder {
  const g = new GraphBuilder('decode', opts);
  const x = g.input('x', 'float32', [1, S, H]);
  const ids = g.input('ids', 'int64', [1, S]);
  const embed = g.initializer('model.embed_tokens.weight', w.embed, [VOCAB, H]);
  const wq = g.initializer('layers.0.q_proj.weight', w.wq, [H, H], 'float16');
  const wkv = g.initializer('layers.0.kv_proj.weight', w.wkv, [H, 2 * H]);
  const scale = g.initializer('layers.0.kv_proj.scale', w.wkvScale, [2 * H]);
  const zero = g.initializer('layers.0.kv_proj.zero_point', w.wkvZero, [2 * H]);
  const bias = g.initializer('layers.0.o_proj.bias', w.bias, [H]);

  const h = g.op('Add', [x, g.op('Gather', [embed, ids], { axis: 0 })]);
  const q = g.op('MatMul', [h, g.op('Cast', [wq], { to: 1 })]);
  const wkvF = g.op('DequantizeLinear', [wkv, scale, zero], { axis: 1 });
  const [k, v] = g.op('Split', [g.op('MatMul', [h, wkvF])], { axis: 2 }, 2);
  const heads = g.constInt64([1, S, HEADS, HD]);
  const split = (t: string, perm: number[]) => g.op('Transpose', [g.op('Reshape', [t, heads])], { perm });
  const q4 = split(q, [0, 2, 1, 3]);
  const kT = split(k, [0, 2, 3, 1]);
  const v4 = split(v, [0, 2, 1, 3]);
  const c = g.op('Constant', [], { value: attr.tensor(Float32Array.of(1 / Math.sqrt(HD)), []) });
  const p = g.op('Softmax', [g.op('Mul', [g.op('MatMul', [q4, kT]), c])], { axis: -1 });
  const o = g.op('Transpose', [g.op('MatMul', [p, v4])], { perm: [0, 2, 1, 3] });
  const flat = g.op('Reshape', [o, g.constInt64([1, S, H])]);
  g.output(g.op('Add', [flat, bias]), 'out', { shape: [1, S, H] });
  g.output(k, 'k_out', { shape: [1, S, H] });
  return g;
}

export function makeInputs(seed = 7): { x: Float32Array; ids: BigInt64Array } {
  const r = rng(seed);
  return {
    x: Float32Array.from({ length: S * H }, () => r()),
    ids: BigInt64Array.from({ length: S }, (_, i) => BigInt((i * 13 + seed) % VOCAB)),
  };
}

/** What the graph computes, in float64. */
export function reference(w: Weights, x: Float32Array, ids: BigInt64Array): { out: Float64Array; k: Float64Array } {
  const wq = fromFloat16(w.wq);
  const h = new Float64Array(S * H);
  for (let s = 0; s < S; s++) for (let j = 0; j < H; j++) h[s * H + j] = x[s * H + j] + w.embed[Number(ids[s]) * H + j];
  const mm = (a: Float64Array, b: (i: number, j: number) => number, n: number, kk: number, m: number) => {
    const out = new Float64Array(n * m);
    for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) {
      let acc = 0;
      for (let t = 0; t < kk; t++) acc += a[i * kk + t] * b(t, j);
      out[i * m + j] = acc;
    }
    return out;
  };
  const q = mm(h, (t, j) => wq[t * H + j], S, H, H);
  const kv = mm(h, (t, j) => (w.wkv[t * 2 * H + j] - w.wkvZero[j]) * w.wkvScale[j], S, H, 2 * H);
  const k = new Float64Array(S * H);
  const v = new Float64Array(S * H);
  for (let s = 0; s < S; s++) for (let j = 0; j < H; j++) {
    k[s * H + j] = kv[s * 2 * H + j];
    v[s * H + j] = kv[s * 2 * H + H + j];
  }
  const out = new Float64Array(S * H);
  for (let hd = 0; hd < HEADS; hd++) {
    for (let i = 0; i < S; i++) {
      const sc = Array.from({ length: S }, (_, j) => {
        let acc = 0;
        for (let d = 0; d < HD; d++) acc += q[i * H + hd * HD + d] * k[j * H + hd * HD + d];
        return acc / Math.sqrt(HD);
      });
      const mx = Math.max(...sc);
      const e = sc.map((z) => Math.exp(z - mx));
      const sum = e.reduce((a, b) => a + b, 0);
      for (let d = 0; d < HD; d++) {
        let acc = 0;
        for (let j = 0; j < S; j++) acc += (e[j] / sum) * v[j * H + hd * HD + d];
        out[i * H + hd * HD + d] = acc + w.bias[hd * HD + d];
      }
    }
  }
  return { out, k };
}

// 'basic' keeps the graph's numerics: at 'extended'/'all' ORT's CPU EP rewrites
// DequantizeLinear(int8 weight) → MatMul into com.microsoft MatMulNBits (bits=8), whose CPU
// kernel also quantizes the activations to int8: ~5e-3 off here. A CPU-EP choice, not the file.
export async function runOrt(path: string, x: Float32Array, ids: BigInt64Array): Promise<{ out: Float32Array; k: Float32Array }> {
  const sess = await ort.InferenceSession.create(path, { graphOptimizationLevel: 'basic' });
  try {
    const r = await sess.run({ x: new ort.Tensor('float32', x, [1, S, H]), ids: new ort.Tensor('int64', ids, [1, S]) });
    expectDims(r.out.dims, [1, S, H]);
    return { out: r.out.data as Float32Array, k: r.k_out.data as Float32Array };
  } finally {
    await sess.release();
  }
}

function expectDims(got: readonly number[], want: number[]): void {
  if (got.join(',') !== want.join(',')) throw new Error(`dims [${got}] != [${want}]`);
}

export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) return Infinity;
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}
