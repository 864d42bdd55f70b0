// The hand-made bundles' weights as bench/decode-bytes.ts counts them: the baseline forge's bytes
// per decode token are set beside (a library module so test/decode-bytes.test.ts can check it).
import type { TensorSpec } from '../src/families/types.js';

const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

/**
 * A W8 matrix as a hand-made W8A16 bundle stores it (the QAIRT QDQ form): int8 codes and one float32
 * scale per row, no padding; other tensors as storedBytes counts them. Fewer bytes than forge's
 * MatMulNBits form (a scale per block of at most 256): the conservative count of the baseline.
 */
export function qdqW8Bytes(t: TensorSpec): number {
  const rows = t.rows ? t.rows[1] - t.rows[0] : t.shape[0];
  const n = rows * (numel(t.shape) / t.shape[0]);
  if (t.role !== 'matmul') return n * 4;
  return n + rows * 4;
}
