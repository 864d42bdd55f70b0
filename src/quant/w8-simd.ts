// W8 and f16 straight from bf16 checkpoint bits, in WebAssembly SIMD (hand-assembled below; no
// toolchain). The scalar path (bf16 → f32 copy, then quantizeRows) costs ~6-7 ns an element on
// the 2-core build machines and a 4B model has 3.6e9 of them; these kernels take ~0.8 (W8) and
// ~0.3 (f16), with the same results bit for bit (test/w8.test.ts, exhaustively over bf16 values):
// - the scale is fround(max|w| / 127) with max|w| found on the bits (magnitudes of finite floats
//   order like their bit patterns), as quantizeRows finds it on the values;
// - a code is round-half-even(w · fl(1/s)) instead of round-half-even(fl(w / s)). These agree:
//   w (bf16) has ≤ 8 significant bits and s 24 with its low 16 not all zero, so a nonzero
//   w − (k+½)·s is ≥ 2^-32 of (k+½)·s, i.e. w/s lies ≥ 2^-33 from every half-integer, while
//   w · fl(1/s) is within 2^-45 of w/s (|w/s| ≤ 127.5). Rows where s has ≤ 8 significant bits
//   (w can then sit exactly on a half step), is subnormal, or that hold inf/NaN go through
//   quantizeRows itself, as does everything when WebAssembly SIMD is missing.
import { bf16ToF16Array, bf16ToF32Array } from '../io/dtype.js';
import { quantizeRows } from './w8.js';

// ---- a few wasm opcodes (core and 0xFD-prefixed SIMD), enough for the three functions below
const uleb = (n: number): number[] => {
  const out: number[] = [];
  do {
    const b = n & 0x7f;
    n >>>= 7;
    out.push(n ? b | 0x80 : b);
  } while (n);
  return out;
};
const S = (op: number) => [0xfd, ...uleb(op)];
const get = (i: number) => [0x20, i];
const set = (i: number) => [0x21, i];
const tee = (i: number) => [0x22, i];
const i32c = (v: number) => [0x41, v]; // small non-negative constants only (< 64)
const [ADD, SHL, LT_U, LOOP, BR_IF, END] = [[0x6a], [0x74], [0x49], [0x03, 0x40], [0x0d, 0], [0x0b]];
const LOAD = (offset: number) => [...S(0), 0, ...uleb(offset)];
const STORE = [...S(11), 0, 0];
const vconst = (bytes: ArrayLike<number>) => [...S(12), ...Array.from(bytes)];
const shuffle = (lanes: number[]) => [...S(13), ...lanes];
const [AND, I16_MAX_U, I16_LANE_U, F64_SPLAT, I8_SPLAT] = [S(78), S(153), [...S(25), 0], S(20), S(15)];
const [PROMOTE, F64_MUL, F64_ADD, NARROW_16, NARROW_8, I8_MAX_S, I8_ADD] = [S(95), S(242), S(240), S(133), S(101), S(120), S(110)];

const range = (a: number, n: number) => Array.from({ length: n }, (_, i) => a + i);
const f64x2 = (v: number) => new Uint8Array(new Float64Array([v, v]).buffer);
// 1.5·2^52: adding it rounds to an integer (ties to even) that sits in the low 32 bits.
const ROUND = 6755399441055744;

