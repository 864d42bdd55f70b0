// The residual hand-off between contexts (recipe `handoff`): the oracle chains the shipped graphs
// with every hand-off rounded to f16 and chooses f16 only when no greedy decision moves; the handoff
// stage then gives the graphs f16 residual inputs and outputs with float32 inside.
import { describe, expect, it } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import * as ort from 'onnxruntime-node';
import { StepChain } from '../../src/gates/step-chain.js';
import { chooseHandoff, NO_HANDOFF } from '../../src/gates/oracle.js';
import { halfResidual, writeHandoffExport } from '../../src/quant/handoff.js';
import { roundToF16, f16BitsToF32 } from '../../src/io/dtype.js';
import { toFloat16 } from '../../src/onnx/dtype.js';
import { GraphBuilder, writeModel } from '../../src/onnx/index.js';
import { OnnxModel } from '../../src/onnx/reader.js';
import type { ExportManifest, GraphEntry } from '../../src/export/graphs.js';
import type { GateCase } from '../../src/families/types.js';

const shard = { name: 'shard0.decode', n: 1, stream: { input: 'hidden_in', from: null, output: 'hidden_out', to: 'final' } } as unknown as GraphEntry;
const stream1 = { input: 'hidden_in', from: 'h.2', output: 'hidden_out', to: 'final' };
const lmHead = { name: 'lm_head', n: 1, stream: { input: 'hidden', from: 'final' } } as unknown as GraphEntry;
const f32 = (...v: number[]) => Float32Array.from(v);
const hfCase = (input: string, step: number, hf: Float32Array, expected: GateCase['expected']): GateCase =>
  ({ prompt: 0, step, feeds: { [input]: { dtype: 'float32', data: hf, dims: [1, 1, hf.length] } }, expected });
async function* of(...cases: GateCase[]) { yield* cases; }
const collect = async (it: AsyncIterable<GateCase>) => { const out: GateCase[] = []; for await (const c of it) out.push(c); return out; };
const greedy = () => true;

/** One step through shard → lm-head with the given shard output and lm-head logits; HF's logits are (3, 1, 0). */
async function chainOf(round: boolean, shardOut: Float32Array, logits: Float32Array): Promise<StepChain> {
  const chain = new StepChain(greedy, round ? roundToF16 : undefined);
  chain.record(shard, hfCase('hidden_in', 0, f32(1 / 3, 7), { hidden_out: f32(0) }), () => shardOut);
  const [c] = await collect(chain.cases(lmHead, of(hfCase('hidden', 0, f32(0, 0), { logits: f32(3, 1, 0) }))));
  chain.record(lmHead, c, () => logits);
  return chain;
}

describe('the f16 hand-off chain', () => {
  it('hands each graph the previous one\'s output rounded to f16, as an f16 binding would (past 65504: Inf)', async () => {
    const chain = new StepChain(greedy, roundToF16);
    chain.record(shard, hfCase('hidden_in', 0, f32(1, 1, 1), { hidden_out: f32(0) }), () => f32(0.1, 65519, 70000));
    const [next] = await collect(chain.cases(lmHead, of(hfCase('hidden', 0, f32(0, 0, 0), { logits: f32(3, 1, 0) }))));
    // 0.1 to the nearest f16 (0x2e66); 65519 down to the largest f16; 70000 past the range.
    expect(next.feeds.hidden.data).toEqual(f32(f16BitsToF32(0x2e66), 65504, Infinity));
  });

  it("leaves the first graph's input alone: the host's float32 rows are not a hand-off, and its gate cases are the first link", async () => {
    await expect(collect(new StepChain(greedy, roundToF16).cases(shard, of(hfCase('hidden_in', 0, f32(1), {}))))).rejects.toThrow(/fed from a host table/);
  });
});

describe('chooseHandoff', () => {
  it('chooses f16 when the f16 chain picks HF\'s token wherever the float32 chain does', async () => {
    const c = chooseHandoff(await chainOf(false, f32(1, 1), f32(3, 1, 0)), await chainOf(true, f32(1, 1), f32(2.99, 1, 0)));
    expect(c.dtype).toBe('float16');
    expect(c.why).toMatch(/keep every greedy decision \(1\/1\)/);
    expect(c.f16.logitError).toBeCloseTo(0.01, 6);
  });

  it('keeps float32 when f16 loses a greedy decision, and says where each chain stood', async () => {
    const c = chooseHandoff(await chainOf(false, f32(1, 1), f32(3, 1, 0)), await chainOf(true, f32(1, 1), f32(0.5, 1, 0)));
    expect(c).toMatchObject({ dtype: 'float32', why: "f16 hand-offs pick HF's greedy token at 0/1 steps, float32 at 1/1" });
  });

  it('keeps float32 when a rounded hand-off overflowed into a non-finite logit', async () => {
    const c = chooseHandoff(await chainOf(false, f32(1, 1), f32(3, 1, 0)), await chainOf(true, f32(1, 1), f32(Infinity, 1, 0)));
    expect(c.dtype).toBe('float32');
    expect(c.why).toMatch(/non-finite/);
  });

  it('keeps float32 and says why where no graph hands the residual to another context (the host routes between them)', async () => {
    const c = chooseHandoff(await chainOf(false, f32(1, 1), f32(3, 1, 0)), await chainOf(true, f32(1, 1), f32(2.99, 1, 0)), false);
    expect(c).toMatchObject({ dtype: 'float32', why: NO_HANDOFF });
  });
});

