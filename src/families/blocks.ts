// ONNX building blocks shared by decoder families: norms, linear layers, rotary embedding, grouped
// attention over an explicit KV cache, gated MLPs. A family module composes these; anything a
// single family does differently stays in that family's file.
//
// Conventions: activations are float32 [1, N, H] (N tokens per call: 1 for decode, the prefill
// length for prefill); linear layers take weights [out, in] as stored by HF (Gemm transB=1), which
// is FullyConnected's native layout on the HTP and lets weights stream row by row.
import type { GraphBuilder } from '../onnx/builder.js';
import type { RescalePair } from './types.js';

/** RMSNorm over the last axis: x·rsqrt(mean(x²)+eps)·w. `w` is a value (already 1+w where a family needs that). */
export function rmsNorm(g: GraphBuilder, x: string, w: string, eps: number, name?: string): string {
  const prev = g.scope;
  if (name) g.scope = prev ? `${prev}/${name}` : name;
  try {
    // A rescale rule for this norm (forge bisect's fix when x·x overflows fp16 on the HTP): RMSNorm
    // is scale-invariant, x·rsqrt(mean x² + ε) = (s·x)·rsqrt(mean (s·x)² + s²ε), so the input is
    // multiplied by s (a power of two: exact) and ε by s². Same function, squares fp16 can hold.
    const s = name ? g.rescaleFor(g.scope) : undefined;
    const xs = s === undefined ? x : g.op('Mul', [x, g.constFloat32([s], [])]);
    const e = s === undefined ? eps : eps * s * s;
    const sq = g.op('Mul', [xs, xs]);
    const mean = g.op('ReduceMean', [sq], { axes: [-1], keepdims: 1 });
    const inv = g.op('Reciprocal', [g.op('Sqrt', [g.op('Add', [mean, g.constFloat32([e], [])])])]);
    return g.op('Mul', [g.op('Mul', [xs, inv]), w]);
  } finally {
    g.scope = prev;
  }
}

/** LayerNorm over the last axis with weight and bias (ONNX LayerNormalization, opset 17). */
export function layerNorm(g: GraphBuilder, x: string, w: string, b: string, eps: number): string {
  return g.op('LayerNormalization', [x, w, b], { axis: -1, epsilon: eps });
}

/** x [1, N, in] · Wᵀ with W [out, in] → [1, N, out]. */
export function linear(g: GraphBuilder, x: string, w: string, inDim: number, outDim: number, n: number, bias?: string): string {
  const x2 = g.op('Reshape', [x, g.constInt64([n, inDim])]);
  const y = g.op('Gemm', bias ? [x2, w, bias] : [x2, w], { transB: 1 });
  return g.op('Reshape', [y, g.constInt64([1, n, outDim])]);
}

/** [1, N, heads·d] → [1, heads, N, d]. */
export function splitHeads(g: GraphBuilder, x: string, heads: number, d: number, n: number): string {
  return g.op('Transpose', [g.op('Reshape', [x, g.constInt64([1, n, heads, d])])], { perm: [0, 2, 1, 3] });
}

/** [1, heads, N, d] → [1, N, heads·d]. */
export function mergeHeads(g: GraphBuilder, x: string, heads: number, d: number, n: number): string {
  return g.op('Reshape', [g.op('Transpose', [x], { perm: [0, 2, 1, 3] }), g.constInt64([1, n, heads * d])]);
}

/**
 * Rotary tables for positions 0..maxPos-1 over `rotDim` dims, HF layout (frequencies repeated
 * twice, rotate_half pairing i with i+rotDim/2). Computed in float64 then rounded, like HF's fp32.
 */
export function ropeTables(maxPos: number, rotDim: number, theta: number): { cos: Float32Array; sin: Float32Array } {
  const half = rotDim / 2;
  const cos = new Float32Array(maxPos * rotDim);
  const sin = new Float32Array(maxPos * rotDim);
  if (maxPos === 0) return { cos, sin }; // a dry build (families/tensors.ts): no slots, nothing to compute
  // HF computes inv_freq in float32 then position·inv_freq in float32; follow it so angles match bit for bit.
  const invFreq = new Float32Array(half);
  for (let i = 0; i < half; i++) invFreq[i] = 1 / Math.pow(theta, (2 * i) / rotDim);
  for (let p = 0; p < maxPos; p++) {
    for (let i = 0; i < half; i++) {
      const a = Math.fround(p * invFreq[i]);
      cos[p * rotDim + i] = cos[p * rotDim + i + half] = Math.cos(a);
      sin[p * rotDim + i] = sin[p * rotDim + i + half] = Math.sin(a);
    }
  }
  return { cos, sin };
}