// max(p, n) → the largest (bits & 0x7fff) of n bf16 at p (n a multiple of 8, ≥ 8).
// locals: 2 end, 3 acc, 4 mask
const maxBody = [
  2, 1, 0x7f, 2, 0x7b,
  ...get(0), ...get(1), ...i32c(1), ...SHL, ...ADD, ...set(2),
  ...vconst(new Uint8Array(new Uint16Array(8).fill(0x7fff).buffer)), ...set(4),
  ...LOOP,
  ...get(3), ...get(0), ...LOAD(0), ...get(4), ...AND, ...I16_MAX_U, ...set(3),
  ...get(0), ...i32c(16), ...ADD, ...tee(0), ...get(2), ...LT_U, ...BR_IF,
  ...END,
  ...get(3), ...get(3), ...get(3), ...shuffle([...range(8, 8), ...range(0, 8)]), ...I16_MAX_U, ...set(3),
  ...get(3), ...get(3), ...get(3), ...shuffle([...range(4, 4), ...range(0, 4), ...range(8, 8)]), ...I16_MAX_U, ...set(3),
  ...get(3), ...get(3), ...get(3), ...shuffle([2, 3, 0, 1, ...range(4, 12)]), ...I16_MAX_U,
  ...I16_LANE_U,
  ...END,
];

// quant(p, n, d, inv, zp): n bf16 at p (n a multiple of 16) → n bytes at d,
// clamp(round(w · inv), ±127) + zp. locals: 5 end; v128: 6 inv, 7 ROUND, 8 zp, 9 −127, 10 x0, 11 x1, 12 zero
// bf16 elements 2k, 2k+1 of x into the top halves of f32 lanes 0 and 1, widened to f64, times
// inv, plus ROUND.
const pair = (x: number, k: number) => [
  ...get(x), ...get(12), ...shuffle([16, 16, 4 * k, 4 * k + 1, 16, 16, 4 * k + 2, 4 * k + 3, ...new Array(8).fill(16)]),
  ...PROMOTE, ...get(6), ...F64_MUL, ...get(7), ...F64_ADD,
];
// The low 32 bits of two such f64x2 → one i32x4 of four codes.
const quad = (x: number, k: number) => [...pair(x, k), ...pair(x, k + 1), ...shuffle([0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27])];
const eight = (x: number) => [...quad(x, 0), ...quad(x, 2), ...NARROW_16];
const quantBody = [
  2, 1, 0x7f, 7, 0x7b,
  ...get(0), ...get(1), ...i32c(1), ...SHL, ...ADD, ...set(5),
  ...get(3), ...F64_SPLAT, ...set(6),
  ...vconst(f64x2(ROUND)), ...set(7),
  ...get(4), ...I8_SPLAT, ...set(8),
  ...vconst(new Array(16).fill(0x81)), ...set(9),
  ...LOOP,
  ...get(0), ...LOAD(0), ...set(10), ...get(0), ...LOAD(16), ...set(11),
  ...get(2), ...eight(10), ...eight(11), ...NARROW_8, ...get(9), ...I8_MAX_S, ...get(8), ...I8_ADD, ...STORE,
  ...get(0), ...i32c(32), ...ADD, ...set(0), ...get(2), ...i32c(16), ...ADD, ...set(2),
  ...get(0), ...get(5), ...LT_U, ...BR_IF,
  ...END,
  ...END,
];