describe('the handoff stage', () => {
  /** hidden_out = hidden_in · 3 + w, w an external initializer in its own data file. */
  function shardModel(dir: string): void {
    const g = new GraphBuilder('shard');
    const x = g.input('hidden_in', 'float32', [1, 1, 4]);
    const w = g.initializer('w', f32(0.5, -1, 2, 1e-3), [4], 'float32');
    g.output(g.op('Add', [g.op('Mul', [x, g.initializer('three', f32(3), [1], 'float32')]), w]), 'hidden_out', { shape: [1, 1, 4] });
    writeModel(g, join(dir, 'shard0.onnx'), { dataFile: 'shard0.bin', externalThreshold: 0 });
  }

  it('gives the residual a graph takes from and gives to another context as f16, float32 inside, and links every other file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-handoff-'));
    try {
      const src = join(dir, 'quantize'), out = join(dir, 'handoff');
      mkdirSync(src);
      shardModel(src);
      writeFileSync(join(src, 'embedding.f16.bin'), Buffer.alloc(16));
      writeFileSync(join(src, 'meta.json'), '{"stage":"quantize"}'); // the upstream cache entry's record
      // The same graph file as a second shard (fed by another context) and as the first (fed by the host).
      const io = { file: 'shard0.onnx', n: 1, inputs: [{ name: 'hidden_in', dtype: 'float32', shape: [1, 1, 4] }], outputs: [{ name: 'hidden_out', dtype: 'float32', shape: [1, 1, 4] }], probes: {} };
      const entry = { name: 'shard1.decode', stream: stream1, ...io };
      const manifest = { family: 'qwen3', contexts: [{ name: 'shard1', dataBytes: 0, graphs: [entry] }] } as unknown as ExportManifest;
      writeFileSync(join(src, 'graphs.json'), JSON.stringify(manifest));
      expect(writeHandoffExport(src, out, 'float16').rewritten).toEqual(['shard1.decode']);

      const written = JSON.parse(readFileSync(join(out, 'graphs.json'), 'utf8')) as ExportManifest;
      expect(written.contexts[0].graphs[0].inputs[0].dtype).toBe('float16');
      expect(written.contexts[0].graphs[0].outputs[0].dtype).toBe('float16');
      for (const f of ['embedding.f16.bin', 'shard0.bin']) expect(statSync(join(out, f)).ino).toBe(statSync(join(src, f)).ino);
      // Not the upstream entry's meta.json: the cache writes this entry's own there (through a link it would overwrite quantize's).
      expect(existsSync(join(out, 'meta.json'))).toBe(false);

      const x = f32(1 / 3, 100, -7.1, 0.25);
      const session = await ort.InferenceSession.create(join(out, 'shard0.onnx'));
      const y = (await session.run({ hidden_in: new ort.Tensor('float16', toFloat16(x), [1, 1, 4]) })).hidden_out;
      expect(y.type).toBe('float16');
      // Float32 inside: the f16 input widened, the sum rounded once to f16 at the output.
      const xr = roundToF16(x);
      const want = roundToF16(Float32Array.from(xr, (v, i) => Math.fround(Math.fround(v * 3) + [0.5, -1, 2, Math.fround(1e-3)][i])));
      const got = Float32Array.from(y.data as Uint16Array, (h) => f16BitsToF32(h));
      expect(got).toEqual(want);
      await session.release();

      // The first shard's input is the host's float32 rows: only its output becomes f16.
      const first = OnnxModel.load(join(src, 'shard0.onnx'));
      halfResidual(first, { file: 'shard0.onnx', stream: shard.stream! });
      expect(first.graph.input!.map((t) => `${t.name}:${t.type!.tensorType!.elemType}`)).toEqual(['hidden_in:1']);
      expect(first.graph.output!.map((t) => `${t.name}:${t.type!.tensorType!.elemType}`)).toEqual(['hidden_out:10']);

      // float32: nothing rewritten, graphs.json as it was.
      const same = join(dir, 'same');
      expect(writeHandoffExport(src, same, 'float32').rewritten).toEqual([]);
      expect(statSync(join(same, 'shard0.onnx')).ino).toBe(statSync(join(src, 'shard0.onnx')).ino);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses a graph whose named residual is not a float32 tensor of its interface', () => {
    const g = new GraphBuilder('bad');
    const x = g.input('x', 'int32', [1]);
    g.output(g.op('Identity', [x]), 'y', { shape: [1] });
    const dir = mkdtempSync(join(tmpdir(), 'forge-handoff-'));
    try {
      const file = join(dir, 'bad.onnx');
      writeModel(g, file);
      const stream = (input: string) => ({ file: 'bad.onnx', stream: { input, from: 'h.1', output: 'y', to: 'final' } }) as unknown as GraphEntry;
      expect(() => halfResidual(OnnxModel.load(file), stream('hidden_in'))).toThrow(/bad.onnx: no tensor hidden_in among the graph's inputs\/outputs/);
      expect(() => halfResidual(OnnxModel.load(file), stream('x'))).toThrow(/bad.onnx: x is element type 6, not float32/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