/** cos/sin rows for the call's positions, shaped [1, 1, N, rotDim] to broadcast over heads. */
export function ropeGather(g: GraphBuilder, positions: string, tables: { cos: string; sin: string }, n: number, rotDim: number): { cos: string; sin: string } {
  const shape = g.constInt64([1, 1, n, rotDim]);
  return {
    cos: g.op('Reshape', [g.op('Gather', [tables.cos, positions], { axis: 0 }), shape]),
    sin: g.op('Reshape', [g.op('Gather', [tables.sin, positions], { axis: 0 }), shape]),
  };
}

/** x·cos + rotate_half(x)·sin over the whole last axis (x [1, heads, N, d]). */
export function applyRope(g: GraphBuilder, x: string, cs: { cos: string; sin: string }): string {
  const [x1, x2] = g.op('Split', [x], { axis: -1 }, 2);
  const rotated = g.op('Concat', [g.op('Neg', [x2]), x1], { axis: -1 });
  return g.op('Add', [g.op('Mul', [x, cs.cos]), g.op('Mul', [rotated, cs.sin])]);
}

export interface AttentionShape {
  heads: number;
  kvHeads: number;
  headDim: number;
  n: number;
  /** Cache slots (the max context). */
  ctx: number;
  scale: number;
}

/**
 * Softmax attention of N new tokens over [cache ; new] keys. q [1, heads, N, d], k/v [1, kv, N, d]
 * (keys already rotated), past k/v [1, kv, ctx, d], mask [1, 1, N, ctx+N] additive. Query head h
 * uses kv head ⌊h / (heads/kv)⌋ (HF's repeat_kv), by broadcasting instead of copying the cache.
 * Returns [1, heads, N, d].
 */
export function cachedAttention(g: GraphBuilder, q: string, k: string, v: string, pastK: string, pastV: string, mask: string, s: AttentionShape): string {
  const groups = s.heads / s.kvHeads;
  const t = s.ctx + s.n;
  const keys = g.op('Concat', [pastK, k], { axis: 2 });
  const values = g.op('Concat', [pastV, v], { axis: 2 });
  const q5 = g.op('Reshape', [q, g.constInt64([1, s.kvHeads, groups, s.n, s.headDim])]);
  const k5 = g.op('Reshape', [keys, g.constInt64([1, s.kvHeads, 1, t, s.headDim])]);
  const v5 = g.op('Reshape', [values, g.constInt64([1, s.kvHeads, 1, t, s.headDim])]);
  const scores = g.op('Mul', [g.op('MatMul', [q5, g.op('Transpose', [k5], { perm: [0, 1, 2, 4, 3] })]), g.constFloat32([s.scale], [])]);
  const mask5 = g.op('Reshape', [mask, g.constInt64([1, 1, 1, s.n, t])]);
  const probs = g.op('Softmax', [g.op('Add', [scores, mask5])], { axis: -1 });
  const ctx = g.op('MatMul', [probs, v5]);
  return g.op('Reshape', [ctx, g.constInt64([1, s.heads, s.n, s.headDim])]);
}

/** HF's gelu_pytorch_tanh: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (opset 17 has no Gelu). */
export function geluTanh(g: GraphBuilder, x: string): string {
  const x3 = g.op('Mul', [g.op('Mul', [x, x]), x]);
  const inner = g.op('Mul', [g.op('Add', [x, g.op('Mul', [x3, g.constFloat32([0.044715], [])])]), g.constFloat32([Math.sqrt(2 / Math.PI)], [])]);
  return g.op('Mul', [g.op('Mul', [x, g.constFloat32([0.5], [])]), g.op('Add', [g.op('Tanh', [inner]), g.constFloat32([1], [])])]);
}

/** GELU with erf, HF's nn.GELU(): 0.5·x·(1 + erf(x/√2)). */
export function geluErf(g: GraphBuilder, x: string): string {
  const e = g.op('Erf', [g.op('Mul', [x, g.constFloat32([Math.SQRT1_2], [])])]);
  return g.op('Mul', [g.op('Mul', [x, g.constFloat32([0.5], [])]), g.op('Add', [e, g.constFloat32([1], [])])]);
}

