import { describe, it, expect } from 'vitest';
import { quantizeRows, dequantizeRows } from '../src/quant/w8.js';
import { Bf16W8, quantizeBf16Rows } from '../src/quant/w8-simd.js';
import { bf16ToF16Array, bf16ToF32Array, f32FromBits } from '../src/io/dtype.js';

describe('W8 per-channel quantization', () => {
  it('scales each row by its own max |w| / 127 and keeps the error within half a step', () => {
    const cols = 5;
    const rows = Float32Array.from([0.5, -1.0, 0.25, 0.125, 0.9, 10, -20, 5, 2.5, 0]);
    const q = new Int8Array(rows.length);
    const s = new Float32Array(2);
    quantizeRows(rows, cols, q, s);
    expect(s[0]).toBeCloseTo(1 / 127, 7);
    expect(s[1]).toBeCloseTo(20 / 127, 6);
    expect(q[1]).toBe(-127);
    expect(q[6]).toBe(-127);
    const back = dequantizeRows(q, s, cols);
    for (let i = 0; i < rows.length; i++) expect(Math.abs(back[i] - rows[i])).toBeLessThanOrEqual(s[Math.floor(i / cols)] / 2 + 1e-7);
  });

  it('rounds halves to even, as numpy and torch do', () => {
    const q = new Int8Array(4);
    const s = new Float32Array(1);
    quantizeRows(Float32Array.from([127, 2.5, -3.5, 0.5]), 4, q, s); // scale exactly 1
    expect(s[0]).toBe(1);
    expect([...q]).toEqual([127, 2, -4, 0]);
  });

  it('gives an all-zero row a unit scale, never zero (DequantizeLinear needs s > 0)', () => {
    const q = new Int8Array(3);
    const s = new Float32Array(1);
    quantizeRows(new Float32Array(3), 3, q, s);
    expect(s[0]).toBe(1);
    expect([...q]).toEqual([0, 0, 0]);
  });
});

describe('W8 straight from bf16 (Bf16W8, WebAssembly SIMD)', () => {
  const f32 = new Float32Array(1);
  const u32 = new Uint32Array(f32.buffer);
  const bf16 = (v: number) => ((f32[0] = v), u32[0] >>> 16);
  // The reference: widen to f32, then quantizeRows.
  const reference = (src: Uint16Array, cols: number, zp: number) => {
    const q = new Uint8Array(src.length);
    const s = new Float32Array(src.length / cols);
    quantizeRows(bf16ToF32Array(src), cols, q, s, zp);
    return { q, s };
  };
  const same = (src: Uint16Array, cols: number, zp: number, simd = true) => {
    const q = new Uint8Array(src.length);
    const s = new Float32Array(src.length / cols);
    quantizeBf16Rows(src, cols, q, s, zp, { simd });
    const ref = reference(src, cols, zp);
    let bad = 0;
    for (let i = 0; i < q.length; i++) if (q[i] !== ref.q[i]) bad++;
    for (let i = 0; i < s.length; i++) if (!Object.is(s[i], ref.s[i])) bad++;
    return bad;
  };

  it('runs the SIMD kernels here', () => {
    expect(new Bf16W8([64]).simd).toBe(true);
  });

  it('gives quantizeRows\' codes and scales for every bf16 value, under row maxima of every kind', () => {
    // Each row: its maximum, then every bf16 pattern whose magnitude is at most that (both signs), zero-padded to 16.
    const maxima = [1, 127, 254, 127 * 2 ** -20, 2 ** -130, 3e38, 0.0213, 0.5, 1.5, 100.5, 2 ** -126];
    let x = 7;
    for (let i = 0; i < 40; i++) {
      x = (x * 1103515245 + 12345) >>> 0;
      maxima.push(Math.abs(f32FromBits(((x >>> 1) & 0x7f7fffff) | 0x00800000)));
    }
    for (const max of maxima) {
      const m = bf16(max);
      const vals = [m];
      for (let b = 0; b <= m; b++) vals.push(b, b | 0x8000);
      while (vals.length % 16) vals.push(0);
      for (const zp of [128, 0]) expect(same(Uint16Array.from(vals), vals.length, zp)).toBe(0);
    }
  });

  it('converts every bf16 value to the f16 bits bf16ToF16Array gives', () => {
    const w = new Bf16W8([1 << 17, 1 << 17]);
    const src = new Uint16Array(w.regions[0].buffer, w.regions[0].byteOffset, 1 << 16);
    for (let i = 0; i < src.length; i++) src[i] = i;
    const out = w.toF16(src, new Uint16Array(w.regions[1].buffer, w.regions[1].byteOffset, src.length));
    expect(Buffer.from(out.buffer, out.byteOffset, out.byteLength).equals(Buffer.from(bf16ToF16Array(src).buffer))).toBe(true);
  });

  it('matches on random rows, all-zero rows, inf/NaN rows, exact half steps, and widths the kernel does not take', () => {
    let x = 99;
    const rnd = () => ((x = (x * 1664525 + 1013904223) >>> 0), x / 2 ** 32);
    for (const cols of [16, 48, 2560, 100, 8]) {
      const rows = 37;
      const src = new Uint16Array(rows * cols);
      for (let i = 0; i < src.length; i++) src[i] = bf16((rnd() * 2 - 1) * 0.05 * (1 + (i % 5)));
      src.fill(0, 0, cols); // all-zero row
      src[cols] = 0x7f80; // +inf
      src[2 * cols + 1] = 0x7fc1; // NaN
      src[3 * cols] = bf16(127);
      for (let c = 1; c < cols; c++) src[3 * cols + c] = bf16(((c % 255) - 127) + 0.5); // half steps at s = 1
      expect(same(src, cols, 128)).toBe(0);
      expect(same(src, cols, 128, false)).toBe(0);
    }
  });
});
