// Gemma 4 (family gemma4): the tiny twin, text and images, built with every gate (oracle, host parity
// through gemma4_split_generate, the simulator; the runtime's image front-end against HF's), the graphs' interfaces (PLE inputs, per-type head
// sizes, ring caches of the sliding window, KV sharing as donor caches), the bindings, the subtle
// pieces by themselves (softcap, GELU-tanh, proportional RoPE, the PLE mixing, the ring mask), and
// the clean refusal of a build past the oracle for a family whose host-op the runtime lacks.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import * as ort from 'onnxruntime-node';
import { build } from '../src/build.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import type { ExportManifest } from '../src/export/graphs.js';
import type { OracleResult } from '../src/gates/oracle.js';
import { gemma4, geluTanh, invFreq, parseGemma4Config, softcap, type Gemma4Config } from '../src/families/gemma4.js';
import { ringMask } from '../src/families/gemma4-gates.js';
import { MASKED } from '../src/families/blocks.js';
import { runtimeHostOps } from '../pipelines/build.js';
import { readModel } from '../src/onnx/reader.js';
import type { Manifest } from '../src/bundle/manifest.js';
import { GraphBuilder, writeModel } from '../src/onnx/index.js';
import { buildPipeline, refuseWithoutHostOp } from '../pipelines/build.js';
import { loadRecipe, archSettings } from '../src/recipe/load.js';
import type { RunRecord } from '../src/engine/record.js';
import { componentTensors } from '../src/families/tensors.js';
import { checkFinite } from '../src/io/finite.js';

let record: RunRecord;
let out = '';
let seconds = 0;
const entry = (id: string) => join(cacheRoot(), id, record.stages.find((s) => s.name === id)!.key!);
const manifest = (dir: string) => JSON.parse(readFileSync(join(dir, 'graphs.json'), 'utf8')) as ExportManifest;
const graphs = (dir: string) => manifest(dir).contexts.flatMap((c) => c.graphs);
const names = (ts: Array<{ name: string }>) => ts.map((t) => t.name);
const rawConfig = () => JSON.parse(readFileSync(join(readCheckpointRef(entry('fetch')).absDir, 'config.json'), 'utf8'));
const config = (): Gemma4Config => parseGemma4Config(rawConfig(), 'config.json');

beforeAll(async () => {
  const t0 = performance.now();
  out = mkdtempSync(join(tmpdir(), 'forge-gemma4-'));
  record = await build({ recipe: 'tiny-gemma4', arch: 'v81', out, progress: silentProgress });
  seconds = (performance.now() - t0) / 1000;
  expect(record.error).toBeUndefined();
  expect(record.ok).toBe(true);
}, 1_800_000); // the trained twin is made first (a minute or two on two cores); the simulator gate ~80 s

describe('gemma4 config', () => {
  it("reads the twin's text_config: per-type head sizes, KV donors, PLE width, softcap, proportional RoPE", () => {
    const c = config();
    expect(c.layer.map((l) => l.type[0])).toEqual(['s', 's', 'f', 's', 's', 'f', 's', 'f']);
    expect(c.layer.map((l) => l.headDim)).toEqual([32, 32, 64, 32, 32, 64, 32, 64]);
    // The last 3 layers read the K/V of the last earlier layer of their type: 5 F <- 2, 6 S <- 4, 7 F <- 2.
    expect(c.layer.map((l) => l.kvFrom)).toEqual([0, 1, 2, 3, 4, 2, 4, 2]);
    expect(c).toMatchObject({ hidden: 64, ple: 16, slidingWindow: 16, softcap: 10, tied: true, embedScale: 8, pleScale: 4 });
    // Proportional: head_dim 64 x 0.25 / 2 = 8 rotated frequencies 1/θ^(2i/64), the other 24 zero.
    const full = c.invFreq.full_attention;
    expect(full.length).toBe(32);
    expect(full[1]).toBeCloseTo(1 / Math.pow(1e6, 2 / 64), 6); // float32, as HF
    expect(Array.from(full.subarray(8)).every((x) => x === 0)).toBe(true);
    expect(full[7]).toBeGreaterThan(0);
    expect(c.invFreq.sliding_attention[15]).toBeCloseTo(1 / Math.pow(1e4, 30 / 32), 6);
    expect(invFreq('proportional', 1e6, 512, 0.25).findIndex((x) => x === 0)).toBe(64); // E4B: rotated dims 0-63 (and 256-319)
  });

  it('refuses, naming the field, what the graphs do not build', () => {
    const bad = (edit: (t: any) => void) => { const r = rawConfig(); edit(r.text_config); return () => parseGemma4Config(r, 'c.json'); };
    expect(bad((t) => { t.enable_moe_block = true; })).toThrow(/text_config\.enable_moe_block/);
    expect(bad((t) => { t.attention_k_eq_v = true; })).toThrow(/text_config\.attention_k_eq_v/);
    expect(bad((t) => { t.hidden_activation = 'silu'; })).toThrow(/text_config\.hidden_activation/);
    expect(bad((t) => { t.layer_types = t.layer_types.slice(1); })).toThrow(/text_config\.layer_types: 7 entries for 8 layers/);
    expect(bad((t) => { t.num_kv_shared_layers = 8; })).toThrow(/text_config\.num_kv_shared_layers/);
    expect(bad((t) => { t.rope_parameters.full_attention.rope_type = 'yarn'; })).toThrow(/rope_parameters\.full_attention\.rope_type/);
  });
});