/** silu(gate) · up, the gated half of a SwiGLU MLP (the projections are the caller's linear layers). */
export function swiGate(g: GraphBuilder, gate: string, up: string): string {
  return g.op('Mul', [silu(g, gate), up]);
}

/** A gated MLP's projection, as the checkpoint names it under `mlp.`. */
export type MlpProjection = 'gate_proj' | 'up_proj' | 'down_proj';

/**
 * A gated MLP, down(act(gate) · up), its ops named under the caller's scope as `mlp.gate_proj/…`,
 * `mlp.up_proj/…`, `mlp/…` (the activation and the product) and `mlp.down_proj/…`. A recipe
 * `rescale` rule for `<scope>/mlp` (forge bisect's fix when act(gate)·up leaves fp16's range on the
 * HTP, as a large up_proj makes it) stores up_proj's weight times s and down_proj's times 1/s: s is
 * a power of two, so this is the same function, with a product fp16 can hold and no op added.
 * `project(x, which, scale)` reads the projection's weight multiplied by `scale`.
 */
export async function gatedMlp(g: GraphBuilder, x: string, act: (g: GraphBuilder, x: string) => string, project: (x: string, which: MlpProjection, scale: number) => Promise<string>): Promise<string> {
  const s = g.rescaleFor(`${g.scope}/mlp`) ?? 1;
  const gate = await g.scoped('mlp.gate_proj', () => project(x, 'gate_proj', 1));
  const up = await g.scoped('mlp.up_proj', () => project(x, 'up_proj', s));
  const product = await g.scoped('mlp', async () => g.op('Mul', [act(g, gate), up]));
  return g.scoped('mlp.down_proj', () => project(product, 'down_proj', 1 / s));
}

/** The gated MLP's intermediate (gatedMlp): up_proj divided, down_proj multiplied back. */
export const MLP_RESCALE: RescalePair = {
  pair: 'up_proj with down_proj', values: "act(gate)·up (down_proj's input)", scope: 'mlp', grows: ['mlp', 'mlp.up_proj'], reads: 'mlp.down_proj', ops: ['mlp', 'mlp.gate_proj', 'mlp.up_proj', 'mlp.down_proj'],
  what: (k) => `up_proj ÷ 2^${k}, down_proj × 2^${k}`,
};

/**
 * Attention's values: v_proj divided, o_proj multiplied back (attention is linear in V). Only where no
 * norm follows v_proj (Gemma-4's v_norm would undo it) and nothing but attention reads V; the KV
 * cache then holds the divided values, which the layer's graph declares (valueScale).
 */
export const VALUES_RESCALE: RescalePair = {
  pair: 'v_proj with o_proj', values: "V (v_proj's output, which the KV cache holds)", scope: 'self_attn.v_proj', grows: ['self_attn.v_proj'], reads: 'self_attn.o_proj', ops: ['self_attn.v_proj', 'self_attn.o_proj'],
  what: (k) => `v_proj ÷ 2^${k}, o_proj × 2^${k}; the KV cache holds the values ÷ 2^${k}`,
};

/**
 * The factor a recipe `rescale` rule sets on this layer's values (VALUES_RESCALE; 1 without one), the
 * layer's past and new V declared as holding it (GraphEntry.stateScales). v_proj's weight (and bias)
 * are read times it, o_proj's times its inverse.
 */
export function valueScale(g: GraphBuilder, pastV: string, newV: string): number {
  const s = g.rescaleFor(`${g.scope}/${VALUES_RESCALE.scope}`) ?? 1;
  g.scaleState(pastV, s);
  g.scaleState(newV, s);
  return s;
}

/** Additive mask value for hidden slots: finite in fp16 so the HTP never sees -inf − -inf. */
export const MASKED = -65504;

/**
 * The mask a runtime builds for a call: N tokens at positions start..start+N-1, of which `valid`
 * are real (the rest is padding of a short prefill chunk). Slot j < start of the cache is visible;
 * new token k is visible to token r when k ≤ r and k is real.
 */
export function attentionMask(ctx: number, n: number, start: number, valid = n): Float32Array {
  const m = new Float32Array(n * (ctx + n)).fill(MASKED);
  for (let r = 0; r < n; r++) {
    for (let j = 0; j < start; j++) m[r * (ctx + n) + j] = 0;
    for (let k = 0; k <= r && k < valid; k++) m[r * (ctx + n) + ctx + k] = 0;
  }
  return m;
}

