// The bf16 fast path of WeightStore (raw rows → SIMD W8 / f16 / f32, reads and writes pipelined)
// must write the bytes the f32 path writes for the same values: a bf16 checkpoint and its f32 widening
// go through the two paths and their data files are compared.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { bf16ToF32Array, f32ToBf16Array } from '../../src/io/dtype.js';
import { writeSafetensors } from '../../src/io/safetensors-writer.js';
import { GraphBuilder } from '../../src/onnx/builder.js';
import { writeModel } from '../../src/onnx/writer.js';
import { ExternalDataWriter } from '../../src/onnx/external.js';
import { F16Copy, WeightStore } from '../../src/quant/weights.js';
import { tempDir } from '../io/helpers.js';

// [rows, cols]: one chunk, several chunks (4 MiB of bf16 each: more than the reads kept ahead), the narrowest W8 row.
const TENSORS: Array<[string, number, number, 'w8' | 'fp16' | 'fp32']> = [
  ['small', 48, 64, 'w8'],
  ['big', 3000, 2048, 'w8'],
  ['narrow', 24, 16, 'w8'],
  ['ref', 2600, 2048, 'fp32'],
  ['ref_small', 40, 64, 'fp32'],
  ['emb', 1500, 1536, 'fp16'],
];

function values(rows: number, cols: number, seed: number): Uint16Array {
  const f = new Float32Array(rows * cols);
  let x = seed;
  for (let i = 0; i < f.length; i++) {
    x = (x * 1664525 + 1013904223) >>> 0;
    f[i] = (x / 2 ** 32 - 0.5) * 0.04 * (1 + (i % 3));
  }
  for (let c = 0; c < cols; c++) f[c] = 0; // an all-zero row
  f[cols] = 127; // a row on exact half steps (scale 1)
  for (let c = 1; c < cols; c++) f[cols + c] = (c % 200) - 100 + 0.5;
  return f32ToBf16Array(f);
}

async function exportWith(dir: string, dtype: 'BF16' | 'F32'): Promise<{ data: Buffer; copy: Buffer }> {
  const tensors = TENSORS.map(([name, rows, cols], i) => {
    const bits = values(rows, cols, i + 1);
    return { name, dtype, shape: [rows, cols], data: dtype === 'BF16' ? bits : bf16ToF32Array(bits) };
  });
  await writeSafetensors(join(dir, 'model.safetensors'), tensors);
  const ckpt = await openCheckpoint(dir);
  const sink = new ExternalDataWriter(join(dir, 'w.data'));
  const copy = new F16Copy('emb', new ExternalDataWriter(join(dir, 'emb.f16.bin'), { align: 1 }));
  const store = new WeightStore(ckpt, sink, { f16Copy: copy });
  const g = new GraphBuilder('t');
  const x = g.input('x', 'float32', [1, 1, 64]);
  for (const [name, rows, cols, scheme] of TENSORS) await store.linear(g, x, name, [rows, cols], scheme, 1);
  await sink.commitAsync();
  if (copy.written) await copy.sink.commitAsync();
  else copy.sink.abort(); // the f32 path makes no copy
  await ckpt.close();
  return { data: readFileSync(join(dir, 'w.data')), copy: dtype === 'BF16' ? readFileSync(join(dir, 'emb.f16.bin')) : Buffer.alloc(0) };
}

describe('WeightStore on bf16 checkpoints', () => {
  it('writes the same W8 codes, scales, f32 and f16 bytes as the f32 path, and the tied copy equal to the stored fp16 tensor', async () => {
    const bf16 = await exportWith(await tempDir(), 'BF16');
    const f32 = await exportWith(await tempDir(), 'F32');
    expect(bf16.data.length).toBe(f32.data.length);
    expect(bf16.data.equals(f32.data)).toBe(true);
    // emb is stored last, at the end of the data file.
    expect(bf16.copy.length).toBe(1500 * 1536 * 2);
    expect(bf16.copy.equals(bf16.data.subarray(bf16.data.length - bf16.copy.length))).toBe(true);
  }, 60_000);
});

