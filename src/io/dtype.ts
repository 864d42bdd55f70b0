// Safetensors dtypes and bulk conversions between them.
//
// These loops run over whole checkpoints (8 GB and up), so they work on typed-array
// views of the raw bytes, move bit patterns as integers (Uint16/Uint32) rather than
// through float values where they can (which also keeps NaN payloads intact), and
// allocate nothing per element.

import { endianness } from 'node:os';

// Safetensors data is little-endian; typed arrays use host order. Every host we
// run on (x86-64, arm64) is little-endian; refuse loudly rather than corrupt.
if (endianness() !== 'LE') throw new Error('forge io: big-endian hosts are not supported');

/** Bytes per element of every dtype we can parse. (Sub-byte F4/F6 types are rejected as unknown.) */
export const DTYPE_BYTES = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  F8_E5M2: 1,
  F8_E4M3: 1,
  I16: 2,
  U16: 2,
  F16: 2,
  BF16: 2,
  I32: 4,
  U32: 4,
  F32: 4,
  F64: 8,
  I64: 8,
  U64: 8,
} as const;

export type DType = keyof typeof DTYPE_BYTES;

export const DTYPES = Object.keys(DTYPE_BYTES) as DType[];

export function isDType(value: unknown): value is DType {
  return typeof value === 'string' && Object.prototype.hasOwnProperty.call(DTYPE_BYTES, value);
}

type TypedArrayCtor<T> = {
  new (buffer: ArrayBufferLike, byteOffset: number, length: number): T;
  readonly BYTES_PER_ELEMENT: number;
};

/**
 * A typed-array view of `bytes` without copying when its offset is aligned; an
 * aligned copy otherwise (Buffers from Node's pool can sit at odd offsets).
 */
export function typedView<T>(bytes: Uint8Array, ctor: TypedArrayCtor<T>): T {
  const size = ctor.BYTES_PER_ELEMENT;
  if (bytes.byteLength % size !== 0) {
    throw new RangeError(`byte length ${bytes.byteLength} is not a multiple of element size ${size}`);
  }
  if (bytes.byteOffset % size === 0) return new ctor(bytes.buffer, bytes.byteOffset, bytes.byteLength / size);
  const copy = new Uint8Array(bytes.byteLength);
  copy.set(bytes);
  return new ctor(copy.buffer, 0, bytes.byteLength / size);
}

// ---------------------------------------------------------------- scalar bit helpers

const scratchF32 = new Float32Array(1);
const scratchU32 = new Uint32Array(scratchF32.buffer);

/** IEEE-754 single bit pattern (as unsigned) of `value` rounded to f32. */
export function f32Bits(value: number): number {
  scratchF32[0] = value;
  return scratchU32[0];
}

/** The f32 whose bit pattern is `bits`. */
export function f32FromBits(bits: number): number {
  scratchU32[0] = bits >>> 0;
  return scratchF32[0];
}

/**
 * f32 bit pattern → f16 bit pattern, round-to-nearest-even, including subnormal
 * results, overflow to ±inf (anything ≥ 65520), and NaN kept NaN (quiet bit set,
 * sign and top payload bits kept).
 */
export function f32BitsToF16Bits(x: number): number {
  const sign = (x >>> 16) & 0x8000;
  const a = x & 0x7fffffff;
  if (a >= 0x38800000 && a < 0x477ff000) {
    // Normal f16 (the common case, so first and branch-free): rebias the exponent
    // (127 → 15, i.e. subtract 0x38000000) and drop 13 mantissa bits, rounding by
    // adding 0xfff plus the kept lsb — round-to-nearest-even. A carry out of the
    // mantissa correctly bumps the exponent.
    return sign | ((a - 0x37fff001 + ((a >>> 13) & 1)) >>> 13);
  }
  if (a >= 0x477ff000) {
    // ≥ 65520 rounds past 65504 (odd mantissa, so the tie goes up) → inf; or inf/NaN.
    return a > 0x7f800000 ? sign | 0x7e00 | ((a >>> 13) & 0x3ff) : sign | 0x7c00;
  }
  // Below half the smallest subnormal (2^-25) → ±0; exactly 2^-25 ties to even, also 0.
  if (a < 0x33000000) return sign;
  // Subnormal f16: value = m16 · 2^-24, m16 = mantissa-with-implicit-1 >> (126 - e32).
  const shift = 126 - (a >>> 23);
  const m = (a & 0x7fffff) | 0x800000;
  const h = m >>> shift;
  const rem = m & ((1 << shift) - 1);
  const half = 1 << (shift - 1);
  return sign | (h + (rem > half || (rem === half && (h & 1) !== 0) ? 1 : 0));
}

