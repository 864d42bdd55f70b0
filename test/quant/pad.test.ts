// Zero-padded in-features (quant/pad.ts): a W8 or W4 matrix whose in-features MatMulNBits' block
// does not divide is stored with zero columns and its input padded in the graph (Pad → MatMulNBits),
// giving the unpadded matrix's numbers; the planner counts the bytes written; the precision map says
// padded; the CPU-gate form takes the graph; the QDQ W8 form needs no padding.
import { join } from 'node:path';
import { writeFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import * as ort from 'onnxruntime-node';
import { K_MULTIPLE, padColumns, padTo } from '../../src/quant/pad.js';
import { dequantizeRows, quantizeRows, w8Precision } from '../../src/quant/w8.js';
import { dequantizeW4Rows, quantizeW4Rows, W4_BLOCK } from '../../src/quant/w4.js';
import { storedBytes } from '../../src/quant/bytes.js';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { bf16ToF32Array, f32ToBf16Array } from '../../src/io/dtype.js';
import { writeSafetensors } from '../../src/io/safetensors-writer.js';
import { GraphBuilder, MS_DOMAIN } from '../../src/onnx/builder.js';
import { writeModel } from '../../src/onnx/writer.js';
import { ExternalDataWriter } from '../../src/onnx/external.js';
import { onnx } from '../../src/onnx/proto.js';
import { WeightStore, type W8Form } from '../../src/quant/weights.js';
import { CPU_GATE_SESSION_OPTIONS, writeGateModel } from '../../src/gates/cpu-form.js';
import { tempDir } from '../io/helpers.js';
import { W4_QDQ_OPSET } from '../../src/quant/w4-qdq.js';

const ROWS = 40;
const TOKENS = 3;
/** The twin's odd in-features (o_proj 3 heads × 40, down_proj 150) and one a multiple of 16 but not of 32. */
const MATS: Array<[string, number]> = [['o_proj', 120], ['down_proj', 150], ['k48', 48]];

const weights = (cols: number, seed: number) => f32ToBf16Array(Float32Array.from({ length: ROWS * cols }, (_, i) => Math.sin((i + 1) * seed * 0.731) * 0.05 * (1 + (i % 5))));
const input = (cols: number) => Float32Array.from({ length: TOKENS * cols }, (_, i) => Math.cos(i / 3) * (1 + (i % 4)));

/** One graph of every MATS matrix through one store, x_<name> [1, TOKENS, K] → y_<name>. */
async function build(dir: string, scheme: 'w8' | 'w4', w8Form: W8Form = 'matmulnbits', opset?: number) {
  await writeSafetensors(join(dir, 'model.safetensors'), MATS.map(([name, cols], i) => ({ name, dtype: 'BF16' as const, shape: [ROWS, cols], data: weights(cols, i + 1) })));
  const ckpt = await openCheckpoint(dir);
  const sink = new ExternalDataWriter(join(dir, 'm.data'));
  const store = new WeightStore(ckpt, sink, { w8Form });
  const g = new GraphBuilder('padded', opset ? { opsets: { '': opset } } : {});
  for (const [name, cols] of MATS) g.output(await store.linear(g, g.input(`x_${name}`, 'float32', [1, TOKENS, cols]), name, [ROWS, cols], scheme, TOKENS), `y_${name}`, { shape: [1, TOKENS, ROWS] });
  await sink.commitAsync();
  await ckpt.close();
  const model = join(dir, 'm.onnx');
  writeModel(g, model, { externalThreshold: Infinity });
  return { store, proto: g.toModelProto(), model };
}

async function run(model: string, options: ort.InferenceSession.SessionOptions = {}): Promise<Record<string, Float32Array>> {
  const sess = await ort.InferenceSession.create(model, options);
  try {
    const feeds = Object.fromEntries(MATS.map(([name, cols]) => [`x_${name}`, new ort.Tensor('float32', input(cols), [1, TOKENS, cols])]));
    const out = await sess.run(feeds);
    return Object.fromEntries(Object.entries(out).map(([k, v]) => [k, (v.data as Float32Array).slice()]));
  } finally {
    await sess.release();
  }
}

/** x · dqᵀ over the first `cols` columns of dq [ROWS, stride], in float64. */
function matmul(x: Float32Array, dq: Float32Array, cols: number, stride: number): Float64Array {
  const y = new Float64Array(TOKENS * ROWS);
  for (let t = 0; t < TOKENS; t++) for (let r = 0; r < ROWS; r++) {
    let s = 0;
    for (let k = 0; k < cols; k++) s += x[t * cols + k] * dq[r * stride + k];
    y[t * ROWS + r] = s;
  }
  return y;
}

const bytesOf = (t: onnx.ITensorProto) => t.dims!.reduce((a, d) => a * Number(d), 1) * (t.dataType === onnx.TensorProto.DataType.FLOAT ? 4 : 1);

describe('padded in-features: the precision and its bytes', () => {
  it('pads to the next multiple of the block: W4 32, W8 16 (MatMulNBits); the QDQ W8 form never', () => {
    expect([padTo(120, 32), padTo(150, 32), padTo(120, 16), padTo(150, 16), padTo(128, 16)]).toEqual([128, 160, 128, 160, 128]);
    expect(K_MULTIPLE).toEqual({ 4: W4_BLOCK, 8: 16 });
    expect(w8Precision(2560)).toEqual({ scheme: 'w8' });
    expect(w8Precision(150)).toEqual({ scheme: 'w8', paddedTo: 160, why: 'in-features 150 zero-padded to 160 (MatMulNBits blocks of 16 or more)' });
    expect(w8Precision(120, 'qdq')).toEqual({ scheme: 'w8' });
    expect(padColumns(Float32Array.from([1, 2, 3, 4, 5, 6]), 3, 5, new Float32Array(10))).toEqual(Float32Array.from([1, 2, 3, 0, 0, 4, 5, 6, 0, 0]));
  });

  it('plans no refusal for in-features no block divides, under every scheme', () => {
    const t = (k: number) => ({ name: `m${k}`, shape: [64, k], role: 'matmul' as const });
    for (const k of [1, 7, 40, 120, 150, 2040]) for (const s of ['fp32', 'fp16', 'w8', 'w4'] as const) expect(storedBytes(t(k), s), `${s} K=${k}`).toBeGreaterThan(0);
    expect(storedBytes(t(150), 'w8')).toBe(64 * 160 + 64 * (160 / 32) * 4); // codes over 160, block 32's scales
    expect(storedBytes(t(120), 'w4')).toBe(64 * 128 / 2 + 64 * 4 * 4);
  });
});

describe.each(['w8', 'w4'] as const)('WeightStore in %s on padded in-features', (scheme) => {
  it('pads the input in the graph (Pad, constant 0) before MatMulNBits on the padded weight, writes what the plan counts, and records the padding', async () => {
    const dir = await tempDir();
    const { store, proto, model } = await build(dir, scheme);
    const g = proto.graph!;
    const bits = scheme === 'w4' ? 4 : 8;
    const padded = MATS.map(([, k]) => (scheme === 'w8' && k % 16 === 0 ? k : padTo(k, K_MULTIPLE[bits])));
    const nbits = g.node!.filter((n) => n.opType === 'MatMulNBits').map((n) => Object.fromEntries(n.attribute!.map((a) => [a.name, Number(a.i)])));
    expect(nbits.map((a) => a.K)).toEqual(padded);
    expect(nbits.every((a) => a.bits === bits)).toBe(true);
    const pads = g.node!.filter((n) => n.opType === 'Pad');
    expect(pads.length).toBe(padded.filter((k, i) => k !== MATS[i][1]).length);
    for (const p of pads) expect(p.attribute!.find((a) => a.name === 'mode')!.s).toEqual(new TextEncoder().encode('constant'));
    expect(store.precisions()).toEqual(MATS.map(([name, k], i) => ({
      tensor: name, shape: [ROWS, k], scheme,
      ...(padded[i] !== k ? { paddedTo: padded[i], why: expect.stringContaining(`in-features ${k} zero-padded to ${padded[i]}`) } : {}),
    })));
    // The plan's bytes are the bytes written: codes and scales of each matrix.
    for (const [name, k] of MATS) {
      const written = g.initializer!.filter((t) => t.name === name || t.name === `${name}.scale`).reduce((a, t) => a + bytesOf(t), 0);
      expect(written, name).toBe(storedBytes({ name, shape: [ROWS, k], role: 'matmul' }, scheme));
    }
  }, 60_000);

  it('gives the unpadded matrix\'s numbers on the CPU: x · dequant(W)ᵀ over the real in-features, and MatMulNBits on the unpadded K bit for bit', async () => {
    const dir = await tempDir();
    const { proto, model } = await build(dir, scheme);
    const got = await run(model);
    for (const [i, [name, k]] of MATS.entries()) {
      const w = bf16ToF32Array(weights(k, i + 1));
      const node = proto.graph!.node!.find((n) => n.opType === 'MatMulNBits' && n.input![1] === name)!;
      const kp = Number(node.attribute!.find((a) => a.name === 'K')!.i);
      // Dequantized here from the unpadded rows (W8: per row; W4: blocks of 32, the last one short).
      let dq: Float32Array;
      if (scheme === 'w8') {
        const q = new Int8Array(ROWS * k);
        const s = new Float32Array(ROWS);
        quantizeRows(w, k, q, s);
        dq = dequantizeRows(q, s, k);
      } else {
        const packed = new Uint8Array((ROWS * kp) / 2);
        const s = new Float32Array((ROWS * kp) / W4_BLOCK);
        quantizeW4Rows(padColumns(w, k, kp, new Float32Array(ROWS * kp)), kp, packed, s);
        const full = dequantizeW4Rows(packed, s);
        for (let r = 0; r < ROWS; r++) for (let c = k; c < kp; c++) expect(full[r * kp + c]).toBe(0); // the zero columns stay zero
        dq = new Float32Array(ROWS * k);
        for (let r = 0; r < ROWS; r++) dq.set(full.subarray(r * kp, r * kp + k), r * k);
      }
      const want = matmul(input(k), dq, k, k);
      const y = got[`y_${name}`];
      for (let j = 0; j < y.length; j++) expect(Math.abs(y[j] - want[j]), `${name}[${j}]`).toBeLessThan(1e-5);
    }
    // The same codes read by MatMulNBits with the unpadded K (ORT's CPU kernel takes a short last
    // block; the HTP does not): the padded graph's outputs exactly.
    const ragged = structuredClone(proto);
    ragged.graph!.node = ragged.graph!.node!.filter((n) => n.opType !== 'Pad');
    for (const n of ragged.graph!.node) {
      const k = MATS.find(([name]) => name === n.input![1])![1];
      n.input![0] = `x_${n.input![1]}`;
      n.attribute!.find((a) => a.name === 'K')!.i = k;
    }
    ragged.graph!.initializer = ragged.graph!.initializer!.filter((t) => !t.name!.endsWith('.pads'));
    const raggedPath = join(dir, 'ragged.onnx');
    writeFileSync(raggedPath, onnx.ModelProto.encode(ragged).finish());
    expect(await run(raggedPath)).toEqual(got);
  }, 60_000);

  it('keeps its numbers bit for bit in the CPU-gate form (the Pad kept, MatMulNBits rewritten), one token in row blocks and several whole', async () => {
    const dir = await tempDir();
    const { model } = await build(dir, scheme);
    const { path, stats } = writeGateModel(model, [], join(dir, 'form'), { tokensPerCall: TOKENS, blockBytes: 16 * 4 });
    expect(stats).toMatchObject({ matMulNBits: MATS.length, kept: [] });
    expect(await run(path, CPU_GATE_SESSION_OPTIONS)).toEqual(await run(model, CPU_GATE_SESSION_OPTIONS));
  }, 60_000);
});

describe('the QDQ W8 form (QAIRT) on odd in-features', () => {
  it('needs no padding: int8 DequantizeLinear(axis 0) → Gemm on the unpadded matrix, no Pad, no note', async () => {
    const dir = await tempDir();
    const { store, proto, model } = await build(dir, 'w8', 'qdq');
    expect(proto.graph!.node!.filter((n) => n.opType === 'Pad' || n.opType === 'MatMulNBits')).toEqual([]);
    expect(proto.graph!.initializer!.find((t) => t.name === 'down_proj')!.dims!.map(Number)).toEqual([ROWS, 150]);
    expect(store.precisions().every((p) => p.scheme === 'w8' && !p.why && !p.paddedTo)).toBe(true);
    const got = await run(model);
    const w = bf16ToF32Array(weights(150, 2));
    const q = new Int8Array(ROWS * 150);
    const s = new Float32Array(ROWS);
    quantizeRows(w, 150, q, s);
    const want = matmul(input(150), dequantizeRows(q, s, 150), 150, 150);
    for (let j = 0; j < want.length; j++) expect(Math.abs(got.y_down_proj[j] - want[j])).toBeLessThan(1e-5);
  }, 60_000);
});

describe('the QDQ W4 form (QAIRT) on odd in-features', () => {
  it('pads like MatMulNBits (the blocked DequantizeLinear needs whole blocks of 32): Pad → Gemm on the padded int4 weight, the unpadded matrix\'s numbers', async () => {
    const dir = await tempDir();
    const { store, proto, model } = await build(dir, 'w4', 'qdq', W4_QDQ_OPSET);
    expect(proto.graph!.node!.filter((n) => n.opType === 'MatMulNBits')).toEqual([]);
    expect(proto.graph!.node!.filter((n) => n.opType === 'Pad').length).toBe(MATS.length);
    expect(proto.graph!.initializer!.find((t) => t.name === 'down_proj')!.dims!.map(Number)).toEqual([ROWS, 160]);
    expect(store.precisions().find((p) => p.tensor === 'down_proj')).toMatchObject({ scheme: 'w4', paddedTo: 160 });
    const got = await run(model);
    for (const [i, [name, k]] of MATS.entries()) {
      const kp = padTo(k, W4_BLOCK);
      const packed = new Uint8Array((ROWS * kp) / 2);
      const s = new Float32Array((ROWS * kp) / W4_BLOCK);
      quantizeW4Rows(padColumns(bf16ToF32Array(weights(k, i + 1)), k, kp, new Float32Array(ROWS * kp)), kp, packed, s);
      const want = matmul(input(k), dequantizeW4Rows(packed, s), k, kp);
      const y = got[`y_${name}`];
      for (let j = 0; j < y.length; j++) expect(Math.abs(y[j] - want[j]), `${name}[${j}]`).toBeLessThan(1e-5);
    }
  }, 60_000);
});
