// The CPU-gate form (src/gates/cpu-form.ts) must give each graph's own numbers: bit for bit against
// the graph as exported run under the same session options, on every traced step of both twins'
// graphs, with weights split into many row blocks so the split is exercised at twin size.
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import * as ort from 'onnxruntime-node';
import { build } from '../../src/build.js';
import { silentProgress } from '../../src/engine/progress.js';
import { cacheRoot } from '../../src/paths.js';
import { readCheckpointRef } from '../../src/hub/checkpoint-ref.js';
import { getFamily } from '../../src/families/index.js';
import type { Family } from '../../src/families/types.js';
import { GRAPHS_JSON, type ExportManifest, type GraphEntry } from '../../src/export/graphs.js';
import { Trace } from '../../src/gates/trace.js';
import { writeProbeModel } from '../../src/gates/probe.js';
import { CPU_GATE_SESSION_OPTIONS, gateSessionOptions, toCpuForm, windowRows, writeCpuFormExport, writeGateModel, WINDOW_GRANULE, type CpuFormStats } from '../../src/gates/cpu-form.js';
import { attentionMask, MASKED } from '../../src/families/blocks.js';
import { formOptions, gateForm, runGateCases } from '../../src/gates/oracle.js';
import { GraphBuilder, MS_DOMAIN } from '../../src/onnx/builder.js';
import { ExternalDataWriter } from '../../src/onnx/external.js';
import { onnx } from '../../src/onnx/proto.js';
import { OnnxModel, readModel } from '../../src/onnx/reader.js';
import type { RunRecord } from '../../src/engine/record.js';
import { quantizeW4Rows } from '../../src/quant/w4.js';

/** Outputs of one session over every gate case of a graph, in order. */
async function runCases(model: string, options: ort.InferenceSession.SessionOptions, cases: Array<Record<string, ort.Tensor>>): Promise<Array<Record<string, Float32Array>>> {
  const s = await ort.InferenceSession.create(model, options);
  try {
    const outs = [];
    for (const feeds of cases) {
      const r = await s.run(feeds);
      outs.push(Object.fromEntries(Object.entries(r).map(([k, v]) => [k, (v.data as Float32Array).slice()])));
    }
    return outs;
  } finally {
    await s.release();
  }
}

interface Diff { values: number; unequal: number; maxAbs: number }
function diff(a: Array<Record<string, Float32Array>>, b: Array<Record<string, Float32Array>>): Diff {
  const d = { values: 0, unequal: 0, maxAbs: 0 };
  a.forEach((outs, i) => {
    for (const [name, x] of Object.entries(outs)) {
      const y = b[i][name];
      expect(y, `output ${name}`).toBeDefined();
      expect(y.length).toBe(x.length);
      for (let j = 0; j < x.length; j++) {
        d.values++;
        if (!Object.is(x[j], y[j])) {
          d.unequal++;
          d.maxAbs = Math.max(d.maxAbs, Math.abs(x[j] - y[j]));
        }
      }
    }
  });
  return d;
}

const twins = [
  { recipe: 'tiny-qwen3', family: 'qwen3' as const },
  { recipe: 'tiny-qwen3.5', family: 'qwen3_5' as const },
];