describe('gemma4 export', () => {
  it('writes shards taking the embedding rows and each layer\'s PLE rows, prefill (16 tokens) and decode; KV-shared layers read their donor\'s cache and write none', () => {
    const mf = manifest(entry('export'));
    // The vision encoder (the recipe reads images) is a context of its own, before the shards.
    expect(mf.contexts.map((c) => c.graphs.map((g) => g.name))).toEqual([['vision'], ['shard0.prefill', 'shard0.decode'], ['shard1.prefill', 'shard1.decode'], ['lm_head']]);
    const [s0, s1, head] = graphs(entry('export')).filter((g) => g.name !== 'vision' && !g.name.endsWith('.prefill'));
    expect(names(s0.inputs)).toEqual(['hidden_in', 'position', 'attn_mask', 'embeds', 'ple_0', 'ple_1', 'ple_2', 'attn_mask_sliding', 'past_k_0', 'past_v_0', 'past_k_1', 'past_v_1', 'past_k_2', 'past_v_2']);
    expect(names(s0.outputs)).toEqual(['hidden_out', 'new_k_0', 'new_v_0', 'new_k_1', 'new_v_1', 'new_k_2', 'new_v_2']);
    // Shard 1 (layers 3-7): layer 2's cache is read (donor of 5 and 7, in shard 0); layer 4 is donor of 6 in the same graph.
    expect(names(s1.inputs)).toEqual(['hidden_in', 'position', 'attn_mask', 'embeds', 'ple_3', 'ple_4', 'ple_5', 'ple_6', 'ple_7', 'attn_mask_sliding',
      'past_k_3', 'past_v_3', 'past_k_4', 'past_v_4', 'past_k_2', 'past_v_2']);
    expect(names(s1.outputs)).toEqual(['hidden_out', 'new_k_3', 'new_v_3', 'new_k_4', 'new_v_4']);
    const io = Object.fromEntries([...s0.inputs, ...s0.outputs, ...s1.inputs].map((t) => [t.name, t]));
    // Sliding: head_dim 32, a ring of the 16-token window plus 15 slots, so that a 16-token prefill
    // call never overwrites a position one of its rows still sees.
    expect(io.past_k_0).toMatchObject({ dtype: 'float32', shape: [1, 2, 31, 32] });
    expect(io.attn_mask_sliding).toMatchObject({ dtype: 'float32', shape: [1, 1, 1, 32] });
    expect(io.past_k_2).toMatchObject({ dtype: 'float32', shape: [1, 2, 256, 64] }); // full: head_dim 64
    expect(io.new_v_2).toMatchObject({ shape: [1, 2, 1, 64] });
    expect(io.ple_3).toMatchObject({ dtype: 'float32', shape: [1, 1, 16] });
    expect(io.embeds).toMatchObject({ shape: [1, 1, 64] });
    expect(names(head.inputs)).toEqual(['hidden']);
    expect(names(head.outputs)).toEqual(['logits']);
    // The prefill graphs: the same inputs and outputs for 16 tokens (the ring slots of each), the same caches.
    const p1 = graphs(entry('export')).find((g) => g.name === 'shard1.prefill')!;
    expect(names(p1.inputs)).toEqual(names(s1.inputs));
    expect(names(p1.outputs)).toEqual(names(s1.outputs));
    const pio = Object.fromEntries([...p1.inputs, ...p1.outputs].map((t) => [t.name, t]));
    expect(pio.hidden_in.shape).toEqual([1, 16, 64]);
    expect(pio.position.shape).toEqual([16]);
    expect(pio.attn_mask.shape).toEqual([1, 1, 16, 256 + 16]);
    expect(pio.attn_mask_sliding.shape).toEqual([1, 1, 16, 31 + 16]);
    expect(pio.ple_5.shape).toEqual([1, 16, 16]);
    expect(pio.past_k_4.shape).toEqual([1, 2, 31, 32]);
    expect(pio.new_k_4.shape).toEqual([1, 2, 16, 32]);
  });

  it('puts the softcapped lm-head inside the last shard when planned there (tied: the embedding); a layer reads its weights, the PLE projection, and no K/V weight when shared', async () => {
    const c = config();
    const [last] = gemma4.components(c, { shards: [{ first: 3, last: 7, isLast: true }], lmHeadInside: true, prefillLength: 0, maxContext: 8 });
    const g = new GraphBuilder('last');
    const store = { linear: async (gb: GraphBuilder, x: string) => gb.op('Identity', [x]), small: async (gb: GraphBuilder, name: string, shape: number[]) => gb.initializer(name.replace(/\W/g, '_'), new Float32Array(shape.reduce((a, b) => a * b, 1)), shape, 'float32') };
    const iface = await last.variants[0].build(g, { store: store as any, scheme: 'fp32', lmHeadScheme: 'fp32' });
    expect(names(iface.outputs)).toEqual(['hidden_out', 'new_k_3', 'new_v_3', 'new_k_4', 'new_v_4', 'logits']);
    const read = (await componentTensors(last)).map((t) => t.name);
    expect(read).toContain('model.language_model.embed_tokens.weight');
    expect(read).toContain('model.language_model.per_layer_model_projection.weight');
    expect(read.filter((n) => /layers\.[567]\.self_attn\.[kv]_(proj|norm)/.test(n))).toEqual([]);
    // With the lm-head inside, a prefill graph gives the logits of its N rows.
    const [withPrefill] = gemma4.components(c, { shards: [{ first: 3, last: 7, isLast: true }], lmHeadInside: true, prefillLength: 4, maxContext: 64 });
    expect(withPrefill.variants.map((v) => [v.name, v.n])).toEqual([['prefill', 4], ['decode', 1]]);
    const p = await withPrefill.variants[0].build(new GraphBuilder('p'), { store: store as any, scheme: 'fp32', lmHeadScheme: 'fp32' });
    expect(p.outputs.find((t) => t.name === 'logits')!.shape).toEqual([1, 4, 1024]);
  });

  it('binds the PLE and embedding rows to the host tables by token, sliding caches as rings of the window, the donor cache as one shared state', () => {
    const c = config();
    const [s0, s1] = graphs(entry('quantize')).filter((g) => g.name.endsWith('.decode'));
    const b = gemma4.bindings(c, s1, 64);
    const byName = Object.fromEntries(b.inputs.map((x) => [x.name, x]));
    expect(byName.embeds).toMatchObject({ bind: 'host-rows', table: 'embedding', index: 'token' });
    expect(byName.ple_5).toMatchObject({ bind: 'host-rows', table: 'per_layer_embedding', index: 'token', layer: 5 });
    expect(byName.past_k_2).toMatchObject({ bind: 'state', state: 'kv.2.k' });
    // Full layer 2 (read by 5 and 7 in the other shard): every position; sliding layer 3: a ring of 16.
    expect(b.state.find((s) => s.name === 'kv.2.k')).toMatchObject({ kind: 'kv-cache', shape: [1, 2, 64, 64], shared: true });
    expect(b.state.find((s) => s.name === 'kv.2.k')!).not.toHaveProperty('window');
    // The ring's slots (window 16 + prefill 16 - 1) and, on the mask, the window a row sees.
    expect(b.state.find((s) => s.name === 'kv.3.k')).toEqual({ name: 'kv.3.k', kind: 'kv-cache', dtype: 'float32', shape: [1, 2, 31, 32], positionAxis: 2, window: 31 });
    expect(byName.attn_mask_sliding).toMatchObject({ bind: 'mask', window: 31, sliding: 16, shape: [1, 1, 1, 32] });
    expect(byName.attn_mask).toMatchObject({ bind: 'mask', shape: [1, 1, 1, 257] });
    expect(byName.attn_mask).not.toHaveProperty('window');
    // The window reaches past a short maxContext: no ring, no sliding mask.
    const short = gemma4.bindings(c, s0, 16);
    expect(short.state.every((s) => !('window' in s))).toBe(true);
    expect(gemma4.hostTables(c).map((t) => [t.name, t.use, t.shape])).toEqual([['embedding', 'embedding', [1024, 64]], ['per_layer_embedding', 'per-layer-embedding', [1024, 128]]]);
    expect(gemma4.hostOpParams!(c)).toEqual({ embed_scale: 8, per_layer_embed_scale: 4, per_layer_dim: 16 });
  });

  it("reads a donor's row in another shard with a one-hot MatMul at the slot, never a Gather on a cache", () => {
    const m = readModel(join(entry('quantize'), 'shard1.decode.onnx'));
    const caches = new Set(m.inputs().map((t) => t.name).filter((n) => /^past_[kv]_/.test(n)));
    expect(caches.has('past_k_2')).toBe(true);
    expect(m.nodes().filter((n) => n.opType === 'Gather' && n.inputs.some((i) => caches.has(i)))).toEqual([]);
    expect(m.nodes().filter((n) => n.opType === 'MatMul' && n.inputs[1] === 'past_k_2').length).toBe(2); // layers 5 and 7
  });
});

