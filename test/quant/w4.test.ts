// W4 (quant/w4.ts): the codes, their packing in MatMulNBits' layout, the scales, the per-matrix
// padding (test/quant/pad.test.ts holds its numbers), the planner's bytes, and that ONNX Runtime reads the blob as we wrote it.
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { dequantizeW4Rows, quantizeW4Rows, W4_BLOCK, w4Precision } from '../../src/quant/w4.js';
import { storedBytes } from '../../src/quant/bytes.js';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { f32ToBf16Array, bf16ToF32Array } from '../../src/io/dtype.js';
import { writeSafetensors } from '../../src/io/safetensors-writer.js';
import { GraphBuilder } from '../../src/onnx/builder.js';
import { writeModel } from '../../src/onnx/writer.js';
import { ExternalDataWriter } from '../../src/onnx/external.js';
import { WeightStore } from '../../src/quant/weights.js';
import { tempDir } from '../io/helpers.js';
import { readFileSync } from 'node:fs';
import { parsePhimoeConfig, phimoe } from '../../src/families/phimoe.js';
import { EXPERT_ROW_DTYPE } from '../../src/families/expert-tables.js';
import { modelTensors } from '../../src/families/tensors.js';

/** The 4-bit codes of a packed blob, in weight order (low nibble first). */
const unpack = (packed: Uint8Array) => Array.from({ length: packed.length * 2 }, (_, i) => (i & 1 ? packed[i >> 1] >> 4 : packed[i >> 1] & 15));

describe('W4 blocks', () => {
  it('scales each block of 32 by its own max|w| / 7, stores q + 8, two codes a byte, low nibble first', () => {
    const w = new Float32Array(64);
    w[0] = 7; // block 0: scale exactly 1
    w[1] = -7;
    w[2] = 3;
    w[3] = -1;
    w[32] = 0.7; // block 1: scale 0.1
    w[33] = -0.35;
    const packed = new Uint8Array(32);
    const s = new Float32Array(2);
    quantizeW4Rows(w, 64, packed, s);
    expect(s[0]).toBe(1);
    expect(s[1]).toBe(Math.fround(0.7 / 7));
    expect(packed[0]).toBe((7 + 8) | ((-7 + 8) << 4)); // 0x1F: 15 low, 1 high
    expect(packed[1]).toBe((3 + 8) | ((-1 + 8) << 4));
    const codes = unpack(packed);
    expect(codes.slice(4, 32).every((c) => c === 8)).toBe(true); // zeros → the zero point
    expect(codes[32]).toBe(15);
    expect(codes[33]).toBe(Math.round(-0.35 / s[1]) + 8); // -3.5 → -4 (half to even)
    expect(codes.every((c) => c >= 1 && c <= 15)).toBe(true); // symmetric: code 0 (-8) never used
  });

  it('rounds halves to even, as numpy and torch do, and clamps to ±7', () => {
    const w = Float32Array.from({ length: 32 }, () => 0);
    w.set([7, 2.5, -3.5, 0.5, 1.5, -0.5, 6.5, -6.5]); // scale exactly 1
    const packed = new Uint8Array(16);
    const s = new Float32Array(1);
    quantizeW4Rows(w, 32, packed, s);
    expect(s[0]).toBe(1);
    expect(unpack(packed).slice(0, 8).map((c) => c - 8)).toEqual([7, 2, -4, 0, 2, 0, 6, -6]);
  });

  it('gives an all-zero block a unit scale and the zero point (0x88 bytes), never a zero scale', () => {
    const packed = new Uint8Array(16);
    const s = new Float32Array(1);
    quantizeW4Rows(new Float32Array(32), 32, packed, s);
    expect(s[0]).toBe(1);
    expect([...packed].every((b) => b === 0x88)).toBe(true);
  });

  it('dequantizes within half a step of each block, and refuses in-features the block does not divide', () => {
    const cols = 96;
    const w = Float32Array.from({ length: 3 * cols }, (_, i) => Math.sin(i * 0.37) * (1 + (i % 7)));
    const packed = new Uint8Array(w.length / 2);
    const s = new Float32Array(w.length / W4_BLOCK);
    quantizeW4Rows(w, cols, packed, s);
    const back = dequantizeW4Rows(packed, s);
    for (let i = 0; i < w.length; i++) expect(Math.abs(back[i] - w[i])).toBeLessThanOrEqual(s[Math.floor(i / W4_BLOCK)] / 2 + 1e-6);
    expect(() => quantizeW4Rows(new Float32Array(48), 48, new Uint8Array(24), new Float32Array(2))).toThrow(/not a multiple of the block 32/);
  });
});

describe('W4 per matrix: the padding and the planner bytes', () => {
  it('keeps W4 for every matrix, zero-padding the in-features the block does not divide to its next multiple, saying so', () => {
    expect(w4Precision(2560)).toEqual({ scheme: 'w4' });
    expect(w4Precision(48)).toEqual({ scheme: 'w4', paddedTo: 64, why: 'in-features 48 zero-padded to 64 (the W4 block 32)' });
    expect(w4Precision(120)).toMatchObject({ scheme: 'w4', paddedTo: 128 });
    expect(w4Precision(150)).toMatchObject({ scheme: 'w4', paddedTo: 160, why: expect.stringMatching(/150 zero-padded to 160/) });
    expect(w4Precision(16)).toMatchObject({ scheme: 'w4', paddedTo: 32 });
  });

  it('counts packed nibbles plus one float32 scale per block over the padded in-features, never more than W8', () => {
    const t = (shape: number[]) => ({ name: 'w', shape, role: 'matmul' as const });
    expect(storedBytes(t([2560, 9728]), 'w4')).toBe(2560 * 9728 * 0.5 + (2560 * 9728 / 32) * 4); // 0.625 B a weight
    expect(storedBytes(t([64, 48]), 'w4')).toBe(64 * 64 * 0.5 + 64 * 2 * 4);
    expect(storedBytes(t([64, 150]), 'w4')).toBe(64 * 160 * 0.5 + 64 * 5 * 4);
    for (const k of [16, 17, 33, 48, 120, 150, 2040]) expect(storedBytes(t([64, k]), 'w4'), `K=${k}`).toBeLessThanOrEqual(storedBytes(t([64, k]), 'w8'));
    expect(storedBytes({ name: 'n', shape: [64], role: 'small' }, 'w4')).toBe(64 * 4);
  });
});

