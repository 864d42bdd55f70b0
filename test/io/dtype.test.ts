import { describe, expect, it } from 'vitest';
import {
  bf16BitsToF32,
  bf16ToF16Array,
  bf16ToF32Array,
  f16BitsToF32,
  f16BitsToF32Bits,
  f16ToF32Array,
  f32Bits,
  f32FromBits,
  f32ToBf16Array,
  f32ToBf16Bits,
  f32ToF16Array,
  f32ToF16Bits,
  toFloat16Bits,
  toFloat32,
  typedView,
} from '../../src/io/dtype.js';

const isF16NaN = (h: number) => (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0;
const isBf16NaN = (h: number) => (h & 0x7f80) === 0x7f80 && (h & 0x7f) !== 0;

// Independent decoders, by the textbook formula rather than bit surgery.
function f16Value(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0x1f) return m ? NaN : sign * Infinity;
  return e === 0 ? sign * m * 2 ** -24 : sign * (1 + m / 1024) * 2 ** (e - 15);
}
function bf16Value(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 7) & 0xff;
  const m = h & 0x7f;
  if (e === 0xff) return m ? NaN : sign * Infinity;
  return e === 0 ? sign * m * 2 ** -133 : sign * (1 + m / 128) * 2 ** (e - 127);
}

/**
 * Reference rounding by search: the nearest representable magnitude, ties to the
 * even bit pattern; one step past the largest finite pattern is infinity.
 * Positive patterns of both formats are monotonic in value, which the search uses.
 */
function referenceRound(v: number, value: (h: number) => number, maxFinite: number, infinityMagnitude: number): number {
  const sign = v < 0 || Object.is(v, -0) ? 0x8000 : 0;
  const a = Math.abs(v);
  if (a >= infinityMagnitude) return sign | (maxFinite + 1);
  let lo = 0;
  let hi = maxFinite;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (value(mid) <= a) lo = mid;
    else hi = mid - 1;
  }
  if (value(lo) === a) return sign | lo;
  const above = lo === maxFinite ? infinityMagnitude : value(lo + 1);
  const below = a - value(lo);
  const up = above - a;
  if (below < up) return sign | lo;
  if (up < below) return sign | (lo + 1);
  return sign | (lo % 2 === 0 ? lo : lo + 1);
}
const refF16 = (v: number) => referenceRound(v, f16Value, 0x7bff, 65536);
const refBf16 = (v: number) => referenceRound(v, bf16Value, 0x7f7f, 2 ** 128);

/** f32 inputs that stress rounding: every tie between neighbours, and one f32 ulp either side. */
function tiesAndNeighbours(value: (h: number) => number, maxFinite: number): number[] {
  const out: number[] = [];
  for (let h = 0; h < maxFinite; h += h < 2048 ? 1 : 7) {
    const mid = (value(h) + value(h + 1)) / 2;
    const bits = f32Bits(mid);
    out.push(mid, -mid, f32FromBits(bits - 1), f32FromBits(bits + 1));
  }
  return out;
}

function randomF32s(count: number, seed: number): Float32Array {
  const bits = new Uint32Array(count);
  let s = seed >>> 0;
  for (let i = 0; i < count; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    bits[i] = s >>> 0;
  }
  return new Float32Array(bits.buffer);
}