/** f16 bit pattern → f32 bit pattern (exact: every f16 is an f32). */
export function f16BitsToF32Bits(h: number): number {
  const sign = (h & 0x8000) << 16;
  const e = (h >>> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0x1f) return (sign | 0x7f800000 | (m << 13)) >>> 0;
  if (e !== 0) return (sign | ((e + 112) << 23) | (m << 13)) >>> 0;
  if (m === 0) return sign >>> 0;
  // Subnormal: normalise the mantissa into an f32 normal.
  let exp = 113;
  let mant = m;
  while ((mant & 0x400) === 0) {
    mant <<= 1;
    exp--;
  }
  return (sign | (exp << 23) | ((mant & 0x3ff) << 13)) >>> 0;
}

/** f32 bit pattern → bf16 bit pattern, round-to-nearest-even; NaN stays NaN (quieted). */
export function f32BitsToBf16Bits(x: number): number {
  if ((x & 0x7fffffff) > 0x7f800000) return ((x >>> 16) | 0x40) & 0xffff;
  return ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
}

export function f32ToF16Bits(value: number): number {
  return f32BitsToF16Bits(f32Bits(value));
}

export function f16BitsToF32(bits: number): number {
  return f32FromBits(f16BitsToF32Bits(bits));
}

export function f32ToBf16Bits(value: number): number {
  return f32BitsToBf16Bits(f32Bits(value));
}

export function bf16BitsToF32(bits: number): number {
  return f32FromBits((bits & 0xffff) << 16);
}

// ---------------------------------------------------------------- lookup tables

// f16 → f32 bit patterns for all 65536 inputs (256 KiB), for the rare inputs
// (zero, subnormal, inf, NaN) that the arithmetic path does not handle. Built on first use.
let f16ToF32Table: Int32Array | undefined;
function f16Table(): Int32Array {
  if (f16ToF32Table) return f16ToF32Table;
  const t = new Int32Array(65536);
  for (let h = 0; h < 65536; h++) t[h] = f16BitsToF32Bits(h);
  return (f16ToF32Table = t);
}

// FP8 → f32 bit patterns. E5M2 is the top byte of an f16; E4M3 is the "FN"
// variant (bias 7, no infinities, S.1111.111 is NaN), as in torch.float8_e4m3fn.
let fp8Tables: { e5m2: Uint32Array; e4m3: Uint32Array } | undefined;
function fp8Table(dtype: 'F8_E5M2' | 'F8_E4M3'): Uint32Array {
  if (!fp8Tables) {
    const e5m2 = new Uint32Array(256);
    const e4m3 = new Uint32Array(256);
    for (let b = 0; b < 256; b++) {
      e5m2[b] = f16BitsToF32Bits(b << 8);
      const sign = b & 0x80 ? -1 : 1;
      const e = (b >>> 3) & 0xf;
      const m = b & 7;
      const value =
        e === 0xf && m === 7 ? NaN : e === 0 ? sign * m * 2 ** -9 : sign * (1 + m / 8) * 2 ** (e - 7);
      e4m3[b] = f32Bits(value);
    }
    fp8Tables = { e5m2, e4m3 };
  }
  return dtype === 'F8_E5M2' ? fp8Tables.e5m2 : fp8Tables.e4m3;
}

// ---------------------------------------------------------------- array conversions

function checkDst(dstLength: number, srcLength: number): void {
  if (dstLength !== srcLength) throw new RangeError(`destination length ${dstLength} ≠ source length ${srcLength}`);
}

// Output is written through Int32Array views: V8 stores int32 results (which is
// what << and | produce) into them without a uint32 conversion.

/** bf16 bits → f32 (exact: bf16 is the top half of an f32). */
export function bf16ToF32Array(src: Uint16Array, dst: Float32Array = new Float32Array(src.length)): Float32Array {
  checkDst(dst.length, src.length);
  const out = new Int32Array(dst.buffer, dst.byteOffset, dst.length);
  const n = src.length;
  let i = 0;
  if (src.byteOffset % 4 === 0) {
    // Two elements per 32-bit load: about twice as fast as one at a time.
    const pairs = new Int32Array(src.buffer, src.byteOffset, n >>> 1);
    const m = pairs.length;
    for (let p = 0; p < m; p++) {
      const w = pairs[p];
      out[2 * p] = w << 16;
      out[2 * p + 1] = w & -65536;
    }
    i = 2 * m;
  }
  for (; i < n; i++) out[i] = src[i] << 16;
  return dst;
}

