// W8: per-output-channel symmetric int8 weights with one float32 scale per row (W8A16 on the HTP:
// weights int8, activations 16-bit/float). Rows are quantized independently, so a weight streams
// through in row chunks and is never whole in memory.

/** q = round(w / s) with s = max|w_row| / 127; an all-zero row gets s = 1 (DequantizeLinear needs s > 0). */
export function quantizeRows(rows: Float32Array, cols: number, q: Int8Array, scales: Float32Array): void {
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
      // Round half to even, like numpy/torch, so a reference quantizer in Python agrees exactly.
      const x = rows[base + c] / s;
      let v = Math.round(x);
      if (Math.abs(x % 1) === 0.5 && v % 2 !== 0) v -= 1;
      q[base + c] = v > 127 ? 127 : v < -127 ? -127 : v;
    }
  }
}

/** The float a W8 weight stands for: q·s. */
export function dequantizeRows(q: Int8Array, scales: Float32Array, cols: number): Float32Array {
  const out = new Float32Array(q.length);
  for (let i = 0; i < q.length; i++) out[i] = q[i] * scales[Math.floor(i / cols)];
  return out;
}