// f16(p, n, d): n bf16 at p (n a multiple of 8) → n f16 bit patterns at d, as f32BitsToF16Bits
// rounds them. On bf16 the f16-normal range is exact (a rebias: (a − 0x3800) << 3); above it inf
// or NaN; below it, rare, round-half-even(|x|·2^24) in f32 (exact scaling) gives the subnormal
// (or zero) bits. locals: 3 end; v128: 4 |x| bits, 5 result, 6 small lanes, 7 x
const i16s = (v: number) => vconst(new Uint8Array(new Uint16Array(8).fill(v).buffer));
const [OR, BITSELECT, ANY_TRUE, I16_SUB, I16_SHL, I16_GT_S, I16_LT_S] = [S(80), S(82), S(83), S(145), S(139), S(49), S(47)];
const [EXT_LO_U, EXT_HI_U, I32_SHL, F32_MUL, F32_NEAREST, TRUNC_F32] = [S(169), S(170), S(171), S(230), S(106), S(248)];
const subnormal = (extend: number[]) => [
  ...get(4), ...extend, ...i32c(16), ...I32_SHL, ...vconst(new Uint8Array(new Float32Array(4).fill(2 ** 24).buffer)), ...F32_MUL, ...F32_NEAREST, ...TRUNC_F32,
];
const f16Body = [
  2, 1, 0x7f, 4, 0x7b,
  ...get(0), ...get(1), ...i32c(1), ...SHL, ...ADD, ...set(3),
  ...LOOP,
  ...get(0), ...LOAD(0), ...tee(7), ...i16s(0x7fff), ...AND, ...set(4),
  ...get(4), ...i16s(0x3800), ...I16_SUB, ...i32c(3), ...I16_SHL, ...set(5),
  // ≥ 65536 (bf16 has no value in 65504..65536): inf, or NaN keeping the top payload bits
  ...i16s(0x7e00), ...get(4), ...i32c(3), ...I16_SHL, ...i16s(0x3ff), ...AND, ...OR, ...i16s(0x7c00),
  ...get(4), ...i16s(0x7f80), ...I16_GT_S, ...BITSELECT,
  ...get(5), ...get(4), ...i16s(0x477f), ...I16_GT_S, ...BITSELECT, ...set(5),
  ...get(4), ...i16s(0x3880), ...I16_LT_S, ...tee(6), ...ANY_TRUE,
  0x04, 0x40,
  ...subnormal(EXT_LO_U), ...subnormal(EXT_HI_U), ...NARROW_16, ...get(5), ...get(6), ...BITSELECT, ...set(5),
  ...END,
  ...get(2), ...get(5), ...get(7), ...i16s(0x8000), ...AND, ...OR, ...STORE,
  ...get(2), ...i32c(16), ...ADD, ...set(2),
  ...get(0), ...i32c(16), ...ADD, ...tee(0), ...get(3), ...LT_U, ...BR_IF,
  ...END,
  ...END,
];

const section = (id: number, body: number[]) => [id, ...uleb(body.length), ...body];
const vec = (items: number[][]) => [...uleb(items.length), ...items.flat()];
const name = (s: string) => [s.length, ...Array.from(s, (c) => c.charCodeAt(0))];
const MODULE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
  ...section(1, vec([[0x60, 2, 0x7f, 0x7f, 1, 0x7f], [0x60, 5, 0x7f, 0x7f, 0x7f, 0x7c, 0x7f, 0], [0x60, 3, 0x7f, 0x7f, 0x7f, 0]])),
  ...section(2, vec([[...name('e'), ...name('m'), 0x02, 0x00, 0x00]])),
  ...section(3, vec([[0], [1], [2]])),
  ...section(7, vec([[...name('max'), 0x00, 0], [...name('q'), 0x00, 1], [...name('f16'), 0x00, 2]])),
  ...section(10, vec([maxBody, quantBody, f16Body].map((b) => [...uleb(b.length), ...b]))),
]);

let compiled: WebAssembly.Module | null | undefined;
function wasmModule(): WebAssembly.Module | null {
  if (compiled === undefined) compiled = WebAssembly.validate(MODULE) ? new WebAssembly.Module(MODULE) : null;
  return compiled;
}

interface Kernels {
  max(p: number, n: number): number;
  q(p: number, n: number, d: number, inv: number, zp: number): void;
  f16(p: number, n: number, d: number): void;
}

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/**
 * Byte regions in one WebAssembly memory (fixed size: growing it would detach the views) and the
 * W8 kernels over them. Read checkpoint bytes straight into a region, quantize into another.
 */
export class Bf16W8 {
  readonly regions: Uint8Array[];
  private readonly kernels: Kernels | null;
  private readonly buffer: ArrayBuffer;
  private row = new Float32Array(0);