describe('f16 bit patterns', () => {
  it.each([
    [1.0, 0x3c00],
    [-2.5, 0xc100],
    [65504, 0x7bff],
    [2 ** -24, 0x0001], // smallest subnormal
    [1023 * 2 ** -24, 0x03ff], // largest subnormal
    [2 ** -14, 0x0400], // smallest normal
    [0, 0x0000],
    [-0, 0x8000],
    [Infinity, 0x7c00],
    [-Infinity, 0xfc00],
  ])('%d ↔ bits %i exactly', (value, bits) => {
    expect(f32ToF16Bits(value)).toBe(bits);
    expect(Object.is(f16BitsToF32(bits), value)).toBe(true);
  });

  it.each([
    ['65519 stays finite', 65519, 0x7bff],
    ['65520 (tie with odd 65504) overflows to inf', 65520, 0x7c00],
    ['1e30 overflows to inf', 1e30, 0x7c00],
    ['-65520 overflows to -inf', -65520, 0xfc00],
    ['2^-25 ties down to even zero', 2 ** -25, 0x0000],
    ['just over 2^-25 rounds up to the smallest subnormal', f32FromBits(f32Bits(2 ** -25) + 1), 0x0001],
    ['3·2^-25 ties up to even subnormal 2', 3 * 2 ** -25, 0x0002],
    ['1e-8 underflows to zero', 1e-8, 0x0000],
    ['1 + 2^-11 ties down to 1', 1 + 2 ** -11, 0x3c00],
    ['1 + 3·2^-11 ties up to 1 + 2^-9', 1 + 3 * 2 ** -11, 0x3c02],
    ['2049 ties down to 2048', 2049, 0x6800],
    ['2051 ties up to 2052', 2051, 0x6802],
    ['subnormal tie carrying into the smallest normal', (1023.5 * 2 ** -24), 0x0400],
  ])('rounds to nearest even: %s', (_label, value, bits) => {
    expect(f32ToF16Bits(value)).toBe(bits);
  });

  it('keeps NaN a NaN, quiet, with its sign', () => {
    expect(f32ToF16Bits(NaN)).toBe(0x7e00);
    expect(f32ToF16Bits(f32FromBits(0xffc00000))).toBe(0xfe00);
    expect(isF16NaN(f32ToF16Bits(f32FromBits(0x7f800001)))).toBe(true); // signalling, low payload
    expect(Number.isNaN(f16BitsToF32(0x7c01))).toBe(true);
  });

  it('decodes all 65536 patterns exactly, and re-encodes them to themselves', () => {
    const all = new Uint16Array(65536).map((_, i) => i);
    const decoded = f16ToF32Array(all);
    const encoded = f32ToF16Array(decoded);
    const decodedBits = new Uint32Array(decoded.buffer);
    const wrong: number[] = [];
    for (let h = 0; h < 65536; h++) {
      // A NaN keeps its sign and payload when widened (the payload moves up 13 bits).
      const nanBits = (((h & 0x8000) << 16) | 0x7f800000 | ((h & 0x3ff) << 13)) >>> 0;
      const ok = isF16NaN(h)
        ? decodedBits[h] === nanBits && isF16NaN(encoded[h])
        : Object.is(decoded[h], f16Value(h)) && encoded[h] === h;
      if (!ok) wrong.push(h);
    }
    expect(wrong).toEqual([]);
  });

  it('matches reference nearest-even rounding on ties, their neighbours, and random f32s', () => {
    const inputs = Float32Array.from([...tiesAndNeighbours(f16Value, 0x7bff), ...randomF32s(200_000, 7)]);
    const got = f32ToF16Array(inputs);
    const wrong: string[] = [];
    for (let i = 0; i < inputs.length; i++) {
      const ok = Number.isNaN(inputs[i]) ? isF16NaN(got[i]) : got[i] === refF16(inputs[i]);
      if (!ok) wrong.push(`f32 ${inputs[i]} → 0x${got[i].toString(16)}, want 0x${refF16(inputs[i]).toString(16)}`);
    }
    expect(wrong.slice(0, 10)).toEqual([]);
  });
});

