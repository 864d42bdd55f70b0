// Linear attention over N tokens per call (Qwen3.5's batched prefill): the causal conv over the
// prompt and the chunked gated delta rule, as static graph ops. The one-token forms are blocks.ts's
// causalConvStep and gatedDeltaStep; these give the same states and outputs for N tokens at once
// (HF's `torch_chunk_gated_delta_rule`), with the padding rows of a short last chunk left out of
// every state: a padding row has β = 0 and no decay, so it neither writes nor forgets.
import type { GraphBuilder } from '../onnx/builder.js';
import { MASKED } from './blocks.js';

/** Tokens per chunk inside one call: HF's 64, or the largest power of two dividing N below it. */
export function deltaChunk(n: number): number {
  let c = 1;
  while (c < 64 && n % (c * 2) === 0) c *= 2;
  return c;
}

/**
 * Which of the call's N rows are real, as float32 [1, 1, N, 1] (1 real, 0 padding), read from the
 * additive mask [1, 1, N, ctx + N]: a real row sees its own new token, a padding row does not.
 */
export function realRows(g: GraphBuilder, mask: string, ctx: number, n: number): string {
  const own = g.op('Slice', [mask, g.constInt64([ctx]), g.constInt64([ctx + n]), g.constInt64([3])]); // [1, 1, N, N]
  const diag = g.op('ReduceSum', [g.op('Mul', [own, triangle(g, n, (i, j) => i === j)]), g.constInt64([-1])], { keepdims: 1 });
  return g.op('Cast', [g.op('Greater', [diag, g.constFloat32([MASKED / 2], [])])], { to: 1 });
}

/**
 * The causal depthwise conv over N new inputs x [1, C, N] after the FIFO state [1, C, K] (oldest
 * first, as causalConvStep): output r is Σ_j w[c, j]·col[r + 1 + j] of [state | x], as [1, C, N];
 * the next state is the K columns ending at the last real input (`real` [1, 1, N, 1]).
 */
export function causalConvChunk(g: GraphBuilder, state: string, x: string, w: string, kernel: number, n: number, real: string): { next: string; out: string } {
  const all = g.op('Concat', [state, x], { axis: 2 }); // [1, C, K + N]
  const axis2 = g.constInt64([2]);
  let out = '';
  for (let j = 0; j < kernel; j++) {
    const cols = g.op('Slice', [all, g.constInt64([1 + j]), g.constInt64([1 + j + n]), axis2]);
    const tap = g.op('Slice', [w, g.constInt64([j]), g.constInt64([j + 1]), axis2]);
    const term = g.op('Mul', [cols, tap]);
    out = j ? g.op('Add', [out, term]) : term;
  }
  // Column j of [state | x] goes to slot i of the next state when j = realCount + i: a one-hot
  // selection matrix built from the count, so the short last chunk needs no dynamic slice.
  const offsets = new Float32Array((kernel + n) * kernel);
  for (let j = 0; j < kernel + n; j++) for (let i = 0; i < kernel; i++) offsets[j * kernel + i] = j - i;
  const count = g.op('Reshape', [g.op('ReduceSum', [real, g.constInt64([2])], { keepdims: 0 }), g.constInt64([1, 1])]);
  const dist = g.op('Abs', [g.op('Sub', [g.constFloat32(Array.from(offsets), [kernel + n, kernel]), count])]);
  const select = g.op('Relu', [g.op('Sub', [g.constFloat32([1], []), dist])]); // 1 where j − i = count, else 0
  return { next: g.op('MatMul', [all, select]), out };
}

/** A [c, c] matrix of ones where `keep(i, j)`. */
function triangle(g: GraphBuilder, c: number, keep: (i: number, j: number) => boolean): string {
  const m = new Float32Array(c * c);
  for (let i = 0; i < c; i++) for (let j = 0; j < c; j++) if (keep(i, j)) m[i * c + j] = 1;
  return g.constFloat32(Array.from(m), [c, c]);
}

