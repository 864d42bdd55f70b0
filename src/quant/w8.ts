// W8: per-output-channel symmetric int8 weights with one float32 scale per row (W8A16 on the HTP:
// weights int8, activations 16-bit/float). Rows are quantized independently, so a weight streams
// through in row chunks and is never whole in memory.
import { K_MULTIPLE, padTo } from './pad.js';
import type { MatrixPrecision } from './w4.js';

// Adding and subtracting 1.5·2^52 rounds a float64 to the nearest integer, ties to even (the FPU's
// default rounding) — exactly numpy/torch rounding, at a quarter of Math.round's cost plus a tie fix.
export const ROUND = 6755399441055744;

/**
 * q = round(w / s) with s = max|w_row| / 127, clamped to ±127, plus `zeroPoint` (128 gives the
 * unsigned codes MatMulNBits stores). An all-zero row gets s = 1 (DequantizeLinear needs s > 0).
 */
export function quantizeRows(rows: Float32Array, cols: number, q: Int8Array | Uint8Array, scales: Float32Array, zeroPoint = 0): void {
  const n = rows.length / cols;
  for (let r = 0; r < n; r++) {
    const base = r * cols;
    let max = 0;
    for (let c = 0; c < cols; c++) {
      const a = Math.abs(rows[base + c]);
      if (a > max) max = a;
    }
    const s = max > 0 ? Math.fround(max / 127) : 1;
    scales[r] = s;
    for (let c = 0; c < cols; c++) {
      let v = rows[base + c] / s + ROUND - ROUND;
      v = v > 127 ? 127 : v < -127 ? -127 : v;
      q[base + c] = v + zeroPoint;
    }
  }
}

/** The float a W8 weight stands for: q·s. */
export function dequantizeRows(q: Int8Array, scales: Float32Array, cols: number): Float32Array {
  const out = new Float32Array(q.length);
  for (let i = 0; i < q.length; i++) out[i] = q[i] * scales[Math.floor(i / cols)];
  return out;
}

/**
 * W8 takes every matrix: in its MatMulNBits form one whose in-features are not a multiple of 16 is
 * zero-padded to the next (quant/pad.ts); the QDQ form (per-row DequantizeLinear → Gemm) has no
 * block, so no constraint on K.
 */
export function w8Precision(k: number, form: 'matmulnbits' | 'qdq' = 'matmulnbits'): MatrixPrecision {
  if (form === 'qdq' || k % K_MULTIPLE[8] === 0) return { scheme: 'w8' };
  const paddedTo = padTo(k, K_MULTIPLE[8]);
  return { scheme: 'w8', paddedTo, why: `in-features ${k} zero-padded to ${paddedTo} (MatMulNBits blocks of 16 or more)` };
}

/** MatMulNBits splits K into blocks with one scale each; one block size per tensor: the largest power of two ≤ 256 dividing K. */
export function w8BlockSize(k: number, tensor: string): number {
  for (let b = 256; b >= 16; b /= 2) if (k % b === 0) return b;
  throw new Error(`tensor ${tensor}: in-features ${k} are not a multiple of 16, which MatMulNBits needs (w8Precision pads them)`);
}