describe('bf16 bit patterns', () => {
  it.each([
    [1.0, 0x3f80],
    [-2.5, 0xc020],
    [65504, 0x4780], // not representable in bf16: 65536 after rounding
    [2 ** -133, 0x0001], // smallest bf16 subnormal
    [Infinity, 0x7f80],
    [-Infinity, 0xff80],
    [-0, 0x8000],
  ])('%d → bits %i', (value, bits) => {
    expect(f32ToBf16Bits(value)).toBe(bits);
  });

  it('decodes by taking the top half of an f32', () => {
    expect(bf16BitsToF32(0x3f80)).toBe(1);
    expect(bf16BitsToF32(0xc020)).toBe(-2.5);
    expect(bf16BitsToF32(0x7f80)).toBe(Infinity);
    expect(Number.isNaN(bf16BitsToF32(0x7fc0))).toBe(true);
    const all = new Uint16Array(65536).map((_, i) => i);
    const decoded = bf16ToF32Array(all);
    const wrong = [...all].filter((h) => (isBf16NaN(h) ? !Number.isNaN(decoded[h]) : !Object.is(decoded[h], bf16Value(h))));
    expect(wrong).toEqual([]);
    expect(f32ToBf16Array(decoded).every((b, h) => (isBf16NaN(h) ? isBf16NaN(b) : b === h))).toBe(true);
  });

  it('rounds ties to even and keeps NaN a NaN', () => {
    expect(f32ToBf16Bits(f32FromBits(0x3f808000))).toBe(0x3f80); // tie, even below
    expect(f32ToBf16Bits(f32FromBits(0x3f818000))).toBe(0x3f82); // tie, even above
    expect(f32ToBf16Bits(f32FromBits(0x3f808001))).toBe(0x3f81);
    expect(f32ToBf16Bits(f32FromBits(0x7f7fffff))).toBe(0x7f80); // f32 max overflows to inf
    expect(isBf16NaN(f32ToBf16Bits(f32FromBits(0x7f800001)))).toBe(true); // payload only in low bits
    const inputs = Float32Array.from([...tiesAndNeighbours(bf16Value, 0x7f7f), ...randomF32s(100_000, 11)]);
    const got = f32ToBf16Array(inputs);
    const wrong: string[] = [];
    for (let i = 0; i < inputs.length; i++) {
      const ok = Number.isNaN(inputs[i]) ? isBf16NaN(got[i]) : got[i] === refBf16(inputs[i]);
      if (!ok) wrong.push(`f32 ${inputs[i]} → 0x${got[i].toString(16)}, want 0x${refBf16(inputs[i]).toString(16)}`);
    }
    expect(wrong.slice(0, 10)).toEqual([]);
  });

  it('bf16 → f16 directly equals bf16 → f32 → f16', () => {
    const all = new Uint16Array(65536).map((_, i) => i);
    const direct = bf16ToF16Array(all);
    const viaF32 = f32ToF16Array(bf16ToF32Array(all));
    expect(Buffer.from(direct.buffer).equals(Buffer.from(viaF32.buffer))).toBe(true);
  });
});

describe('array conversions at any offset and length', () => {
  // The bulk loops take two elements per 32-bit access when aligned; odd lengths and
  // odd offsets take the one-at-a-time path. Both must agree with the scalar functions.
  const values = Float32Array.from(randomF32s(41, 3)).map((v, i) => (i % 3 === 0 ? v : (i - 20) * 0.37));
  const halves = Uint16Array.from(values, (_, i) => (i * 2654435761) >>> 16);

  it.each([
    [0, 41],
    [1, 40],
    [1, 39],
    [2, 38],
    [3, 0],
  ])('offset %i, length %i', (offset, length) => {
    const f32 = values.subarray(offset, offset + length);
    const u16 = halves.subarray(offset, offset + length); // odd offset → 2-byte aligned only
    const dst16 = new Uint16Array(length + 1).subarray(1); // misaligned destination
    const same = (a: ArrayLike<number>, b: ArrayLike<number>) => expect(Array.from(a)).toEqual(Array.from(b));
    same(f32ToF16Array(f32), Array.from(f32, f32ToF16Bits));
    same(f32ToF16Array(f32, dst16), Array.from(f32, f32ToF16Bits));
    same(f32ToBf16Array(f32), Array.from(f32, f32ToBf16Bits));
    same(f32ToBf16Array(f32, dst16), Array.from(f32, f32ToBf16Bits));
    same(bf16ToF16Array(u16), Array.from(u16, (h) => f32ToF16Bits(bf16BitsToF32(h))));
    same(bf16ToF16Array(u16, dst16), Array.from(u16, (h) => f32ToF16Bits(bf16BitsToF32(h))));
    const bits = (a: Float32Array) => Array.from(new Uint32Array(a.buffer, a.byteOffset, a.length));
    // Compared as bit patterns: the arrays keep NaN payloads (even signalling ones)
    // that a round trip through a JS number may quiet.
    expect(bits(bf16ToF32Array(u16))).toEqual(Array.from(u16, (h) => (h << 16) >>> 0));
    expect(bits(f16ToF32Array(u16))).toEqual(Array.from(u16, f16BitsToF32Bits));
  });
});

