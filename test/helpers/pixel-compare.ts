// Reading raw pre-processing outputs (qhx_pixels, the Python references) and comparing them with
// HF's: shared by test/image-input.test.ts and test/gemma4-image-input.test.ts.
import { readFileSync } from 'node:fs';

/** A raw little-endian float32 file. */
export function floats(path: string): Float32Array {
  const b = readFileSync(path);
  return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4);
}

/** A raw little-endian int32 file. */
export function ints(path: string): Int32Array {
  const b = readFileSync(path);
  return new Int32Array(b.buffer, b.byteOffset, b.byteLength / 4);
}

export interface PixelDiff {
  maxAbs: number;
  meanAbs: number;
  cosine: number;
  /** Fraction of the values that differ by more than 1e-6 (a uint8 step is ≥ 1/255 after any rescale here). */
  offFraction: number;
  /** Fraction that differ by more than one step (compare's `step`; 0 without it). */
  beyondStepFraction: number;
}

/** ours against theirs, value by value (equal lengths); step: one uint8 step after the rescale. */
export function compare(a: Float32Array, b: Float32Array, step = Infinity): PixelDiff {
  if (a.length !== b.length) throw new Error(`compare: ${a.length} values against ${b.length}`);
  let max = 0, sum = 0, dot = 0, na = 0, nb = 0, off = 0, beyond = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (d > max) max = d;
    if (d > 1e-6) off++;
    if (d > step + 1e-6) beyond++;
    sum += d;
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return { maxAbs: max, meanAbs: sum / a.length, cosine: dot / Math.sqrt(na * nb), offFraction: off / a.length, beyondStepFraction: beyond / a.length };
}
