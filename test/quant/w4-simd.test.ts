// W4 straight from bf16 bits (Bf16W8.quantizeW4, the WebAssembly SIMD kernel in w8-simd.wat): the
// same packed codes and float32 scales as widening to f32 and calling quantizeW4Rows, bit for bit,
// over every bf16 magnitude under block maxima of every kind, on exact ties, zero and negative-zero
// blocks, inf/NaN, the tiny twins' tensors, and through WeightStore's streamed export.
import { join } from 'node:path';
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { mkdtempSync, rmSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { Bf16W8, quantizeBf16W4Rows } from '../../src/quant/w8-simd.js';
import { quantizeW4Rows, W4_BLOCK } from '../../src/quant/w4.js';
import { bf16ToF32Array, f32FromBits } from '../../src/io/dtype.js';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { writeSafetensors } from '../../src/io/safetensors-writer.js';
import { ExternalDataWriter } from '../../src/onnx/external.js';
import { GraphBuilder } from '../../src/onnx/builder.js';
import { WeightStore } from '../../src/quant/weights.js';
import { twinDir } from '../helpers/twin.js';

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
/** The bf16 bits of v (v must be exact in bf16). */
const bf16 = (v: number) => ((f32[0] = v), u32[0] >>> 16);

/** quantizeW4Rows on the widened values: the reference the kernel must equal. */
function reference(src: Uint16Array, cols: number) {
  const codes = new Uint8Array(src.length / 2);
  const scales = new Float32Array(src.length / W4_BLOCK);
  quantizeW4Rows(bf16ToF32Array(src), cols, codes, scales);
  return { codes, scales };
}

/** Codes and scales (compared with Object.is) that differ between the kernel and the reference. */
function mismatches(src: Uint16Array, cols: number, simd = true): number {
  const got = quantizeBf16W4Rows(src, cols, { simd });
  const want = reference(src, cols);
  let bad = 0;
  for (let i = 0; i < want.codes.length; i++) if (got.codes[i] !== want.codes[i]) bad++;
  for (let i = 0; i < want.scales.length; i++) if (!Object.is(got.scales[i], want.scales[i])) bad++;
  return bad;
}

/** Blocks of 32 that each start with `max` (bf16 bits), then the values, zero-padded. */
function blocksUnder(max: number, values: number[]): Uint16Array {
  const per = W4_BLOCK - 1;
  const out: number[] = [];
  for (let i = 0; i < values.length; i += per) {
    const chunk = values.slice(i, i + per);
    while (chunk.length < per) chunk.push(0);
    out.push(max, ...chunk);
  }
  return Uint16Array.from(out);
}

describe('W4 straight from bf16 (Bf16W8.quantizeW4)', () => {
  it('runs the SIMD kernel here', () => {
    expect(new Bf16W8([64]).simd).toBe(true);
  });

  it('gives quantizeW4Rows\' codes and scales for every bf16 value under block maxima of every kind', () => {
    // Maxima whose scale max/7 is exact and short (7, 21 = 7·3, 7·2^k, 252 = 7·36) put some w / s
    // exactly on half steps; the others give 24-bit scales. Plus extremes and random ones.
    const maxima = [7, 21, 35, 7 * 2 ** -10, 252, 1, 0.0213, 0.5, 1.5, 100.5, 2 ** -126, 2 ** -133, 3.3895313892515355e38];
    let x = 11;
    for (let i = 0; i < 24; i++) {
      x = (x * 1103515245 + 12345) >>> 0;
      maxima.push(Math.abs(f32FromBits(((x >>> 1) & 0x7f7f0000) | 0x00800000)));
    }
    for (const max of maxima) {
      const m = bf16(max);
      const vals: number[] = [];
      for (let b = 0; b <= m; b++) vals.push(b, b | 0x8000);
      const src = blocksUnder(m, vals);
      expect(mismatches(src, src.length), `max ${max}`).toBe(0);
    }
  });

  it('rounds exact half steps to even, as quantizeW4Rows does', () => {
    // max 7 → s = 1 and max 21 → s = 3: w / s = ±0.5, ±1.5, ±2.5 … exactly.
    const halves = [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5].flatMap((h) => [h, -h]);
    const src = Uint16Array.from([...[7, ...halves].map(bf16), ...new Array(32 - 15).fill(0), ...[21, ...halves.map((h) => 3 * h)].map(bf16), ...new Array(32 - 15).fill(0)]);
    const { codes, scales } = quantizeBf16W4Rows(src, 32);
    expect([...scales]).toEqual([1, 3]);
    const nibbles = Array.from({ length: 64 }, (_, i) => (i & 1 ? codes[i >> 1] >> 4 : codes[i >> 1] & 15) - 8);
    expect(nibbles.slice(0, 15)).toEqual([7, 0, 0, 2, -2, 2, -2, 4, -4, 4, -4, 6, -6, 6, -6]);
    expect(nibbles.slice(32, 47)).toEqual([7, 0, 0, 2, -2, 2, -2, 4, -4, 4, -4, 6, -6, 6, -6]);
    expect(mismatches(src, 32)).toBe(0);
  });

  it('gives zero and negative-zero blocks a unit scale and code 8, and ±max the codes 15 and 1', () => {
    const src = new Uint16Array(4 * 32);
    src.fill(0x8000, 32, 64); // all −0
    src.fill(0x8000, 64, 96);
    src[70] = 0; // +0 among −0
    src[96] = bf16(-2.5);
    src[97] = bf16(2.5);
    const { codes, scales } = quantizeBf16W4Rows(src, 64);
    expect([...scales.slice(0, 3)]).toEqual([1, 1, 1]);
    expect(codes.slice(0, 48).every((c) => c === 0x88)).toBe(true);
    expect(codes[48]).toBe(1 | (15 << 4));
    expect(mismatches(src, 64)).toBe(0);
  });

  it('matches on random rows with the extremes mixed in, and without SIMD', () => {
    let x = 5;
    const rnd = () => ((x = (x * 1664525 + 1013904223) >>> 0), x / 2 ** 32);
    for (const cols of [32, 96, 2560]) {
      const src = new Uint16Array(41 * cols);
      for (let i = 0; i < src.length; i++) src[i] = bf16((rnd() * 2 - 1) * 0.05 * (1 + (i % 7)));
      for (let i = 0; i < 200; i++) src[Math.floor(rnd() * src.length)] = 0x7f7f ^ (rnd() < 0.5 ? 0x8000 : 0); // ±bf16 max
      for (let i = 0; i < 200; i++) src[Math.floor(rnd() * src.length)] = Math.floor(rnd() * 0x80) | (rnd() < 0.5 ? 0x8000 : 0); // subnormals
      src.fill(0, 0, 32);
      expect(mismatches(src, cols)).toBe(0);
      expect(mismatches(src, cols, false)).toBe(0);
    }
  });

  it('redoes a chunk holding inf or NaN through quantizeW4Rows (its max skips NaN)', () => {
    const src = new Uint16Array(4 * 32);
    for (let i = 0; i < src.length; i++) src[i] = bf16(((i % 13) - 6) * 0.125);
    src[5] = 0x7fc1; // NaN: not the block's max for quantizeW4Rows
    src[40] = 0x7f80; // +inf
    src[100] = 0xff80; // −inf
    expect(mismatches(src, 128)).toBe(0);
  });

  it('refuses rows that are not whole blocks, or buffers outside its regions', () => {
    const w = new Bf16W8([256, 256]);
    const src = new Uint16Array(w.regions[0].buffer, w.regions[0].byteOffset, 96);
    expect(() => w.quantizeW4(src, 48, w.regions[1])).toThrow(/block 32/);
    expect(() => w.quantizeW4(new Uint16Array(64), 32, w.regions[1])).toThrow(/regions/);
  });
});

describe('W4 from bf16 on the tiny twins\' tensors', () => {
  // Each twin as the builds have it (made once per test run, in the shared stage cache).
  it.each(['qwen3', 'qwen3_5'])('gives quantizeW4Rows\' bytes for every bf16 matrix of the %s twin whose rows are whole blocks', async (family) => {
    const dir = await twinDir(family);
    const ckpt = await openCheckpoint(dir);
    let matrices = 0;
    try {
      for (const name of ckpt.names()) {
        const info = ckpt.info(name);
        if (info.dtype !== 'BF16' || info.shape.length !== 2 || info.shape[1] % W4_BLOCK !== 0) continue;
        const raw = await ckpt.readRowsRawInto(name, 0, new Uint8Array(info.byteLength));
        expect(mismatches(new Uint16Array(raw.buffer, raw.byteOffset, raw.byteLength / 2), info.shape[1]), name).toBe(0);
        matrices++;
      }
    } finally {
      await ckpt.close();
    }
    expect(matrices).toBeGreaterThan(10);
  }, 900_000);
});

describe('WeightStore w4 on a bf16 checkpoint', () => {
  it('writes quantizeW4Rows\' codes then its scales, byte for byte, across several streamed chunks', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-w4store-'));
    try {
      // 1,200 × 2,048 bf16 = 4.9 MB: more than one 4 MiB read chunk, the last one partial.
      const [rows, cols] = [1200, 2048];
      let x = 3;
      const data = Uint16Array.from({ length: rows * cols }, (_, i) => ((x = (x * 1664525 + 1013904223) >>> 0), bf16(((x / 2 ** 32) * 2 - 1) * 0.02 * (1 + (i % 3)))));
      await writeSafetensors(join(dir, 'model.safetensors'), [{ name: 'w', dtype: 'BF16', shape: [rows, cols], data }]);
      const ckpt = await openCheckpoint(dir);
      const sink = new ExternalDataWriter(join(dir, 'm.data'));
      const store = new WeightStore(ckpt, sink);
      const g = new GraphBuilder('t');
      await store.linear(g, g.input('x', 'float32', [1, 1, cols]), 'w', [rows, cols], 'w4', 1);
      await sink.commitAsync();
      await ckpt.close();
      const want = reference(data, cols);
      const file = readFileSync(join(dir, 'm.data'));
      const codesAt = file.indexOf(Buffer.from(want.codes.subarray(0, 64)));
      expect(codesAt).toBeGreaterThanOrEqual(0);
      expect(file.subarray(codesAt, codesAt + want.codes.length).equals(Buffer.from(want.codes))).toBe(true);
      const scaleBytes = Buffer.from(want.scales.buffer);
      const scalesAt = file.indexOf(scaleBytes.subarray(0, 64), codesAt + want.codes.length);
      expect(scalesAt).toBeGreaterThanOrEqual(codesAt + want.codes.length);
      expect(file.subarray(scalesAt, scalesAt + scaleBytes.length).equals(scaleBytes)).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
