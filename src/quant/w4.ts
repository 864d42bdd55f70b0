// W4: symmetric int4 weights in blocks of W4_BLOCK along the in-features, one float32 scale per
// block, in com.microsoft MatMulNBits(bits=4)'s layout: codes 1..15 around its default zero point 8
// (−8 unused: symmetric), two codes a byte, low nibble first, blob [N, K/block, block/2]. The scale
// is float32 because MatMulNBits' scales have the type of its input A (float32 in forge's graphs).
//
// Why block 32: onnxruntime-qnn 2.7.0 (QAIRT 2.51) compiles MatMulNBits bits=4 with blocks 32, 64
// and 128 for soc_model 69 and 87 with no node left on the CPU (oracles/qnn_probe.py forms
// --only bits=4, one 2048×2048 linear: context binaries of 0.579, 0.547 and 0.531 bytes a weight);
// 32 is the finest of them, the one whose simulator output was checked against ORT CPU (cosine
// 0.99999988, REFERENCE.md), and the block onnxruntime-qnn's issue #288 names with 64.

import { ROUND } from './w8.js'; // + and − 1.5·2^52: round half to even
import { K_MULTIPLE, padTo } from './pad.js';

/** Weights per block along the in-features. */
export const W4_BLOCK = 32;


/**
 * Quantizes `rows` [n, cols] (cols a multiple of `block`) into packed codes [n, cols/block, block/2]
 * and scales [n · cols/block]: per block s = fround(max|w| / 7), q = round-half-even(w / s) clamped
 * to ±7, stored as q + 8. An all-zero block gets s = 1 (codes 8): a zero scale would be a division
 * by zero in a converter that turns scales into encodings.
 */
export function quantizeW4Rows(rows: Float32Array, cols: number, packed: Uint8Array, scales: Float32Array, block = W4_BLOCK): void {
  if (cols % block !== 0 || block % 2 !== 0) throw new Error(`W4: ${cols} in-features are not a multiple of the block ${block}`);
  const blocks = rows.length / block;
  for (let b = 0; b < blocks; b++) {
    const base = b * block;
    let max = 0;
    for (let c = 0; c < block; c++) {
      const a = Math.abs(rows[base + c]);
      if (a > max) max = a;
    }
    const s = max > 0 ? Math.fround(max / 7) : 1;
    scales[b] = s;
    const out = base / 2;
    for (let c = 0; c < block; c += 2) {
      packed[out + c / 2] = code(rows[base + c] / s) | (code(rows[base + c + 1] / s) << 4);
    }
  }
}

function code(x: number): number {
  let v = x + ROUND - ROUND;
  v = v > 7 ? 7 : v < -7 ? -7 : v;
  return v + 8;
}

/** The floats W4 codes stand for: (q − 8)·s, [n, cols] from packed [n, cols/block, block/2]. */
export function dequantizeW4Rows(packed: Uint8Array, scales: Float32Array, block = W4_BLOCK): Float32Array {
  const out = new Float32Array(packed.length * 2);
  for (let i = 0; i < out.length; i++) {
    const byte = packed[i >> 1];
    const q = i & 1 ? byte >> 4 : byte & 15;
    out[i] = (q - 8) * scales[Math.floor(i / block)];
  }
  return out;
}

/** The precision a matrix gets under a scheme, and why it is not the scheme's own form (a fallback, a padding). */
export interface MatrixPrecision {
  scheme: 'fp32' | 'fp16' | 'w8' | 'w4';
  why?: string;
  /** The in-features the weight is stored with, zero-padded (quant/pad.ts); absent when unpadded. */
  paddedTo?: number;
}

/**
 * W4 takes every matrix, never refusing the model: one whose in-features are not a multiple of the
 * block is zero-padded to the next (quant/pad.ts: compiles whole on the HTP), which costs no more
 * bytes than W8 for any K and keeps the scheme asked for.
 */
export function w4Precision(k: number): MatrixPrecision {
  if (k % W4_BLOCK === 0) return { scheme: 'w4' };
  const paddedTo = padTo(k, K_MULTIPLE[4]);
  return { scheme: 'w4', paddedTo, why: `in-features ${k} zero-padded to ${paddedTo} (the W4 block ${W4_BLOCK})` };
}