describe('gemma4 fetch', () => {
  it('checks every tensor the graphs and host tables read for NaN/Inf: all of the twin\'s, its audio tower (one forge builds) and finite clip bounds included', async () => {
    const finite = (record.summaries.fetch as any).finite;
    expect(finite).toMatchObject({ checked: true, tensors: (record.summaries.fetch as any).tensors });
    // The towers are read whatever the recipe's modalities (validateCheckpoint's dry build builds both),
    // so nothing is left unscanned; tensors nothing reads are test/non-finite.test.ts's.
    expect(finite.notRead).toEqual({ tensors: 0, bytes: 0, under: {} });
    // The twin's audio clip bounds are ±1e4, not HF's ±inf: a scan of every tensor finds nothing.
    const file = join(readCheckpointRef(entry('fetch')).absDir, 'model.safetensors');
    await expect(checkFinite([file])).resolves.toMatchObject({ tensors: finite.tensors });
  });
});

describe('gemma4 oracle gate', () => {
  const result = () => JSON.parse(readFileSync(join(entry('oracle'), 'oracle.json'), 'utf8')) as OracleResult;

  it("meets HF's fp32 trace in every graph and output (residuals, K/V rows, each layer's mixed PLE input, the softcapped logits), W8 within 0.999, prefill graphs on every chunk", () => {
    const r = result();
    expect(r.ok).toBe(true);
    const rows = (variant: string) => r.rows.filter((x) => x.variant === variant);
    for (const row of rows('export:fp32')) expect(row.minCosine, `${row.graph} ${row.output}`).toBeGreaterThanOrEqual(0.99999);
    for (const row of rows('quantize:w8')) expect(row.minCosine, `${row.graph} ${row.output}`).toBeGreaterThanOrEqual(0.999);
    const outputs = (graph: string) => rows('quantize:w8').filter((x) => x.graph === graph).map((x) => x.output).sort();
    expect(outputs('shard0.decode')).toEqual(['h.1', 'h.2', 'hidden_out', 'new_k_0', 'new_k_1', 'new_k_2', 'new_v_0', 'new_v_1', 'new_v_2', 'ple.0', 'ple.1', 'ple.2']);
    expect(outputs('shard1.decode')).toEqual(['h.4', 'h.5', 'h.6', 'h.7', 'h.8', 'hidden_out', 'new_k_3', 'new_k_4', 'new_v_3', 'new_v_4', 'ple.3', 'ple.4', 'ple.5', 'ple.6', 'ple.7']);
    expect(outputs('lm_head')).toEqual(['logits']);
    expect(outputs('shard1.prefill')).toEqual(outputs('shard1.decode'));
    for (const v of ['export:fp32', 'quantize:w8']) {
      for (const g of ['shard0.prefill', 'shard0.decode', 'shard1.prefill', 'shard1.decode', 'lm_head']) expect(r.graphs[`${v}/${g}`].ok, `${v}/${g}`).toBe(true);
      expect(r.graphs[`${v}/lm_head`].top1).toMatch(/^(\d+)\/\1$/);
    }
    // The traces run past the twin's sliding window (16): the masked window is exercised.
    const trace = JSON.parse(readFileSync(join(entry('trace'), 'trace.json'), 'utf8'));
    expect(Math.max(...trace.prompts.map((p: { steps: number }) => p.steps))).toBeGreaterThan(2 * 16);
    console.log(`tiny-gemma4 build: ${seconds.toFixed(1)} s; ` + Object.entries(r.graphs).map(([k, g]) => `${k} ${g.minCosine.toFixed(7)}`).join(', '));
  });
});

