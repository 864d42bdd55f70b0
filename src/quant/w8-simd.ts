// W8 and f16 straight from bf16 checkpoint bits, in WebAssembly SIMD (w8-simd.wat, compiled with
// wabt at load). The scalar path (bf16 → f32 copy, then quantizeRows) costs ~6-7 ns an element on
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
// W4 (quantizeW4Rows' blocks of 32) divides in f64 exactly as quantizeW4Rows does; only the max on
// the bits (above) and adding the code offset 8 in the rounding step (w8-simd.wat) need an argument.
// A chunk holding inf or NaN is redone by quantizeW4Rows itself (its max skips NaN, the bits would
// not). ~0.6 ns an element against ~5 for the scalar path (test/quant/w4-simd.test.ts: same bits).
import { readFile } from 'node:fs/promises';
import { bf16ToF16Array, bf16ToF32Array } from '../io/dtype.js';
import { quantizeRows } from './w8.js';
import { quantizeW4Rows, W4_BLOCK } from './w4.js';

// The kernels (max, q, w4, f16) are in w8-simd.wat, compiled here when this module loads: ~0.1 s once
// a process, mostly starting wabt itself. Top-level await keeps the API below synchronous. wabt's
// validator makes a broken kernel fail loudly, so WebAssembly.validate only says whether this
// engine has SIMD.
async function compileKernels(): Promise<Uint8Array<ArrayBuffer>> {
  const text = await readFile(new URL('./w8-simd.wat', import.meta.url), 'utf8');
  const wabt = await (await import('wabt')).default();
  const mod = wabt.parseWat('w8-simd.wat', text, { simd: true });
  try {
    mod.validate();
    return new Uint8Array(mod.toBinary({}).buffer); // typed as over an ArrayBuffer, which WebAssembly wants
  } finally {
    mod.destroy();
  }
}
const MODULE = await compileKernels();

let compiled: WebAssembly.Module | null | undefined;
function wasmModule(): WebAssembly.Module | null {
  if (compiled === undefined) compiled = WebAssembly.validate(MODULE) ? new WebAssembly.Module(MODULE) : null;
  return compiled;
}

interface Kernels {
  max(p: number, n: number): number;
  q(p: number, n: number, d: number, inv: number, zp: number): void;
  f16(p: number, n: number, d: number): void;
  w4(p: number, n: number, d: number, s: number): number;
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

  /**
   * quantizeW4Rows(bf16 → f32 of `src`, cols, …), same codes and scales: the packed codes go to
   * `out`'s first src.length / 2 bytes and the float32 scales (one per block of 32) right after them,
   * both returned as views. `src` and `out` must be views of this object's regions, `out` 4-byte
   * aligned with room for 5/8 of src.length bytes.
   */
  quantizeW4(src: Uint16Array, cols: number, out: Uint8Array): { codes: Uint8Array; scales: Float32Array } {
    if (src.buffer !== this.buffer || out.buffer !== this.buffer) throw new Error('Bf16W8.quantizeW4: src and out must lie in its regions');
    const n = src.length;
    if (cols % W4_BLOCK !== 0 || n % cols !== 0) throw new RangeError(`W4: ${n} elements are not rows of ${cols}, a multiple of the block ${W4_BLOCK}`);
    if (out.length < n / 2 + n / 8 || out.byteOffset % 4 !== 0) throw new RangeError(`bad W4 output for ${n} elements`);
    const codes = out.subarray(0, n / 2);
    const scales = new Float32Array(this.buffer, out.byteOffset + n / 2, n / W4_BLOCK);
    const k = this.kernels;
    if (n === 0 || (k && k.w4(src.byteOffset, n, codes.byteOffset, scales.byteOffset) < 0x7f80)) return { codes, scales };
    quantizeW4Rows(bf16ToF32Array(src), cols, codes, scales);
    return { codes, scales };
  }

  /**
   * The largest (bits & 0x7fff) of the 16-bit values in `src` (bf16 or f16 bits): ≥ 0x7f80 (bf16)
   * or ≥ 0x7c00 (f16) exactly when one of them is Inf or NaN. In SIMD when `src` is a view of this
   * object's regions.
   */
  maxMagnitude(src: Uint16Array): number {
    const n = src.length;
    const simd = n - (n % 8);
    const m = this.kernels && simd > 0 && src.buffer === this.buffer ? this.kernels.max(src.byteOffset, simd) : maxMagnitude(src, 0, simd);
    return Math.max(m, maxMagnitude(src, simd, n - simd));
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

/** quantizeW4Rows of bf16 rows (raw bits) through a one-off Bf16W8: for tests. */
export function quantizeBf16W4Rows(src: Uint16Array, cols: number, opts: { simd?: boolean } = {}): { codes: Uint8Array; scales: Float32Array } {
  const w = new Bf16W8([src.byteLength, src.length], opts);
  new Uint16Array(w.regions[0].buffer, w.regions[0].byteOffset, src.length).set(src);
  const r = w.quantizeW4(new Uint16Array(w.regions[0].buffer, w.regions[0].byteOffset, src.length), cols, w.regions[1]);
  return { codes: r.codes.slice(), scales: r.scales.slice() };
}