// ---- blocks for hybrid linear-attention decoders (Qwen3.5 GatedDeltaNet) ---------------------

/**
 * Partial rotary: rotate_half RoPE over the first `rotDim` dims of the last axis (pairs i, i+rotDim/2
 * inside the rotated part), the remaining headDim-rotDim dims pass through. cs rows are [.., rotDim].
 */
export function applyPartialRope(g: GraphBuilder, x: string, cs: { cos: string; sin: string }, rotDim: number, headDim: number): string {
  if (rotDim === headDim) return applyRope(g, x, cs);
  const [rot, pass] = g.op('Split', [x, g.constInt64([rotDim, headDim - rotDim])], { axis: -1 }, 2);
  return g.op('Concat', [applyRope(g, rot, cs), pass], { axis: -1 });
}

/** x·rsqrt(Σx² + eps) over the last axis (the FLA/HF `l2norm`). */
export function l2Norm(g: GraphBuilder, x: string, eps: number): string {
  const sum = g.op('ReduceSum', [g.op('Mul', [x, x]), g.constInt64([-1])], { keepdims: 1 });
  return g.op('Mul', [x, g.op('Reciprocal', [g.op('Sqrt', [g.op('Add', [sum, g.constFloat32([eps], [])])])])]);
}

/** x·sigmoid(x). */
export function silu(g: GraphBuilder, x: string): string {
  return g.op('Mul', [x, g.op('Sigmoid', [x])]);
}

/** log(1+eˣ) in the overflow-free form max(x,0) + log(1+e^-|x|) (no Softplus op needed). */
export function softplus(g: GraphBuilder, x: string): string {
  const tail = g.op('Log', [g.op('Add', [g.op('Exp', [g.op('Neg', [g.op('Abs', [x])])]), g.constFloat32([1], [])])]);
  return g.op('Add', [g.op('Relu', [x]), tail]);
}

/** Gated RMSNorm over the last axis with a plain weight: w·x·rsqrt(mean(x²)+eps)·silu(z). */
export function gatedRmsNorm(g: GraphBuilder, x: string, z: string, w: string, eps: number): string {
  return g.op('Mul', [rmsNorm(g, x, w, eps), silu(g, z)]);
}

/**
 * One step of a causal depthwise conv over a FIFO (HF `causal_conv1d_update` layout): state
 * [1, C, K] holds the last K inputs, oldest first; x [1, C, 1] is the new input; w [1, C, K] the taps
 * (conv1d.weight [C, 1, K] reshaped). Returns the next state (drop the oldest column, append x) and
 * the conv output Σ_j w[c, j]·next[c, j] as [1, C] (no activation).
 */
export function causalConvStep(g: GraphBuilder, state: string, x: string, w: string, kernel: number): { next: string; out: string } {
  const kept = g.op('Slice', [state, g.constInt64([1]), g.constInt64([kernel]), g.constInt64([2])]);
  const next = kernel > 1 ? g.op('Concat', [kept, x], { axis: 2 }) : x;
  const out = g.op('ReduceSum', [g.op('Mul', [next, w]), g.constInt64([-1])], { keepdims: 0 });
  return { next, out };
}

/**
 * One token of the gated delta rule in float32. q, k [1, Hv, 1, dk] (already l2-normalised, q
 * scaled, key heads repeated to the value heads), v [1, Hv, 1, dv], beta and decay (= exp(g))
 * [1, Hv, 1, 1], state S [1, Hv, dk, dv]. S ← S·decay; u = kᵀS; δ = (v − u)·β; S ← S + k⊗δ;
 * o = qᵀS. Returns the next state and o [1, Hv, 1, dv].
 */
export function gatedDeltaStep(g: GraphBuilder, s: { q: string; k: string; v: string; beta: string; decay: string; state: string }): { next: string; out: string } {
  const decayed = g.op('Mul', [s.state, s.decay]);
  const u = g.op('MatMul', [s.k, decayed]); // [1, Hv, 1, dv]
  const delta = g.op('Mul', [g.op('Sub', [s.v, u]), s.beta]);
  const kCol = g.op('Transpose', [s.k], { perm: [0, 1, 3, 2] }); // [1, Hv, dk, 1]
  const next = g.op('Add', [decayed, g.op('Mul', [kCol, delta])]);
  const out = g.op('MatMul', [s.q, next]);
  return { next, out };
}