describe.each(twins)('CPU-gate form on $recipe', ({ recipe, family: familyId }) => {
  let record: RunRecord;
  const entry = (id: string) => join(cacheRoot(), id, record.stages.find((s) => s.name === id)!.key!);
  const graphsOf = (dir: string) => (JSON.parse(readFileSync(join(dir, GRAPHS_JSON), 'utf8')) as ExportManifest);

  beforeAll(async () => {
    record = await build({ recipe, arch: 'v81', until: 'oracle', out: mkdtempSync(join(tmpdir(), 'forge-cpuform-')), progress: silentProgress });
    expect(record.stages.find((s) => s.name === 'quantize')?.status).toMatch(/ran|cached/);
  }, 900_000);

  /** Every graph of the fp32 and W8 exports: its gate cases as ORT feeds, in the gate's order. */
  async function eachGraph(fn: (dir: string, g: GraphEntry, cases: Array<Record<string, ort.Tensor>>, maxContext: number) => Promise<void>): Promise<number> {
    const family = getFamily(familyId) as Family<unknown>;
    const config = family.parseConfig(JSON.parse(readFileSync(join(readCheckpointRef(entry('fetch')).absDir, 'config.json'), 'utf8')), 'config.json');
    const trace = await Trace.open(entry('trace'));
    let graphs = 0;
    try {
      for (const dir of [entry('export'), entry('quantize')]) {
        const m = graphsOf(dir);
        for (const c of m.contexts) for (const g of c.graphs) {
          const cases: Array<Record<string, ort.Tensor>> = [];
          // Copies: gateCases may reuse its buffers from case to case (the KV cache grows in place).
          for await (const k of family.gateCases(config, g, trace, m.maxContext, dir)) {
            cases.push(Object.fromEntries(Object.entries(k.feeds).map(([n, f]) => [n, new ort.Tensor(f.dtype, f.data.slice(), f.dims)])));
          }
          expect(cases.length, g.name).toBeGreaterThan(0);
          await fn(dir, g, cases, m.maxContext);
          graphs++;
        }
      }
    } finally {
      await trace.close();
    }
    return graphs;
  }

  it('gives every graph its own outputs bit for bit, probes included, at every traced step, with weights split into 16-row blocks', async () => {
    // The reference: a W8 graph (MatMulNBits) as the gate ran it before the CPU form (level basic,
    // ORT's defaults); any other graph as exported under the gate's session options.
    const scratch = mkdtempSync(join(tmpdir(), 'forge-cpuform-'));
    const seen: Record<string, CpuFormStats> = {};
    let compared = 0;
    const graphs = await eachGraph(async (dir, g, cases) => {
      const probes = Object.keys(g.probes);
      // A scratch per export: both name their data files alike (shard0.data), and a copy's data is a link.
      const variant = dir === entry('export') ? 'fp32' : 'w8';
      const plain = writeProbeModel(join(dir, g.file), probes, join(scratch, variant, 'plain'));
      const w8 = readModel(plain).nodes().some((n) => n.opType === 'MatMulNBits');
      const before = await runCases(plain, w8 ? { graphOptimizationLevel: 'basic' } : CPU_GATE_SESSION_OPTIONS, cases);
      // blockBytes 1: 16-row blocks at the twins' widths, so every weight splits into several.
      const form = writeGateModel(join(dir, g.file), probes, join(scratch, variant, 'form'), { tokensPerCall: g.n, blockBytes: 1 });
      seen[`${variant}/${g.name}`] = form.stats;
      const d = diff(before, await runCases(form.path, CPU_GATE_SESSION_OPTIONS, cases));
      expect(d, `${dir}/${g.name}`).toEqual({ values: d.values, unequal: 0, maxAbs: 0 });
      compared += d.values;
    });
    expect(graphs).toBeGreaterThanOrEqual(6);
    expect(compared).toBeGreaterThan(0);
    // The W8 shard graphs lost every MatMulNBits; the decode graphs split them, the prefill graphs did not.
    const w8 = Object.entries(seen).filter(([k]) => k.startsWith('w8/shard'));
    expect(w8.length).toBeGreaterThanOrEqual(2);
    for (const [name, s] of w8) {
      expect(s.kept, name).toEqual([]);
      expect(s.matMulNBits, name).toBeGreaterThan(0);
      if (name.endsWith('.decode')) expect(s.blocks, name).toBeGreaterThan(s.matMulNBits);
      else expect(s.blocks, name).toBe(s.matMulNBits);
    }
    // The fp16 lm-head's Cast → Gemm is split too (one token per call).
    expect(Object.values(seen).reduce((n, s) => n + s.castGemm, 0)).toBeGreaterThan(0);
  }, 600_000);

  it('runs 3 teacher-forced cases per call in copies of each one-token graph, the KV cache fed once, whole or cut to the window the masks open, each case with its own numbers bit for bit', async () => {
    const scratch = mkdtempSync(join(tmpdir(), 'forge-cpuform-'));
    const family = getFamily(familyId) as Family<unknown>;
    const config = family.parseConfig(JSON.parse(readFileSync(join(readCheckpointRef(entry('fetch')).absDir, 'config.json'), 'utf8')), 'config.json');
    const trace = await Trace.open(entry('trace'));
    let batched = 0, compared = 0, sharedCaches = 0, cut = 0, windowedGraphs = 0;
    try {
      await eachGraph(async (dir, g, cases, maxContext) => {
        if (g.n !== 1) return;
        const variant = dir === entry('export') ? 'fp32' : 'w8';
        const probes = Object.keys(g.probes);
        // The reference: one case per call, each with its own cache, as the graph was exported.
        const plain = writeProbeModel(join(dir, g.file), probes, join(scratch, variant, 'plain'));
        const w8 = readModel(plain).nodes().some((n) => n.opType === 'MatMulNBits');
        const before = await runCases(plain, w8 ? { graphOptimizationLevel: 'basic' } : CPU_GATE_SESSION_OPTIONS, cases);
        for (const windowed of [false, true]) {
          const form = gateForm(g, 3, windowed);
          sharedCaches += form.shared.size;
          if (form.window) windowedGraphs++;
          const model = writeGateModel(join(dir, g.file), probes, join(scratch, variant, `copies-${windowed}`), formOptions(g, form, 1));
          const session = await ort.InferenceSession.create(model.path, gateSessionOptions(form.copies));
          const after: Array<Record<string, Float32Array>> = [];
          try {
            await runGateCases(session, g.file, family.gateCases(config, g, trace, maxContext, dir), form,
              (_c, output) => after.push(Object.fromEntries(Object.keys(before[0]).map((name) => [name, output(name).slice()]))),
              (n, _s, w) => {
                batched += n > 1 ? 1 : 0;
                cut += w !== undefined && w < maxContext ? 1 : 0;
              });
          } finally {
            await session.release();
          }
          expect(after.length, g.name).toBe(before.length);
          const d = diff(before, after);
          expect(d, `${variant}/${g.name} ${windowed ? 'windowed' : 'whole cache'}`).toEqual({ values: d.values, unequal: 0, maxAbs: 0 });
          compared += d.values;
        }
      });
    } finally {
      await trace.close();
    }
    expect(compared).toBeGreaterThan(0);
    expect(batched).toBeGreaterThan(0);
    expect(sharedCaches).toBeGreaterThan(0); // the decode graphs' K/V caches were fed once per call
    expect(windowedGraphs).toBeGreaterThan(0);
    expect(cut).toBeGreaterThan(0); // calls that read fewer cache rows than maxContext
  }, 900_000);

  it('moves the fp32 graphs off the previous gate\'s numbers (folded, prepacked weights) by float32 rounding only', async () => {
    const scratch = mkdtempSync(join(tmpdir(), 'forge-cpuform-'));
    const worst = { rel: 0, maxAbs: 0, values: 0, unequal: 0 };
    await eachGraph(async (dir, g, cases) => {
      if (dir !== entry('export')) return;
      const probes = Object.keys(g.probes);
      const before = await runCases(writeProbeModel(join(dir, g.file), probes, join(scratch, 'plain')), { graphOptimizationLevel: 'basic' }, cases);
      const after = await runCases(writeGateModel(join(dir, g.file), probes, join(scratch, 'form'), { tokensPerCall: g.n }).path, CPU_GATE_SESSION_OPTIONS, cases);
      const d = diff(before, after);
      let scale = 0;
      for (const outs of before) for (const x of Object.values(outs)) for (const v of x) scale = Math.max(scale, Math.abs(v));
      worst.rel = Math.max(worst.rel, d.maxAbs / scale);
      worst.maxAbs = Math.max(worst.maxAbs, d.maxAbs);
      worst.values += d.values;
      worst.unequal += d.unequal;
    });
    console.log(`fp32 graphs, previous gate vs CPU form: ${JSON.stringify(worst)}`);
    expect(worst.values).toBeGreaterThan(0);
    // A different SGEMM path (packed B vs the M=1 kernel) sums in another order: rounding-level differences.
    expect(worst.rel).toBeLessThan(1e-5);
  }, 600_000);

  it('writes a whole export directory in CPU form for a host bundle: same graph names, data files hard-linked', () => {
    const out = join(mkdtempSync(join(tmpdir(), 'forge-cpuform-')), 'cpu');
    const stats = writeCpuFormExport(entry('quantize'), out);
    const m = graphsOf(out);
    expect(m).toEqual(graphsOf(entry('quantize')));
    for (const c of m.contexts) {
      expect(statSync(join(out, c.data!)).ino).toBe(statSync(join(entry('quantize'), c.data!)).ino);
      for (const g of c.graphs) {
        expect(stats[g.name].kept).toEqual([]);
        const model = readModel(join(out, g.file));
        expect(model.nodes().some((n) => n.opType === 'MatMulNBits')).toBe(false);
        for (const t of model.initializers()) if (t.external) expect(t.external.location).toBe(c.data);
      }
    }
  });
});

