// W4 in the QAIRT converter's form (src/quant/w4-qdq.ts): int4 codes → DequantizeLinear(axis 1,
// block_size 32) → Gemm in an opset-21 graph, holding the codes and scales of the MatMulNBits W4
// form, so ONNX Runtime's CPU (node and python) gives both forms the same numbers, and the CPU-gate
// form keeps them. What the QAIRT converter makes of it is the stand-in's to check
// (test/qnn/qairt-w4.test.ts), not this file's.
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as ort from 'onnxruntime-node';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { f32ToBf16Array } from '../../src/io/dtype.js';
import { writeSafetensors } from '../../src/io/safetensors-writer.js';
import { GraphBuilder } from '../../src/onnx/builder.js';
import { writeModel } from '../../src/onnx/writer.js';
import { ExternalDataWriter } from '../../src/onnx/external.js';
import { readModel } from '../../src/onnx/reader.js';
import { WeightStore, type W8Form } from '../../src/quant/weights.js';
import { int4Codes, toOnnxInt4, W4_QDQ_OPSET } from '../../src/quant/w4-qdq.js';
import { CPU_GATE_SESSION_OPTIONS, writeGateModel } from '../../src/gates/cpu-form.js';
import { ensureVenv } from '../../src/toolchain/venv.js';
import { tempDir } from '../io/helpers.js';

const [N, K] = [40, 96]; // three blocks of 32 along the in-features

/** One linear y = x·Wᵀ over a bf16 checkpoint matrix, stored by a WeightStore in w4 in the given form. */
async function w4Linear(dir: string, form: W8Form, m = 1) {
  const w = f32ToBf16Array(Float32Array.from({ length: N * K }, (_, i) => Math.sin((i + 1) * 0.731) * (0.02 + (i % 5) * 0.01)));
  w.fill(0, K, K + 32); // row 1, block 0: all zero (unit scale, the zero code)
  await writeSafetensors(join(dir, 'model.safetensors'), [{ name: 'w', dtype: 'BF16', shape: [N, K], data: w }]);
  const ckpt = await openCheckpoint(dir);
  const sink = new ExternalDataWriter(join(dir, `${form}.data`));
  const store = new WeightStore(ckpt, sink, { w8Form: form });
  const g = new GraphBuilder(form, form === 'qdq' ? { opsets: { '': W4_QDQ_OPSET } } : {});
  g.output(await store.linear(g, g.input('x', 'float32', [1, m, K]), 'w', [N, K], 'w4', m), 'y', { shape: [1, m, N] });
  await sink.commitAsync();
  await ckpt.close();
  const path = join(dir, `${form}.onnx`);
  writeModel(g, path, { externalThreshold: Infinity });
  return { path, g, store };
}

/** x: the identity rows (each output row is one weight column, exactly: every other product is 0·w) then random rows. */
function inputs(m: number): Float32Array {
  const x = new Float32Array(m * K);
  for (let i = 0; i < Math.min(m, K); i++) x[i * K + i] = 1;
  for (let i = K * K; i < x.length; i++) x[i] = Math.cos(i * 0.37);
  return x;
}

async function run(path: string, x: Float32Array, m: number, options: ort.InferenceSession.SessionOptions = CPU_GATE_SESSION_OPTIONS): Promise<Float32Array> {
  const s = await ort.InferenceSession.create(path, options);
  try {
    return (await s.run({ x: new ort.Tensor('float32', x, [1, m, K]) })).y.data as Float32Array;
  } finally {
    await s.release();
  }
}