/**
 * The gated delta rule over N tokens in chunks (float32). q, k [1, Hv, N, dk] (l2-normalised, q
 * scaled, key heads repeated to the value heads), v [1, Hv, N, dv], beta and logDecay (g, ≤ 0)
 * [1, Hv, N, 1] (both zero on padding rows), state S [1, Hv, dk, dv]. Per chunk of c tokens, with
 * γ_i = Σ_{j≤i} g_j and D_ij = exp(γ_i − γ_j) for j ≤ i (0 above):
 *   T = (I + strictly_lower(diag(β)K Kᵀ ⊙ D))⁻¹, as the product Π (I + M^(2^m)) with M = −strictly_lower(…)
 *   (M is nilpotent, so the series ends): no triangular solve, only matmuls;
 *   U = T·diag(β)V, W = T·diag(β e^γ)K, V' = U − W·S;
 *   O = diag(e^γ) Q·S + (Q Kᵀ ⊙ D)·V';  S ← e^{γ_last}·S + (diag(e^{γ_last − γ}) K)ᵀ V'.
 * Returns the output [1, Hv, N, dv] and the state after the last token.
 */
export function chunkedGatedDelta(g: GraphBuilder, s: { q: string; k: string; v: string; beta: string; logDecay: string; state: string }, n: number): { next: string; out: string } {
  const c = deltaChunk(n);
  const lowerIncl = triangle(g, c, (i, j) => j <= i);
  const strict = triangle(g, c, (i, j) => j < i);
  const eye = triangle(g, c, (i, j) => i === j);
  const axis2 = g.constInt64([2]);
  const rows = (x: string, from: number) => (c === n ? x : g.op('Slice', [x, g.constInt64([from]), g.constInt64([from + c]), axis2]));
  const t = (x: string) => g.op('Transpose', [x], { perm: [0, 1, 3, 2] });
  let state = s.state;
  const outs: string[] = [];
  for (let from = 0; from < n; from += c) {
    const [q, k, v, beta, gl] = [s.q, s.k, s.v, s.beta, s.logDecay].map((x) => rows(x, from));
    const cum = g.op('MatMul', [lowerIncl, gl]); // γ [1, Hv, c, 1]
    const decay = g.op('Mul', [g.op('Exp', [g.op('Min', [g.op('Sub', [cum, t(cum)]), g.constFloat32([0], [])])]), lowerIncl]); // D
    const kT = t(k);
    const kb = g.op('Mul', [k, beta]);
    const m = g.op('Neg', [g.op('Mul', [g.op('MatMul', [kb, kT]), g.op('Mul', [decay, strict])])]);
    // T = Σ_{p<c} M^p = (I + M)(I + M²)(I + M⁴)…
    let inv = g.op('Add', [eye, m]);
    let power = m;
    for (let span = 2; span < c; span *= 2) {
      power = g.op('MatMul', [power, power]);
      inv = g.op('MatMul', [inv, g.op('Add', [eye, power])]);
    }
    const eCum = g.op('Exp', [cum]);
    const u = g.op('MatMul', [inv, g.op('Mul', [v, beta])]);
    const w = g.op('MatMul', [inv, g.op('Mul', [kb, eCum])]);
    const vNew = g.op('Sub', [u, g.op('MatMul', [w, state])]); // [1, Hv, c, dv]
    const inter = g.op('MatMul', [g.op('Mul', [q, eCum]), state]);
    const intra = g.op('MatMul', [g.op('Mul', [g.op('MatMul', [q, kT]), decay]), vNew]);
    outs.push(g.op('Add', [inter, intra]));
    const last = g.op('Slice', [cum, g.constInt64([c - 1]), g.constInt64([c]), axis2]); // γ_last [1, Hv, 1, 1]
    const kTail = g.op('Mul', [k, g.op('Exp', [g.op('Sub', [last, cum])])]);
    state = g.op('Add', [g.op('Mul', [state, g.op('Exp', [last])]), g.op('MatMul', [t(kTail), vNew])]);
  }
  return { next: state, out: outs.length === 1 ? outs[0] : g.op('Concat', outs, { axis: 2 }) };
}