describe('gemma4 prefill where a shard holds only KV-shared layers', () => {
  // gemma-4-e4b's plan puts layers 28-41, every one KV-shared, in a shard of their own: they read
  // their donors' caches (layers 22 and 23, a ring and a full cache) after the donors' context wrote
  // the call's rows. The twin cut the same way (shard 1 = layers 5-7, donors 2 and 4 in shard 0),
  // its prefill graphs gated against HF on every chunk: the ring holds the chunk's rows without
  // losing a position a row of the chunk still sees.
  it("meets HF's trace in fp32 and W8 on every chunk and step, its donors' rows read from their caches", async () => {
    const recipes = mkdtempSync(join(tmpdir(), 'forge-gemma4-recipes-'));
    const { recipe } = loadRecipe('tiny-gemma4');
    const cut = { ...recipe, arch: { default: { ...recipe.arch.default, shards: [[0, 4], [5, 7]] } } };
    mkdirSync(join(recipes, 'tiny-gemma4'));
    writeFileSync(join(recipes, 'tiny-gemma4', 'recipe.json'), JSON.stringify(cut, null, 2));
    const before = process.env.FORGE_RECIPES;
    process.env.FORGE_RECIPES = recipes;
    try {
      const r = await build({ recipe: 'tiny-gemma4', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-gemma4-cut-')), progress: silentProgress, until: 'oracle' });
      expect(r.error).toBeUndefined();
      const dir = join(cacheRoot(), 'oracle', r.stages.find((x) => x.name === 'oracle')!.key!);
      const o = JSON.parse(readFileSync(join(dir, 'oracle.json'), 'utf8')) as OracleResult;
      expect(o.ok).toBe(true);
      const shard1 = graphs(join(cacheRoot(), 'export', r.stages.find((x) => x.name === 'export')!.key!)).find((g) => g.name === 'shard1.prefill')!;
      // No cache of its own: it reads donor 2's full cache and donor 4's ring (at the call's 16 ring
      // slots), and writes no rows.
      expect(names(shard1.inputs).filter((n) => n.startsWith('past_'))).toEqual(['past_k_2', 'past_v_2', 'past_k_4', 'past_v_4']);
      expect(shard1.inputs.find((t) => t.name === 'ring_slot')!.shape).toEqual([16]);
      expect(names(shard1.outputs)).toEqual(['hidden_out']);
      for (const v of ['export:fp32', 'quantize:w8']) {
        for (const g of ['shard0.prefill', 'shard0.decode', 'shard1.prefill', 'shard1.decode']) expect(o.graphs[`${v}/${g}`].ok, `${v}/${g}`).toBe(true);
      }
      for (const row of o.rows.filter((x) => x.variant === 'export:fp32')) expect(row.minCosine, `${row.graph} ${row.output}`).toBeGreaterThanOrEqual(0.99999);
    } finally {
      if (before === undefined) delete process.env.FORGE_RECIPES;
      else process.env.FORGE_RECIPES = before;
      rmSync(recipes, { recursive: true, force: true });
    }
  }, 900_000);
});

describe('gemma4 pieces', () => {
  const dir = mkdtempSync(join(tmpdir(), 'forge-gemma4-ops-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const run = async (build: (g: GraphBuilder, x: string) => string, x: Float32Array): Promise<Float32Array> => {
    const g = new GraphBuilder('piece');
    const input = g.input('x', 'float32', [x.length]);
    g.output(build(g, input), 'y', { shape: [x.length] });
    const p = join(dir, `piece-${Math.random().toString(36).slice(2)}.onnx`);
    writeModel(g, p);
    const sess = await ort.InferenceSession.create(p);
    const r = await sess.run({ x: new ort.Tensor('float32', x, [x.length]) });
    await sess.release();
    return r.y.data as Float32Array;
  };
  const xs = Float32Array.of(-80, -12, -1.5, -0.1, 0, 0.3, 2, 9.5, 40, 1000);

  it('softcap is c·tanh(x/c): near-identity for small logits, bounded by c', async () => {
    const y = await run((g, x) => softcap(g, x, 30), xs);
    xs.forEach((x, i) => expect(y[i]).toBeCloseTo(30 * Math.tanh(x / 30), 4));
    expect(y[9]).toBeCloseTo(30, 4);
    expect(Math.abs(y[3] - -0.1)).toBeLessThan(1e-4);
  });

  it("GELU-tanh is HF's gelu_pytorch_tanh", async () => {
    const y = await run((g, x) => geluTanh(g, x), xs.subarray(1, 9));
    xs.subarray(1, 9).forEach((x, i) => expect(y[i]).toBeCloseTo(0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3))), 4));
  });
});