/** f16 bits → f32 (exact). */
export function f16ToF32Array(src: Uint16Array, dst: Float32Array = new Float32Array(src.length)): Float32Array {
  checkDst(dst.length, src.length);
  const table = f16Table();
  const out = new Int32Array(dst.buffer, dst.byteOffset, dst.length);
  const n = src.length;
  for (let i = 0; i < n; i++) {
    const h = src[i];
    const e = h & 0x7c00;
    // Normals by arithmetic (rebias 15 → 127: add 112 << 10, shift into place);
    // zeros, subnormals, inf and NaN from the table.
    out[i] = e !== 0 && e !== 0x7c00 ? ((h & 0x8000) << 16) | (((h & 0x7fff) + 0x1c000) << 13) : table[h];
  }
  return dst;
}

// The 16-bit outputs below are stored two per 32-bit write when dst is 4-byte
// aligned (about 20% faster); an odd tail or unaligned dst goes one at a time.

/** f32 → f16 bits, round-to-nearest-even. */
export function f32ToF16Array(src: Float32Array, dst: Uint16Array = new Uint16Array(src.length)): Uint16Array {
  checkDst(dst.length, src.length);
  const bits = new Int32Array(src.buffer, src.byteOffset, src.length);
  const n = src.length;
  let i = 0;
  if (dst.byteOffset % 4 === 0) {
    const out = new Int32Array(dst.buffer, dst.byteOffset, n >>> 1);
    const m = out.length;
    for (let p = 0; p < m; p++) out[p] = f32BitsToF16Bits(bits[2 * p]) | (f32BitsToF16Bits(bits[2 * p + 1]) << 16);
    i = 2 * m;
  }
  for (; i < n; i++) dst[i] = f32BitsToF16Bits(bits[i]);
  return dst;
}

/** f32 → bf16 bits, round-to-nearest-even. */
export function f32ToBf16Array(src: Float32Array, dst: Uint16Array = new Uint16Array(src.length)): Uint16Array {
  checkDst(dst.length, src.length);
  const bits = new Int32Array(src.buffer, src.byteOffset, src.length);
  const n = src.length;
  let i = 0;
  if (dst.byteOffset % 4 === 0) {
    const out = new Int32Array(dst.buffer, dst.byteOffset, n >>> 1);
    const m = out.length;
    for (let p = 0; p < m; p++) out[p] = f32BitsToBf16Bits(bits[2 * p]) | (f32BitsToBf16Bits(bits[2 * p + 1]) << 16);
    i = 2 * m;
  }
  for (; i < n; i++) dst[i] = f32BitsToBf16Bits(bits[i]);
  return dst;
}

/** bf16 bits → f16 bits in one pass (bf16 → f32 is exact, so this rounds once). */
export function bf16ToF16Array(src: Uint16Array, dst: Uint16Array = new Uint16Array(src.length)): Uint16Array {
  checkDst(dst.length, src.length);
  const n = src.length;
  let i = 0;
  if (src.byteOffset % 4 === 0 && dst.byteOffset % 4 === 0) {
    const pairs = new Int32Array(src.buffer, src.byteOffset, n >>> 1);
    const out = new Int32Array(dst.buffer, dst.byteOffset, n >>> 1);
    const m = out.length;
    for (let p = 0; p < m; p++) {
      const w = pairs[p];
      out[p] = f32BitsToF16Bits(w << 16) | (f32BitsToF16Bits(w & -65536) << 16);
    }
    i = 2 * m;
  }
  for (; i < n; i++) dst[i] = f32BitsToF16Bits(src[i] << 16);
  return dst;
}

// Plain numeric widening, for the integer and f64 dtypes.
type NumericArray = { readonly length: number; [i: number]: number };
function widenToF32(src: NumericArray, dst: Float32Array): Float32Array {
  checkDst(dst.length, src.length);
  const n = src.length;
  for (let i = 0; i < n; i++) dst[i] = src[i];
  return dst;
}