// ---- the form's pieces on graphs built here --------------------------------------------------

const N = 200, K = 96;
let seed = 7;
const rnd = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32;

function bf16Weights(): Uint16Array {
  const f = new Float32Array(N * K).map(() => rnd() * 2 - 1);
  const u = new Uint32Array(f.buffer);
  return Uint16Array.from(u, (x) => x >>> 16);
}

/** x [M, K] → Gemm(x, Cast(w bf16 [N, K] external), transB=1) + a second use of x, written to dir. */
function castGemmModel(dir: string, M: number): string {
  const sink = new ExternalDataWriter(join(dir, 'w.data'));
  const ref = sink.append(new Uint8Array(bf16Weights().buffer));
  sink.commit();
  const g = new GraphBuilder('cast_gemm');
  const x = g.input('x', 'float32', [M, K]);
  const w = g.externalInitializer('w', 'bfloat16', [N, K], ref);
  const y = g.op('Gemm', [x, g.op('Cast', [w], { to: 1 }, 1, { dtype: 'float32' })], { transB: 1 });
  g.output(g.op('Relu', [y]), 'y', { dtype: 'float32', shape: [M, N] });
  const proto = g.toModelProto();
  const path = join(dir, 'model.onnx');
  writeFileSync(path, onnx.ModelProto.encode(proto).finish());
  return path;
}

