import { f16ToF32Array, f32ToF16Array } from '../io/dtype.js';
import { endianness } from 'node:os';

/** Element types the forge exporters use. 16-bit ints are here for 16-bit QDQ activations. */
export type ElemType =
  | 'float32'
  | 'float16'
  | 'int8'
  | 'uint8'
  | 'int16'
  | 'uint16'
  | 'int32'
  | 'int64'
  | 'bool';

/**
 * A weight may also be bfloat16 (a checkpoint's bytes referenced in place, Cast to float in the
 * graph) or int4 (W4 codes under a blocked DequantizeLinear, the QAIRT converter's form): neither is
 * a value type anything computes in.
 */
export type WeightElemType = ElemType | 'bfloat16' | 'int4';

/** float16 is carried as its raw bits in a Uint16Array; bool as 0/1 bytes in a Uint8Array. */
export type TensorData =
  | Float32Array
  | Uint16Array
  | Int16Array
  | Int8Array
  | Uint8Array
  | Int32Array
  | BigInt64Array;

type ArrayCtor = { new (buf: ArrayBuffer, off: number, len: number): TensorData; BYTES_PER_ELEMENT: number; name: string };

interface ElemInfo {
  /** onnx.TensorProto.DataType */
  code: number;
  bytes: number;
  array: ArrayCtor;
}

export const ELEM: Readonly<Record<WeightElemType, ElemInfo>> = {
  float32: { code: 1, bytes: 4, array: Float32Array },
  uint8: { code: 2, bytes: 1, array: Uint8Array },
  int8: { code: 3, bytes: 1, array: Int8Array },
  uint16: { code: 4, bytes: 2, array: Uint16Array },
  int16: { code: 5, bytes: 2, array: Int16Array },
  int32: { code: 6, bytes: 4, array: Int32Array },
  int64: { code: 7, bytes: 8, array: BigInt64Array },
  bool: { code: 9, bytes: 1, array: Uint8Array },
  float16: { code: 10, bytes: 2, array: Uint16Array },
  // Only as checkpoint bytes referenced in place (Cast to float in the graph): nothing computes in it.
  bfloat16: { code: 16, bytes: 2, array: Uint16Array },
  // Packed two a byte, the first element in the low nibble (ONNX IR 10); a tensor of n takes ⌈n/2⌉ bytes.
  int4: { code: 22, bytes: 0.5, array: Uint8Array },
};

/** The bytes a tensor of `dims` takes (int4 packs two elements a byte, an odd count rounding up). */
export function tensorByteLength(dtype: WeightElemType, dims: readonly number[]): number {
  return Math.ceil(numElements(dims) * ELEM[dtype].bytes);
}

/** A graph value's element type (bfloat16 is refused: forge computes in none). */
export function elemTypeFromCode(code: number): ElemType {
  const t = weightElemTypeFromCode(code);
  if (t === 'bfloat16' || t === 'int4') throw new Error(`unsupported ONNX tensor data type ${code} (${t}) for a value`);
  return t;
}

/** An initializer's element type. */
export function weightElemTypeFromCode(code: number): WeightElemType {
  for (const [k, v] of Object.entries(ELEM)) if (v.code === code) return k as WeightElemType;
  throw new Error(`unsupported ONNX tensor data type ${code}`);
}

/** The dtype a typed array means when none is given (Uint16Array → float16, the common case). */
export function defaultElemType(data: TensorData): ElemType {
  if (data instanceof Float32Array) return 'float32';
  if (data instanceof Uint16Array) return 'float16';
  if (data instanceof Int16Array) return 'int16';
  if (data instanceof Int8Array) return 'int8';
  if (data instanceof Uint8Array) return 'uint8';
  if (data instanceof Int32Array) return 'int32';
  if (data instanceof BigInt64Array) return 'int64';
  throw new Error('unsupported typed array');
}

export function numElements(dims: readonly number[]): number {
  let n = 1;
  for (const d of dims) {
    if (!Number.isInteger(d) || d < 0) throw new Error(`bad tensor dim ${d} in [${dims.join(',')}]`);
    n *= d;
  }
  return n;
}

/** Raw little-endian bytes of `data` as ONNX raw_data expects; throws on a dtype/array/shape mismatch. */
export function tensorBytes(data: TensorData, dims: readonly number[], dtype: WeightElemType, what: string): Uint8Array {
  if (endianness() !== 'LE') throw new Error('ONNX raw_data is little-endian; big-endian hosts unsupported');
  const info = ELEM[dtype];
  if (!(data instanceof info.array) || (data instanceof Uint8Array) !== (info.array === Uint8Array)) {
    throw new Error(`${what}: ${dtype} needs a ${info.array.name}, got ${data.constructor.name}`);
  }
  const n = dtype === 'int4' ? tensorByteLength(dtype, dims) : numElements(dims);
  if (data.length !== n) throw new Error(`${what}: dims [${dims.join(',')}] need ${n} ${dtype === 'int4' ? 'packed bytes' : 'elements'}, got ${data.length}`);
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

/** Typed view of raw bytes (copies when the bytes are not aligned for the element size). */
export function typedFromBytes(bytes: Uint8Array, dtype: WeightElemType): TensorData {
  if (dtype === 'int4') throw new Error('int4 is packed two a byte: no typed view; read its bytes');
  const info = ELEM[dtype];
  if (bytes.byteLength % info.bytes) throw new Error(`${bytes.byteLength} bytes is not a whole number of ${dtype}`);
  const b = bytes.byteOffset % info.bytes ? new Uint8Array(bytes) : bytes; // copy (Buffer.slice would not)
  return new info.array(b.buffer as ArrayBuffer, b.byteOffset, b.byteLength / info.bytes);
}

// Half-float conversion lives once, in io/dtype; these names are what graph code and tests use.
export { f32ToF16Bits as f32ToF16, f16BitsToF32 as f16ToF32 } from '../io/dtype.js';

export function toFloat16(a: ArrayLike<number>): Uint16Array {
  return f32ToF16Array(a instanceof Float32Array ? a : Float32Array.from(a));
}

export function fromFloat16(a: Uint16Array): Float32Array {
  return f16ToF32Array(a);
}
