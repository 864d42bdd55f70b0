// Bytes a tensor occupies in a compiled context under a quant scheme. The plan uses this, so the
// form a scheme takes on the HTP (see quant/w8.ts) and its size are decided in one place.
import type { QuantScheme } from '../recipe/schema.js';
import type { TensorSpec } from '../families/types.js';
import { w8BlockSize, w8Precision } from './w8.js';
import { W4_BLOCK, w4Precision } from './w4.js';
import type { PrecisionChooser } from './precision.js';

const numel = (shape: number[]) => shape.reduce((a, b) => a * b, 1);

export function storedBytes(t: TensorSpec, scheme: QuantScheme): number {
  // A row range [first, end) of a matrix is stored alone: its rows only.
  const n = t.rows ? (t.rows[1] - t.rows[0]) * (numel(t.shape) / t.shape[0]) : numel(t.shape);
  if (t.role !== 'matmul') return n * 4; // norms, biases, conv taps: float32, tiny
  switch (scheme) {
    case 'fp32': return n * 4;
    case 'fp16': return n * 2;
    // int8 codes + one float32 scale per MatMulNBits block (each row's scale, repeated per block),
    // over the in-features as stored: zero-padded where 16 does not divide them (w8Precision). The
    // QDQ form (QAIRT) stores one scale a row and no padding: fewer bytes than counted here.
    case 'w8': {
      const k = w8Precision(t.shape[1]).paddedTo ?? t.shape[1];
      const rows = n / t.shape[1];
      return rows * k + rows * (k / w8BlockSize(k, t.name)) * 4;
    }
    // packed nibbles + one float32 scale per block, over the in-features as stored (w4Precision)
    case 'w4': {
      const k = w4Precision(t.shape[1]).paddedTo ?? t.shape[1];
      const rows = n / t.shape[1];
      return (rows * k) / 2 + ((rows * k) / W4_BLOCK) * 4;
    }
  }
}

/** The bytes of `ts` in `scheme`, each matmul weight in the precision `chooser` gives it (overrides, the auto map). */
export function sumBytes(ts: TensorSpec[], scheme: QuantScheme, chooser?: PrecisionChooser): number {
  return ts.reduce((s, t) => s + storedBytes(t, chooser && t.role === 'matmul' ? chooser.choose(t.name, scheme).scheme : scheme), 0);
}
