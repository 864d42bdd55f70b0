// onnx-proto is CommonJS with `module.exports = $root`; Node's ESM loader cannot see the
// named export, so go through the default import. The alias carries both the values
// (onnx.ModelProto.encode) and the types (onnx.IModelProto).
import onnxProto from 'onnx-proto';

export import onnx = onnxProto.onnx;

/** int64 proto fields decode as Long (or number); everything we store fits in 2^53. */
export function toNumber(v: number | { toString(): string } | null | undefined): number {
  if (v == null) return 0;
  if (typeof v === 'number') return v;
  const n = Number(v.toString());
  if (!Number.isSafeInteger(n)) throw new Error(`int64 value ${v.toString()} exceeds 2^53`);
  return n;
}