describe('W4 in QDQ form (the QAIRT path)', () => {
  it('stores MatMulNBits\' codes as ONNX int4 (each nibble\'s top bit flipped: q + 8 → q) and the same scales, as [N, K] and [N, K/32]', async () => {
    const dir = await tempDir();
    const nbits = await w4Linear(dir, 'matmulnbits');
    const qdq = await w4Linear(dir, 'qdq');
    const data = (form: string) => readFileSync(join(dir, `${form}.data`));
    const inits = (g: GraphBuilder) => Object.fromEntries(g.initializers().map((i) => [i.name, i]));
    const [a, b] = [inits(nbits.g), inits(qdq.g)];
    expect([b.w.dtype, b.w.dims, b['w.scale'].dims]).toEqual(['int4', [N, K], [N, K / 32]]);
    expect([a.w.dtype, a.w.dims]).toEqual(['uint8', [N, K / 32, 16]]);
    const bytes = (d: Buffer, r: { offset: number; length: number }) => new Uint8Array(d.subarray(r.offset, r.offset + r.length));
    const codesA = bytes(data('matmulnbits'), a.w.external!);
    const codesB = bytes(data('qdq'), b.w.external!);
    expect(codesB).toEqual(toOnnxInt4(codesA.slice()));
    expect(bytes(data('qdq'), b['w.scale'].external!)).toEqual(bytes(data('matmulnbits'), a['w.scale'].external!));
    const codes = int4Codes(codesB);
    expect(Math.min(...codes)).toBe(-7); // symmetric: -8 never used
    expect(Math.max(...codes)).toBe(7);
    expect([...codes.subarray(K, K + 32)].every((c) => c === 0)).toBe(true);
    expect(qdq.store.precisions()).toEqual([{ tensor: 'w', shape: [N, K], scheme: 'w4' }]);
    const dq = qdq.g.toModelProto();
    expect(dq.irVersion).toBe(10);
    expect(dq.opsetImport).toContainEqual({ domain: '', version: 21 });
    expect(dq.graph!.node!.map((n) => n.opType)).toEqual(['DequantizeLinear', 'Reshape', 'Gemm', 'Reshape']);
    expect(Object.fromEntries(dq.graph!.node![0].attribute!.map((x) => [x.name, Number(x.i)]))).toEqual({ axis: 1, block_size: 32 });
  });

  it('runs on ONNX Runtime\'s CPU (node) with MatMulNBits\' numbers: the same weights exactly, the same products within float rounding', async () => {
    const dir = await tempDir();
    const m = K + 3;
    const { path: a } = await w4Linear(dir, 'matmulnbits', m);
    const { path: b } = await w4Linear(dir, 'qdq', m);
    const x = inputs(m);
    const [ya, yb] = [await run(a, x, m), await run(b, x, m)];
    // Identity rows: every weight, dequantized by each form, bit for bit.
    expect(yb.subarray(0, K * N)).toEqual(ya.subarray(0, K * N));
    // Random rows: MatMulNBits' CPU kernel may sum in its own order; the products agree to float rounding.
    for (let i = K * N; i < ya.length; i++) expect(Math.abs(yb[i] - ya[i])).toBeLessThan(1e-6); // bit-equal here with ORT 1.30
  });

  it('runs on ONNX Runtime\'s CPU (python, the oracle\'s) with the same weights as node\'s', async () => {
    const dir = await tempDir();
    const m = K;
    const { path } = await w4Linear(dir, 'qdq', m);
    const x = inputs(m);
    writeFileSync(join(dir, 'x.bin'), x);
    const script = [
      'import sys, numpy as np, onnxruntime as ort',
      'so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC',
      `x = np.fromfile(sys.argv[2], dtype=np.float32).reshape(1, ${m}, ${K})`,
      "y = ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider']).run(None, {'x': x})[0]",
      'sys.stdout.buffer.write(np.ascontiguousarray(y, dtype=np.float32).tobytes())',
    ].join('\n');
    const out = execFileSync(await ensureVenv(), ['-c', script, path, join(dir, 'x.bin')], { maxBuffer: 1 << 24 });
    const py = new Float32Array(out.buffer, out.byteOffset, out.byteLength / 4);
    expect(py).toEqual(await run(path, x, m));
  }, 60_000);

  it('passes through the CPU-gate form unchanged and with its own numbers, one token and several', async () => {
    const dir = await tempDir();
    for (const m of [1, 4]) {
      const { path } = await w4Linear(dir, 'qdq', m);
      const { path: form, stats } = writeGateModel(path, [], join(dir, `form${m}`), { tokensPerCall: m });
      expect(stats).toMatchObject({ matMulNBits: 0, castGemm: 0, kept: [] });
      expect(readModel(form).nodes().map((n) => n.opType)).toEqual(['DequantizeLinear', 'Reshape', 'Gemm', 'Reshape']);
      const x = Float32Array.from({ length: m * K }, (_, i) => Math.sin(i));
      expect(await run(form, x, m)).toEqual(await run(path, x, m));
    }
  });

  it('refuses to build the form into a graph below opset 21, naming the tensor', async () => {
    const dir = await tempDir();
    await writeSafetensors(join(dir, 'model.safetensors'), [{ name: 'layer.w', dtype: 'BF16', shape: [N, K], data: f32ToBf16Array(new Float32Array(N * K).fill(0.5)) }]);
    const ckpt = await openCheckpoint(dir);
    const store = new WeightStore(ckpt, new ExternalDataWriter(join(dir, 'w.data')), { w8Form: 'qdq' });
    const g = new GraphBuilder('g17');
    await expect(store.linear(g, g.input('x', 'float32', [1, 1, K]), 'layer.w', [N, K], 'w4', 1)).rejects.toThrow(/layer\.w: W4 in QDQ form .*needs opset 21; graph g17 imports 17/);
    await ckpt.close();
  });
});

describe('a graph built at opset 21', () => {
  it('spells the ops graph code writes at opset 17 the opset-18 way: Reduce axes as an input, an equal Split with num_outputs', async () => {
    const build = (opset?: number) => {
      const g = new GraphBuilder('g', opset ? { opsets: { '': opset } } : {});
      const x = g.input('x', 'float32', [1, 2, 4]);
      const [a, b] = g.op('Split', [g.op('ReduceMean', [x], { axes: [-1], keepdims: 1 })], { axis: 1 }, 2);
      g.output(g.op('Add', [a, b]), 'y', { shape: [1, 1, 1] });
      return g.toModelProto();
    };
    const at21 = build(21).graph!.node!;
    expect(at21[0].input).toHaveLength(2);
    expect(at21[0].attribute!.map((a) => a.name)).toEqual(['keepdims']);
    expect(at21[1].attribute!.map((a) => a.name).sort()).toEqual(['axis', 'num_outputs']);
    expect(build().graph!.node![0].attribute!.map((a) => a.name).sort()).toEqual(['axes', 'keepdims']);
    const x = new ort.Tensor('float32', Float32Array.from([1, 2, 3, 4, 5, 6, 7, 8]), [1, 2, 4]);
    const y = async (m: ReturnType<typeof build>) => {
      const s = await ort.InferenceSession.create(Buffer.from((await import('../../src/onnx/proto.js')).onnx.ModelProto.encode(m).finish()));
      const r = (await s.run({ x })).y.data as Float32Array;
      await s.release();
      return [...r];
    };
    expect(await y(build(21))).toEqual(await y(build()));
    expect(await y(build())).toEqual([2.5 + 6.5]);
  });
});