const feedsOf = (M: number) => [{ x: new ort.Tensor('float32', new Float32Array(M * K).map(() => rnd() - 0.5), [M, K]) }];

describe('CPU-gate form pieces', () => {
  it('gives a call the cache window its masks open: every visible slot, rounded up to MLAS\'s K stride, at most the cache', () => {
    const ctx = 4096;
    const mask = (start: number) => attentionMask(ctx, 1, start);
    expect(WINDOW_GRANULE).toBe(128);
    expect(windowRows([mask(1)], ctx, MASKED)).toBe(128);
    expect(windowRows([mask(128)], ctx, MASKED)).toBe(128); // slots 0..127 visible
    expect(windowRows([mask(129)], ctx, MASKED)).toBe(256);
    expect(windowRows([mask(10), mask(300), mask(40)], ctx, MASKED)).toBe(384); // the widest case decides
    expect(windowRows([mask(4000)], ctx, MASKED)).toBe(4096);
    expect(windowRows([attentionMask(200, 1, 150)], 200, MASKED)).toBe(200); // never past the cache
    expect(() => windowRows([mask(5)], 1024, MASKED)).toThrow(/a mask of 4097 values, not ctx \+ 1 = 1025/);
  });

  it('splits Cast(bf16 weight) → Gemm into row blocks reading the same file, with the graph\'s own numbers', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-castgemm-'));
    const model = castGemmModel(dir, 1);
    const { path, stats } = writeGateModel(model, [], join(dir, 'form'), { tokensPerCall: 1, blockBytes: 32 * K * 4 });
    expect(stats).toMatchObject({ castGemm: 1, matMulNBits: 0, blocks: Math.ceil(N / 32), kept: [] });
    // The raw proto: forge's reader has no bfloat16.
    const inits = onnx.ModelProto.decode(readFileSync(path)).graph!.initializer!.filter((t) => t.externalData?.length); // not the inline gate shapes
    const ext = (t: onnx.ITensorProto) => Object.fromEntries(t.externalData!.map((e) => [e.key, e.value]));
    expect(inits.map((t) => ext(t).location)).toEqual(new Array(Math.ceil(N / 32)).fill('w.data'));
    expect(inits.map((t) => Number(ext(t).offset))).toEqual(Array.from({ length: Math.ceil(N / 32) }, (_, i) => i * 32 * K * 2));
    const feeds = feedsOf(1);
    const d = diff(await runCases(model, CPU_GATE_SESSION_OPTIONS, feeds), await runCases(path, CPU_GATE_SESSION_OPTIONS, feeds));
    expect(d).toEqual({ values: N, unequal: 0, maxAbs: 0 });
  });

  it('leaves a multi-row Cast → Gemm whole, its Cast waiting for the activation (Reshape through a shape gated on x)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-castgemm-'));
    const model = castGemmModel(dir, 4);
    const m = OnnxModel.load(model);
    expect(toCpuForm(m, { tokensPerCall: 4, blockBytes: 1 })).toMatchObject({ castGemm: 0, blocks: 0 });
    const nodes = m.graph.node!;
    expect(nodes.map((n) => n.opType)).toEqual(['Size', 'Greater', 'Where', 'Reshape', 'Cast', 'Gemm', 'Relu']);
    // The Cast's input is computed from x: ORT cannot run it before x exists.
    expect(nodes[0].input).toEqual(['x']);
    expect(nodes[4].input).toEqual(nodes[3].output);
    const out = join(dir, 'gated.onnx');
    writeFileSync(out, onnx.ModelProto.encode(m.proto).finish());
    const feeds = feedsOf(4);
    expect(diff(await runCases(model, CPU_GATE_SESSION_OPTIONS, feeds), await runCases(out, CPU_GATE_SESSION_OPTIONS, feeds))).toEqual({ values: 4 * N, unequal: 0, maxAbs: 0 });
  });

  it('keeps the Cast of a weight per call under the gate\'s session options (no constant folding into a private fp32 copy)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-castgemm-'));
    const model = castGemmModel(dir, 1);
    const optimized = async (options: ort.InferenceSession.SessionOptions, file: string) => {
      const s = await ort.InferenceSession.create(model, { ...options, optimizedModelFilePath: join(dir, file) });
      await s.release();
      return readModel(join(dir, file)).nodes().map((n) => n.opType);
    };
    expect(await optimized(CPU_GATE_SESSION_OPTIONS, 'gate.onnx')).toContain('Cast');
    // The control: ORT's default at level basic folds it.
    expect(await optimized({ graphOptimizationLevel: 'basic' }, 'basic.onnx')).not.toContain('Cast');
  });

  it('rewrites MatMulNBits(bits=4) (W4 blocks) with the node\'s own numbers bit for bit: one token in row blocks, several whole', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-mnb4-'));
    const [n, k] = [200, 96];
    const w = Float32Array.from({ length: n * k }, () => (rnd() * 2 - 1) * 0.05);
    w.fill(0, 0, 32); // an all-zero block
    const packed = new Uint8Array((n * k) / 2);
    const sc = new Float32Array((n * k) / 32);
    quantizeW4Rows(w, k, packed, sc);
    const sink = new ExternalDataWriter(join(dir, 'w.data'));
    const codesRef = sink.append(packed);
    const scalesRef = sink.append(new Uint8Array(sc.buffer));
    sink.commit();
    for (const M of [1, 4]) {
      const g = new GraphBuilder('mnb4');
      const x = g.input('x', 'float32', [1, M, k]);
      const codes = g.externalInitializer('codes', 'uint8', [n, k / 32, 16], codesRef);
      const scales = g.externalInitializer('scales', 'float32', [(n * k) / 32], scalesRef);
      g.output(g.op('MatMulNBits', [x, codes, scales], { K: k, N: n, bits: 4, block_size: 32 }, 1, { domain: MS_DOMAIN }), 'y', { dtype: 'float32', shape: [1, M, n] });
      const model = join(dir, `m${M}.onnx`);
      writeFileSync(model, onnx.ModelProto.encode(g.toModelProto()).finish());
      const { path, stats } = writeGateModel(model, [], join(dir, `form${M}`), { tokensPerCall: M, blockBytes: 32 * k * 4 });
      expect(stats).toMatchObject({ matMulNBits: 1, kept: [], blocks: M === 1 ? Math.ceil(n / 32) : 1 });
      const feeds = [1, 2, 3].map(() => ({ x: new ort.Tensor('float32', new Float32Array(M * k).map(() => rnd() - 0.5), [1, M, k]) }));
      expect(diff(await runCases(model, CPU_GATE_SESSION_OPTIONS, feeds), await runCases(path, CPU_GATE_SESSION_OPTIONS, feeds))).toEqual({ values: 3 * M * n, unequal: 0, maxAbs: 0 });
    }
  });

  it('keeps a MatMulNBits it cannot express per row (block-wise scales, 4 bits), naming the node and why', () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-mnb-'));
    const g = new GraphBuilder('mnb');
    const x = g.input('x', 'float32', [1, 1, 64]);
    const codes = g.initializer('codes', new Uint8Array(8 * 64).map(() => (rnd() * 256) | 0), [8, 2, 32], 'uint8');
    const scales = g.initializer('scales', Float32Array.from({ length: 16 }, (_, i) => 0.01 + i / 100), [16], 'float32');
    const y = g.op('MatMulNBits', [x, codes, scales], { K: 64, N: 8, bits: 8, block_size: 32 }, 1, { domain: MS_DOMAIN, name: 'blockwise' });
    g.output(y, 'y', { dtype: 'float32', shape: [1, 1, 8] });
    const path = join(dir, 'm.onnx');
    writeFileSync(path, onnx.ModelProto.encode(g.toModelProto()).finish());
    const m = OnnxModel.load(path);
    expect(toCpuForm(m, { tokensPerCall: 1 })).toEqual({ matMulNBits: 0, castGemm: 0, blocks: 0, kept: ['blockwise: row 0 has more than one scale (block-wise, not per-row W8)'] });
    expect(m.nodes().map((n) => n.opType)).toEqual(['MatMulNBits']);
  });
});
