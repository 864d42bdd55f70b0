import { describe, it, expect } from 'vitest';
import { quantizeRows, dequantizeRows } from '../src/quant/w8.js';

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