describe('gemma4 residual hand-off (recipe handoff: auto)', () => {
  it('is chosen by the oracle gate: the W8 chain with every hand-off rounded to f16 keeps each greedy decision, so f16 ships', () => {
    const r = JSON.parse(readFileSync(join(entry('oracle'), 'oracle.json'), 'utf8')) as OracleResult;
    const h = r.handoff!.quantize;
    expect(h.dtype).toBe('float16');
    expect(h.f16.decisions).toEqual(expect.objectContaining({ agree: h.f32.decisions!.agree, steps: h.f32.decisions!.steps }));
    expect(h.f16.logitError).toBeGreaterThan(0);
    // The parity gates' tie bound is then the f16 chain's error, the one the bundle hands over.
    expect(r.logitError.quantize).toBe(h.f16.logitError);
    expect(r.handoff!.export).toBeUndefined(); // the fp32 reference is not shipped: nothing to choose
    console.log(`tiny-gemma4 hand-off: ${h.dtype}; chained logit error f16 ${h.f16.logitError} vs f32 ${h.f32.logitError}`);
  });

  it('gives every residual one context hands another as f16 at both edges, float32 inside; the manifest and card say so', () => {
    const shipped = graphs(entry('handoff'));
    // Each shard's and the lm-head's residual (the vision encoder hands over no residual).
    const io = (gs: ReturnType<typeof graphs>) => gs.filter((g) => g.stream).flatMap((g) => [...g.inputs.filter((t) => t.name === g.stream!.input), ...g.outputs.filter((t) => t.name === g.stream!.output)].map((t) => `${g.name}:${t.name}:${t.dtype}`));
    // The first shard's input is the host's scaled embedding row, not a hand-off: it stays float32.
    expect(io(shipped)).toEqual(['shard0.prefill:hidden_in:float32', 'shard0.prefill:hidden_out:float16', 'shard0.decode:hidden_in:float32', 'shard0.decode:hidden_out:float16', 'shard1.prefill:hidden_in:float16', 'shard1.prefill:hidden_out:float16', 'shard1.decode:hidden_in:float16', 'shard1.decode:hidden_out:float16', 'lm_head:hidden:float16']);
    expect(io(graphs(entry('quantize'))).every((x) => x.endsWith(':float32'))).toBe(true);
    const m = JSON.parse(readFileSync(join(out, 'manifest.json'), 'utf8')) as Manifest;
    const bound = m.contexts.flatMap((c) => c.graphs.flatMap((g) => [...g.inputs, ...g.outputs].filter((t) => t.bind === 'residual').map((t) => `${g.name}:${t.name}:${t.dtype}`)));
    expect(bound).toEqual(['shard0.prefill:hidden_in:float32', 'shard0.prefill:hidden_out:float16', 'shard0.decode:hidden_in:float32', 'shard0.decode:hidden_out:float16', 'shard1.prefill:hidden_in:float16', 'shard1.prefill:hidden_out:float16', 'shard1.decode:hidden_in:float16', 'shard1.decode:hidden_out:float16', 'lm_head:hidden:float16']);
    expect(readFileSync(join(out, 'README.md'), 'utf8')).toMatch(/\*\*Residual hand-off\*\* between contexts \(shard → shard → lm-head\), chosen by the oracle gate: float16\. f16 hand-offs keep every greedy decision/);
  });
});