  constructor(regionBytes: number[], opts: { simd?: boolean } = {}) {
    const sizes = regionBytes.map((b) => Math.ceil(b / 64) * 64);
    const total = sizes.reduce((a, b) => a + b, 0);
    const memory = new WebAssembly.Memory({ initial: Math.max(1, Math.ceil(total / 65536)) });
    const mod = opts.simd === false ? null : wasmModule();
    this.kernels = mod ? (new WebAssembly.Instance(mod, { e: { m: memory } }).exports as unknown as Kernels) : null;
    this.buffer = memory.buffer;
    let at = 0;
    this.regions = sizes.map((n, i) => {
      const r = new Uint8Array(this.buffer, at, regionBytes[i]);
      at += n;
      return r;
    });
  }

  get simd(): boolean {
    return this.kernels !== null;
  }

  /**
   * quantizeRows(bf16 → f32 of `src`, cols, q, scales, zeroPoint), same results. `src` and `q`
   * must be views of this object's regions.
   */
  quantize(src: Uint16Array, cols: number, q: Uint8Array | Int8Array, scales: Float32Array, zeroPoint = 0): void {
    if (src.buffer !== this.buffer || q.buffer !== this.buffer) throw new Error('Bf16W8.quantize: src and q must lie in its regions');
    const n = src.length / cols;
    if (!Number.isInteger(n) || q.length < src.length || scales.length < n) throw new RangeError(`bad W8 buffers for ${n} rows of ${cols}`);
    const k = cols % 16 === 0 && cols >= 16 ? this.kernels : null;
    for (let r = 0; r < n; r++) {
      const sp = src.byteOffset + 2 * r * cols;
      const m = k ? k.max(sp, cols) : maxMagnitude(src, r * cols, cols);
      U32[0] = m << 16;
      const s = m > 0 ? Math.fround(F32[0] / 127) : 1;
      F32[0] = s;
      const sb = U32[0];
      if (k && m < 0x7f80 && (sb & 0x7f800000) !== 0 && (sb & 0xffff) !== 0) {
        scales[r] = s;
        k.q(sp, cols, q.byteOffset + r * cols, 1 / s, zeroPoint);
      } else {
        if (this.row.length !== cols) this.row = new Float32Array(cols);
        bf16ToF32Array(src.subarray(r * cols, (r + 1) * cols), this.row);
        quantizeRows(this.row, cols, q.subarray(r * cols, (r + 1) * cols), scales.subarray(r, r + 1), zeroPoint);
      }
    }
  }

  /** bf16ToF16Array(src, dst), the same bits; in SIMD when both are views of this object's regions. */
  toF16(src: Uint16Array, dst: Uint16Array): Uint16Array {
    const n = src.length;
    if (dst.length !== n) throw new RangeError(`destination length ${dst.length} ≠ source length ${n}`);
    if (this.kernels && n > 0 && n % 8 === 0 && src.buffer === this.buffer && dst.buffer === this.buffer) this.kernels.f16(src.byteOffset, n, dst.byteOffset);
    else bf16ToF16Array(src, dst);
    return dst;
  }
}

function maxMagnitude(src: Uint16Array, at: number, n: number): number {
  let m = 0;
  for (let i = at; i < at + n; i++) {
    const a = src[i] & 0x7fff;
    if (a > m) m = a;
  }
  return m;
}

/** quantizeRows of bf16 rows (raw bits), through a one-off Bf16W8: for tests and small tensors. */
export function quantizeBf16Rows(src: Uint16Array, cols: number, q: Uint8Array | Int8Array, scales: Float32Array, zeroPoint = 0, opts: { simd?: boolean } = {}): void {
  const w = new Bf16W8([src.byteLength, q.byteLength], opts);
  const s = new Uint16Array(w.regions[0].buffer, w.regions[0].byteOffset, src.length);
  s.set(src);
  const out = new Uint8Array(w.regions[1].buffer, w.regions[1].byteOffset, q.length);
  w.quantize(s, cols, out, scales, zeroPoint);
  new Uint8Array(q.buffer, q.byteOffset, q.length).set(out);
}