describe('WeightStore in w4', () => {
  // Three matrices through one store: in-features 64 (W4), 48 and 40 (W4 padded to 64).
  const MATS: Array<[string, number, number]> = [['a', 80, 64], ['b', 24, 48], ['c', 16, 40]];

  async function build(dir: string) {
    const vals = (rows: number, cols: number, seed: number) => f32ToBf16Array(Float32Array.from({ length: rows * cols }, (_, i) => Math.sin((i + 1) * seed * 0.731) * 0.05));
    await writeSafetensors(join(dir, 'model.safetensors'), MATS.map(([name, r, c], i) => ({ name, dtype: 'BF16' as const, shape: [r, c], data: vals(r, c, i + 1) })));
    const ckpt = await openCheckpoint(dir);
    const sink = new ExternalDataWriter(join(dir, 'm.data'));
    const store = new WeightStore(ckpt, sink);
    const g = new GraphBuilder('t');
    for (const [name, rows, cols] of MATS) g.output(await store.linear(g, g.input(`x_${name}`, 'float32', [1, 1, cols]), name, [rows, cols], 'w4', 1), `y_${name}`, { shape: [1, 1, rows] });
    await sink.commitAsync();
    await ckpt.close();
    writeModel(g, join(dir, 'm.onnx'), { externalThreshold: Infinity });
    return { store, g, vals };
  }

  it('writes MatMulNBits(bits=4) blobs [N, K/32, 16] that ONNX Runtime reads as our dequantized weights, and records each padding', async () => {
    const dir = await tempDir();
    const { store, g, vals } = await build(dir);
    const nodes = g.toModelProto().graph!.node!;
    const nbits = nodes.filter((n) => n.opType === 'MatMulNBits').map((n) => Object.fromEntries(n.attribute!.map((a) => [a.name, Number(a.i)])));
    expect(nbits).toEqual([{ K: 64, N: 80, bits: 4, block_size: 32 }, { K: 64, N: 24, bits: 4, block_size: 32 }, { K: 64, N: 16, bits: 4, block_size: 32 }]);
    const blob = g.toModelProto().graph!.initializer!.find((t) => t.name === 'a')!;
    expect(blob.dims!.map(Number)).toEqual([80, 2, 16]);
    expect(store.precisions()).toEqual([
      { tensor: 'a', shape: [80, 64], scheme: 'w4' },
      { tensor: 'b', shape: [24, 48], scheme: 'w4', paddedTo: 64, why: expect.stringMatching(/48 zero-padded to 64/) },
      { tensor: 'c', shape: [16, 40], scheme: 'w4', paddedTo: 64, why: expect.stringMatching(/40 zero-padded to 64/) },
    ]);

    // ORT's CPU MatMulNBits against x · dequant(W)ᵀ computed here from the same codes.
    const ort = await import('onnxruntime-node');
    const sess = await ort.InferenceSession.create(join(dir, 'm.onnx'));
    const feeds = Object.fromEntries(MATS.map(([name, , cols]) => [`x_${name}`, new ort.Tensor('float32', Float32Array.from({ length: cols }, (_, k) => Math.cos(k / 3)), [1, 1, cols])]));
    const out = await sess.run(feeds);
    await sess.release();
    const [, rows, cols] = MATS[0];
    const w = bf16ToF32Array(vals(rows, cols, 1));
    const packed = new Uint8Array(w.length / 2);
    const s = new Float32Array(w.length / W4_BLOCK);
    quantizeW4Rows(w, cols, packed, s);
    const dq = dequantizeW4Rows(packed, s);
    const y = out.y_a.data as Float32Array;
    for (let r = 0; r < rows; r++) {
      let want = 0;
      for (let k = 0; k < cols; k++) want += Math.cos(k / 3) * dq[r * cols + k];
      expect(Math.abs(y[r] - want)).toBeLessThan(1e-5);
    }
  }, 60_000);
});

describe('PhiMoE under w4', () => {
  it('keeps the host expert rows int8 with row scales, as in w8, and stores the attention matrices in w4', async () => {
    expect(EXPERT_ROW_DTYPE.w4).toBe('int8');
    const c = parsePhimoeConfig(JSON.parse(readFileSync('recipes/phi-tiny-moe/recipe.json', 'utf8')).config, 'config.json');
    const tables = (scheme: 'w4' | 'w8') => phimoe.madeTables!(c, scheme).tables;
    expect(tables('w4')).toEqual(tables('w8'));
    const layer0 = (await modelTensors(phimoe, c)).layers[0].filter((t) => t.role === 'matmul');
    expect(layer0.map((t) => storedBytes(t, 'w4')).reduce((a, b) => a + b, 0)).toBeLessThan(layer0.map((t) => storedBytes(t, 'w8')).reduce((a, b) => a + b, 0) * 0.65);
  }, 60_000);
});