describe('the two W8 forms', () => {
  // One bf16 weight through both forms into a one-linear graph each, run on ORT's CPU EP.
  async function form(dir: string, w8Form: 'matmulnbits' | 'qdq') {
    const [rows, cols] = [96, 128];
    await writeSafetensors(join(dir, 'model.safetensors'), [{ name: 'w', dtype: 'BF16', shape: [rows, cols], data: values(rows, cols, 7) }]);
    const ckpt = await openCheckpoint(dir);
    const sink = new ExternalDataWriter(join(dir, 'm.data'));
    const store = new WeightStore(ckpt, sink, { w8Form });
    const g = new GraphBuilder('t');
    g.output(await store.linear(g, g.input('x', 'float32', [1, 1, cols]), 'w', [rows, cols], 'w8', 1), 'y', { shape: [1, 1, rows] });
    await sink.commitAsync();
    await ckpt.close();
    writeModel(g, join(dir, 'm.onnx'), { externalThreshold: Infinity });
    const ort = await import('onnxruntime-node');
    const sess = await ort.InferenceSession.create(join(dir, 'm.onnx'));
    const x = Float32Array.from({ length: cols }, (_, k) => Math.cos(k / 3));
    const y = (await sess.run({ x: new ort.Tensor('float32', x, [1, 1, cols]) })).y.data as Float32Array;
    await sess.release();
    return { y, data: readFileSync(join(dir, 'm.data')), ops: g.toModelProto().graph!.node!.map((n) => n.opType) };
  }

  it('QDQ (int8 → DequantizeLinear → Gemm) holds the MatMulNBits codes less 128 and computes the same outputs', async () => {
    const nbits = await form(await tempDir(), 'matmulnbits');
    const qdq = await form(await tempDir(), 'qdq');
    expect(nbits.ops).toContain('MatMulNBits');
    expect(qdq.ops).toContain('DequantizeLinear');
    expect(qdq.ops).not.toContain('MatMulNBits');
    const n = 96 * 128;
    const codes = new Int8Array(qdq.data.buffer, qdq.data.byteOffset, n);
    for (let i = 0; i < n; i++) if (codes[i] !== nbits.data[i] - 128) throw new Error(`code ${i}: qdq ${codes[i]}, MatMulNBits ${nbits.data[i]} - 128`);
    // The per-row scales (QDQ) are MatMulNBits' per-block scales taken once per row.
    const qs = new Float32Array(qdq.data.buffer.slice(qdq.data.byteOffset + n, qdq.data.byteOffset + n + 96 * 4));
    const ns = new Float32Array(nbits.data.buffer.slice(nbits.data.byteOffset + n, nbits.data.byteOffset + nbits.data.length));
    expect(Array.from(qs)).toEqual(Array.from({ length: 96 }, (_, r) => ns[r * (ns.length / 96)]));
    let worst = 0;
    for (let i = 0; i < qdq.y.length; i++) worst = Math.max(worst, Math.abs(qdq.y[i] - nbits.y[i]) / (Math.abs(nbits.y[i]) + 1e-3));
    expect(worst).toBeLessThan(1e-5);
  }, 60_000);
});

describe('a row range of a weight', () => {
  // rows [first, end) of one [96, 128] weight stored alone (Gemma 4's per-shard slice of the PLE
  // projection) give the full linear's outputs first..end-1: per scheme, from bf16 and f32 bytes
  // (the SIMD stream and the row-chunk paths), on ORT's CPU EP.
  const [rows, cols, first, end] = [96, 128, 32, 80];
  async function run(dir: string, dtype: 'BF16' | 'F32', scheme: 'w8' | 'w4' | 'fp16' | 'fp32', range?: readonly [number, number]) {
    const bits = values(rows, cols, 11);
    await writeSafetensors(join(dir, 'model.safetensors'), [{ name: 'w', dtype, shape: [rows, cols], data: dtype === 'BF16' ? bits : bf16ToF32Array(bits) }]);
    const ckpt = await openCheckpoint(dir);
    const sink = new ExternalDataWriter(join(dir, 'm.data'));
    const store = new WeightStore(ckpt, sink);
    const g = new GraphBuilder('t');
    const out = range ? range[1] - range[0] : rows;
    g.output(await store.linear(g, g.input('x', 'float32', [1, 1, cols]), 'w', [rows, cols], scheme, 1, undefined, range), 'y', { shape: [1, 1, out] });
    await sink.commitAsync();
    await ckpt.close();
    writeModel(g, join(dir, 'm.onnx'), { externalThreshold: Infinity });
    const ort = await import('onnxruntime-node');
    const sess = await ort.InferenceSession.create(join(dir, 'm.onnx'));
    const x = Float32Array.from({ length: cols }, (_, k) => Math.sin(k / 5));
    const y = (await sess.run({ x: new ort.Tensor('float32', x, [1, 1, cols]) })).y.data as Float32Array;
    await sess.release();
    return { y, bytes: readFileSync(join(dir, 'm.data')).length };
  }

  for (const dtype of ['BF16', 'F32'] as const) {
    for (const scheme of ['w8', 'w4', 'fp16', 'fp32'] as const) {
      it(`${scheme} from ${dtype}: the outputs of those rows, from the bytes of those rows only`, async () => {
        const whole = await run(await tempDir(), dtype, scheme);
        const part = await run(await tempDir(), dtype, scheme, [first, end]);
        expect(part.y.length).toBe(end - first);
        for (let r = first; r < end; r++) expect(part.y[r - first]).toBeCloseTo(whole.y[r], 5);
        expect(part.bytes).toBeLessThan(whole.bytes * ((end - first) / rows) + 4096);
      }, 60_000);
    }
  }

  it('refuses a range outside the tensor', async () => {
    const dir = await tempDir();
    await writeSafetensors(join(dir, 'model.safetensors'), [{ name: 'w', dtype: 'BF16', shape: [rows, cols], data: values(rows, cols, 3) }]);
    const ckpt = await openCheckpoint(dir);
    const store = new WeightStore(ckpt, new ExternalDataWriter(join(dir, 'm.data')));
    const g = new GraphBuilder('t');
    await expect(store.linear(g, g.input('x', 'float32', [1, 1, cols]), 'w', [rows, cols], 'w8', 1, undefined, [80, 100])).rejects.toThrow(/rows \[80, 100\) are not a row range of \[96,128\]/);
    await ckpt.close();
  });
});