describe('gemma4 on the runtime', () => {
  const gates = () => record.gates as Record<string, any>;

  it('keeps greedy parity with HF on the host in fp32 and W8, every step, past the sliding window', () => {
    const parity = gates().parity;
    expect(parity.ok).toBe(true);
    for (const v of ['export', 'quantize']) expect(parity.variants[v]).toMatchObject({ ok: true, mismatches: 0, ties: 0, matched: parity.variants[v].total });
    // 4 text and 2 image prompts × 32 tokens (an image's caption, as the twin learnt it), each
    // continuation alone longer than the 31-slot ring: it wraps while generating.
    expect(parity.variants.quantize.total).toBe(6 * 32);
    const m = JSON.parse(readFileSync(join(out, 'manifest.json'), 'utf8')) as Manifest;
    expect(m.hostOp).toBe('gemma4_split_generate');
    expect(m.state.filter((s) => s.kind === 'kv-cache' && s.window === 31).map((s) => s.name)).toEqual(['kv.0.k', 'kv.0.v', 'kv.1.k', 'kv.1.v', 'kv.3.k', 'kv.3.v', 'kv.4.k', 'kv.4.v']);
    expect(m.hostTables.map((t) => t.use)).toEqual(['embedding', 'per-layer-embedding']);
  });

  it("passes the simulator gate: the compiled graphs within W8's cosine of HF, parity on the simulator", () => {
    const e = gates().emulation;
    expect(e.ok).toBe(true);
    for (const g of ['shard0.prefill', 'shard0.decode', 'shard1.prefill', 'shard1.decode', 'lm_head']) expect(e.graphs[g].minCosine, g).toBeGreaterThanOrEqual(0.999);
    expect(e.parity).toMatchObject({ ok: true, matched: 192, total: 192 });
  });

  it('reads a picture as HF does and answers it: patches and positions equal the processor\'s, each picture its own caption on the host and the simulator', () => {
    const parity = gates().parity;
    expect(parity.pixels.map((c: { image: string; ok: boolean }) => [c.image, c.ok])).toEqual([['red-circle.png', true], ['blue-square.jpg', true]]);
    for (const c of parity.pixels) expect(c.cosine, c.image).toBeGreaterThan(0.99999);
    expect(gates().emulation.graphs.vision.minCosine).toBeGreaterThanOrEqual(0.999);
    // The runtime matched HF at every step of both pictures (above), and HF's captions part at the first token.
    const trace = JSON.parse(readFileSync(join(entry('trace'), 'trace.json'), 'utf8')) as { prompts: Array<{ image?: unknown; generated: number[] }> };
    const [a, b] = trace.prompts.filter((p) => p.image);
    expect(a.generated[0]).not.toBe(b.generated[0]);
    // The text manifest (no vision encoder) on the four text prompts.
    expect(parity.textManifest.variants.quantize).toMatchObject({ ok: true, mismatches: 0, total: 4 * 32 });
    expect(readFileSync(join(out, 'README.md'), 'utf8')).toMatch(/## Images[\s\S]*within 70 soft tokens[\s\S]*\| `red-circle\.png` \| 1\.0000000 \|/);
  });

  it('prints the plan in the card: each context with its layers, planned bytes, ring caches and the caches it reads from another context', () => {
    const card = readFileSync(join(out, 'README.md'), 'utf8');
    expect(card).toMatch(/\| shard0 \| 0–2 \| [\d.]+ kB \| 6 kv-cache \(4 rings of 31 slots\) \|/);
    expect(card).toMatch(/\| shard1 \| 3–7 \| [\d.]+ kB \| 4 kv-cache \(4 rings of 31 slots\); reads kv\.2\.k, kv\.2\.v \(written by shard0\) \|/);
    expect(card).toMatch(/Host tables: embedding 131\.1 kB \(f16\), per_layer_embedding 262\.1 kB \(f16\)\./);
    expect(card).toContain('**Prompt:** prefilled 16 tokens per call (batched prefill graphs)');
  });

  it("masks a ring slot exactly when HF's sliding rule hides the position it holds, one token or a prefill chunk over a ring of window + N - 1 slots", () => {
    const W = 4;
    for (const n of [1, 3]) {
      const slots = W + n - 1;
      for (let start = 0; start < 13; start += n) {
        for (const valid of [n, 1]) {
          // The ring as the runtime leaves it: positions 0..start-1 written in order, each at its slot.
          const held = new Array<number>(slots).fill(-1);
          for (let q = 0; q < start; q++) held[q % slots] = q;
          const after = [...held];
          for (let k = 0; k < valid; k++) after[(start + k) % slots] = start + k;
          const m = ringMask(slots, W, start, n, valid);
          for (let r = 0; r < n; r++) {
            const row = m.subarray(r * (slots + n), (r + 1) * (slots + n));
            for (let slot = 0; slot < slots; slot++) {
              const seen = held[slot] >= 0 && start + r - held[slot] < W;
              expect(row[slot], `start ${start} row ${r} slot ${slot}`).toBe(seen ? 0 : MASKED);
              // A context reading the ring after the call's rows were written finds what the row sees.
              if (seen) expect(after[slot], `start ${start} row ${r} slot ${slot}`).toBe(held[slot]);
            }
            // Every position the window holds for this row is shown: in the ring or among the new rows.
            const shown = row.reduce((a, x) => a + (x === 0 ? 1 : 0), 0);
            expect(shown, `start ${start} row ${r}`).toBe(r < valid ? Math.min(W, start + r + 1) : Math.min(W, start + r + 1) - (r + 1 - valid));
            for (let k = 0; k < n; k++) expect(row[slots + k]).toBe(k <= r && k < valid ? 0 : MASKED);
          }
        }
      }
    }
  });
});

describe('a family whose host-op the runtime lacks', () => {
  it('is refused before anything runs, naming the missing host-op, for any stage that runs the runtime; --until oracle or compile is allowed', () => {
    const { recipe } = loadRecipe('tiny-gemma4');
    const { arch, settings } = archSettings(recipe, 'v81');
    const p = buildPipeline(recipe, arch, settings);
    const without = new Set(['decoder_generate', 'qwen3_5_generate', 'phimoe_generate']);
    for (const until of [undefined, 'parity', 'bundle']) {
      expect(() => refuseWithoutHostOp(recipe, p, until, without)).toThrow(/family gemma4 needs host-op 'gemma4_split_generate', which the native runtime does not have yet .*build with --until oracle/);
    }
    for (const until of ['oracle', 'compile', 'quantize']) expect(() => refuseWithoutHostOp(recipe, p, until, without)).not.toThrow();
    // The runtime registers it (native/src/host_ops.cpp): nothing is refused.
    expect(runtimeHostOps().has('gemma4_split_generate')).toBe(true);
    expect(() => refuseWithoutHostOp(recipe, p, undefined)).not.toThrow();
  });
});