describe('raw bytes of each dtype → f32 / f16', () => {
  const bytesOf = (view: ArrayBufferView) => new Uint8Array(view.buffer, view.byteOffset, view.byteLength);

  it.each([
    ['F32', bytesOf(new Float32Array([1.5, -2, 1e-40])), [1.5, -2, Math.fround(1e-40)]],
    ['F64', bytesOf(new Float64Array([1.5, -1e300, 2 ** -30])), [1.5, -Infinity, 2 ** -30]],
    ['BF16', bytesOf(new Uint16Array([0x3f80, 0xc020])), [1, -2.5]],
    ['F16', bytesOf(new Uint16Array([0x3c00, 0xc100, 0x0001])), [1, -2.5, 2 ** -24]],
    ['I8', bytesOf(new Int8Array([-128, -1, 127])), [-128, -1, 127]],
    ['U8', new Uint8Array([0, 200, 255]), [0, 200, 255]],
    ['I16', bytesOf(new Int16Array([-32768, 32767])), [-32768, 32767]],
    ['U16', bytesOf(new Uint16Array([65535])), [65535]],
    ['I32', bytesOf(new Int32Array([-(2 ** 31), 7])), [-(2 ** 31), 7]],
    ['U32', bytesOf(new Uint32Array([2 ** 32 - 1])), [Math.fround(2 ** 32 - 1)]],
    ['I64', bytesOf(new BigInt64Array([-(2n ** 40n) - 3n, 2n ** 53n, -1n])), [Math.fround(-(2 ** 40) - 3), 2 ** 53, -1]],
    ['U64', bytesOf(new BigUint64Array([2n ** 64n - 1n, 5n])), [2 ** 64, 5]],
    ['BOOL', new Uint8Array([1, 0, 1]), [1, 0, 1]],
    ['F8_E4M3', new Uint8Array([0x38, 0xfe, 0x01, 0x7f]), [1, -448, 2 ** -9, NaN]],
    ['F8_E5M2', new Uint8Array([0x3c, 0xfb, 0x01, 0x7c]), [1, -57344, 2 ** -16, Infinity]],
  ] as const)('%s', (dtype, bytes, expected) => {
    expect(Array.from(toFloat32(dtype, bytes))).toEqual(expected);
    const f16 = toFloat16Bits(dtype, bytes);
    expect(Array.from(f16)).toEqual(expected.map((v) => f32ToF16Bits(v)));
  });

  it('copies unaligned input rather than misreading it', () => {
    const backing = new Uint8Array(9);
    backing.set(new Uint8Array(new Float32Array([3.25, -1]).buffer), 1);
    const unaligned = backing.subarray(1);
    expect(Array.from(typedView(unaligned, Float32Array))).toEqual([3.25, -1]);
    expect(Array.from(toFloat32('F32', unaligned))).toEqual([3.25, -1]);
    expect(() => typedView(backing.subarray(0, 3), Uint16Array)).toThrow(/not a multiple/);
  });

  it('writes into a caller-supplied destination of the right length only', () => {
    const dst = new Float32Array(2);
    expect(toFloat32('BF16', bytesOf(new Uint16Array([0x4000, 0x4040])), dst)).toBe(dst);
    expect(Array.from(dst)).toEqual([2, 3]);
    expect(() => toFloat32('BF16', bytesOf(new Uint16Array([1])), dst)).toThrow(/length/);
  });
});
