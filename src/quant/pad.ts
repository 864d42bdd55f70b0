// Zero-padded in-features: the form a W8 or W4 matrix takes when MatMulNBits' block does not divide
// its in-features K. The weight gets zero columns up to K' (the next multiple of the block), and the
// graph pads its input x [1, N, K] → [1, N, K'] with zeros (Pad, constant 0) before MatMulNBits.
// Zero columns times zero inputs add nothing, so the numbers are the unpadded matrix's.
//
// Why this form (oracles/qnn_probe.py padded, onnxruntime-qnn 2.7.0 / QAIRT 2.51, soc_model 69 and
// 87 alike, 43 and 57 for the small linears; arch table [qnn-pad]): MatMulNBits on a K its block does not divide stays on the CPU ("K must be divisible by
// block_size"), while Pad(constant 0) → MatMulNBits compiles with no node left on the CPU, for bits 8
// and 4: a 64×120 and 64×150 linear (padded to 128 and 160), and a 2048×2040 one at 4,292,608 bytes
// (bits 8, padded to 2048; the fp16 Gemm 8,417,280) and 2,433,024 (bits 4), on the x86 HTP simulator
// at cosine 0.99999991–0.99999993 to x·dequant(W)ᵀ unpadded. Concat(x, zeros) compiles the same;
// Pad needs no zeros constant sized per graph's token count.

/** Multiples MatMulNBits' K must come in, per bits: W4's block (quant/w4.ts W4_BLOCK); W8's smallest block. */
export const K_MULTIPLE = { 4: 32, 8: 16 } as const;

/** K rounded up to a multiple of `multiple`. */
export function padTo(k: number, multiple: number): number {
  return Math.ceil(k / multiple) * multiple;
}

/** Rows `src` [n, cols] widened into `out` [n, k] with zero columns after each row's own; returns `out`. */
export function padColumns(src: Float32Array, cols: number, k: number, out: Float32Array): Float32Array {
  const n = src.length / cols;
  if (out.length !== n * k) throw new Error(`padColumns: ${out.length} output floats for ${n} rows of ${k}`);
  for (let r = 0; r < n; r++) {
    out.set(src.subarray(r * cols, (r + 1) * cols), r * k);
    out.fill(0, r * k + cols, (r + 1) * k);
  }
  return out;
}