// 64-bit integers as (lo, hi) 32-bit halves: no BigInt per element. Exact below
// 2^53; above that the f64 intermediate may round before the f32 rounding.
function int64ToF32(bytes: Uint8Array, dst: Float32Array, signed: boolean): Float32Array {
  const halves = typedView(bytes, Int32Array);
  checkDst(dst.length, halves.length / 2);
  const n = dst.length;
  for (let i = 0; i < n; i++) {
    const lo = halves[2 * i] >>> 0;
    const hi = signed ? halves[2 * i + 1] : halves[2 * i + 1] >>> 0;
    dst[i] = hi * 4294967296 + lo;
  }
  return dst;
}

function lookupToF32(bytes: Uint8Array, table: Uint32Array, dst: Float32Array): Float32Array {
  checkDst(dst.length, bytes.length);
  const out = new Uint32Array(dst.buffer, dst.byteOffset, dst.length);
  const n = bytes.length;
  for (let i = 0; i < n; i++) out[i] = table[bytes[i]];
  return dst;
}

/** Number of elements that `byteLength` bytes of `dtype` hold (throws if not whole). */
function elementCount(dtype: DType, byteLength: number): number {
  const size = DTYPE_BYTES[dtype];
  if (byteLength % size !== 0) throw new RangeError(`${byteLength} bytes is not a whole number of ${dtype} elements`);
  return byteLength / size;
}

/**
 * Raw little-endian bytes of `dtype` → f32. With no `dst` and dtype F32 this may
 * return a view sharing memory with `bytes`.
 */
export function toFloat32(dtype: DType, bytes: Uint8Array, dst?: Float32Array): Float32Array {
  const out = dst ?? (dtype === 'F32' ? undefined : new Float32Array(elementCount(dtype, bytes.byteLength)));
  switch (dtype) {
    case 'F32': {
      const view = typedView(bytes, Float32Array);
      if (!out) return view;
      checkDst(out.length, view.length);
      // Copy as integers so NaN payloads survive.
      new Uint32Array(out.buffer, out.byteOffset, out.length).set(new Uint32Array(view.buffer, view.byteOffset, view.length));
      return out;
    }
    case 'BF16':
      return bf16ToF32Array(typedView(bytes, Uint16Array), out);
    case 'F16':
      return f16ToF32Array(typedView(bytes, Uint16Array), out);
    case 'F64':
      return widenToF32(typedView(bytes, Float64Array), out!);
    case 'F8_E5M2':
    case 'F8_E4M3':
      return lookupToF32(bytes, fp8Table(dtype), out!);
    case 'BOOL': {
      checkDst(out!.length, bytes.length);
      for (let i = 0; i < bytes.length; i++) out![i] = bytes[i] !== 0 ? 1 : 0;
      return out!;
    }
    case 'U8':
      return widenToF32(bytes, out!);
    case 'I8':
      return widenToF32(new Int8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength), out!);
    case 'I16':
      return widenToF32(typedView(bytes, Int16Array), out!);
    case 'U16':
      return widenToF32(typedView(bytes, Uint16Array), out!);
    case 'I32':
      return widenToF32(typedView(bytes, Int32Array), out!);
    case 'U32':
      return widenToF32(typedView(bytes, Uint32Array), out!);
    case 'I64':
      return int64ToF32(bytes, out!, true);
    case 'U64':
      return int64ToF32(bytes, out!, false);
  }
}

/**
 * Raw little-endian bytes of `dtype` → f16 bits. With no `dst` and dtype F16 this
 * may return a view sharing memory with `bytes`.
 */
export function toFloat16Bits(dtype: DType, bytes: Uint8Array, dst?: Uint16Array): Uint16Array {
  switch (dtype) {
    case 'F16': {
      const view = typedView(bytes, Uint16Array);
      if (!dst) return view;
      checkDst(dst.length, view.length);
      dst.set(view);
      return dst;
    }
    case 'BF16':
      return bf16ToF16Array(typedView(bytes, Uint16Array), dst);
    case 'F32':
      return f32ToF16Array(typedView(bytes, Float32Array), dst);
    default:
      return f32ToF16Array(toFloat32(dtype, bytes), dst);
  }
}

/** Each value as a float16 hand-off leaves it: rounded to the nearest f16 (±Inf past 65504), widened back. */
export function roundToF16(x: Float32Array): Float32Array {
  const out = new Float32Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = f16BitsToF32(f32ToF16Bits(x[i]));
  return out;
}
