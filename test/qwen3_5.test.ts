import { describe, it, expect, beforeAll } from 'vitest';
import { cpSync, mkdtempSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { readModel, overwriteInitializer } from '../src/onnx/reader.js';
import { checkExportedGraphs } from './helpers/check-graphs.js';
import { venvPython } from '../src/toolchain/venv.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import type { ExportManifest } from '../src/export/graphs.js';
import { runOracleGate, firstMiss, type OracleResult } from '../src/gates/oracle.js';
import { readTraceMeta } from '../src/gates/trace.js';
import { assembleBundle } from '../src/bundle/assemble.js';
import { qwen3_5, parseQwen35Config } from '../src/families/qwen3_5.js';
import { componentTensors, headTensors, layerTensors } from '../src/families/tensors.js';
import { layoutOf } from '../src/export/graphs.js';
import { openCheckpoint } from '../src/io/checkpoint.js';
import { makePlan } from '../src/plan/shards.js';
import { planRecipe } from '../src/plan/for-recipe.js';
import { getArch } from '../src/arch/table.js';
import { loadRecipe, archSettings } from '../src/recipe/load.js';
import { storedBytes, sumBytes } from '../src/quant/bytes.js';
import type { RunRecord } from '../src/engine/record.js';

let record: RunRecord;
const entry = (id: string) => join(cacheRoot(), id, record.stages.find((s) => s.name === id)!.key!);
const manifest = (dir: string) => JSON.parse(readFileSync(join(dir, 'graphs.json'), 'utf8')) as ExportManifest;
const graphs = (dir: string) => manifest(dir).contexts.flatMap((c) => c.graphs);
const names = (ts: Array<{ name: string }>) => ts.map((t) => t.name);

beforeAll(async () => {
  // The whole build: export, oracle, the qwen3_5_generate host-op in parity, compile, emulation, bundle.
  record = await build({ recipe: 'tiny-qwen3.5', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-q35-')), progress: silentProgress });
  expect(record.error).toBeUndefined();
  expect(record.ok).toBe(true);
}, 1_800_000); // the trained twin is made first: minutes on two cores

describe('qwen3_5 export', () => {
  it('writes prefill and decode shards that split across both layer kinds, with every state as graph I/O', () => {
    const mf = manifest(entry('export'));
    expect(mf.contexts.map((c) => c.graphs.map((g) => g.name))).toEqual([['shard0.prefill', 'shard0.decode'], ['shard1.prefill', 'shard1.decode'], ['lm_head']]);
    const [p0, s0, p1, s1] = graphs(entry('export'));
    // Shard 0 holds linear-attention layers only: no positions, and no mask when it decodes.
    expect(names(s0.inputs)).toEqual(['hidden_in', 'conv_state_0', 'rec_state_0', 'conv_state_1', 'rec_state_1', 'conv_state_2', 'rec_state_2']);
    expect(names(s0.outputs)).toEqual(['hidden_out', 'new_conv_state_0', 'new_rec_state_0', 'new_conv_state_1', 'new_rec_state_1', 'new_conv_state_2', 'new_rec_state_2']);
    expect(names(s1.inputs)).toEqual(['hidden_in', 'position', 'attn_mask', 'past_k_3', 'past_v_3', 'conv_state_4', 'rec_state_4',
      'conv_state_5', 'rec_state_5', 'conv_state_6', 'rec_state_6', 'past_k_7', 'past_v_7']);
    // Its prefill reads which rows of a chunk are real from the mask: a padding row writes no state.
    expect(names(p0.inputs)).toEqual(['hidden_in', 'attn_mask', ...names(s0.inputs).slice(1)]);
    expect(names(p0.outputs)).toEqual(names(s0.outputs));
    expect(names(p1.inputs)).toEqual(names(s1.inputs));
    const io = Object.fromEntries([...s0.inputs, ...s0.outputs, ...s1.inputs, ...s1.outputs].map((t) => [t.name, t]));
    // Twin: conv channels 2·2·16 + 4·32 = 192, kernel 4; S [Hv 4, dk 16, dv 32]; KV [kv 2, ctx 256, d 32].
    expect(io['conv_state_0']).toMatchObject({ dtype: 'float32', shape: [1, 192, 4] });
    expect(io['new_conv_state_0']).toMatchObject({ dtype: 'float32', shape: [1, 192, 4] });
    expect(io['rec_state_0']).toMatchObject({ dtype: 'float32', shape: [1, 4, 16, 32] });
    expect(io['new_rec_state_6']).toMatchObject({ dtype: 'float32', shape: [1, 4, 16, 32] });
    expect(io['past_k_3']).toMatchObject({ dtype: 'float32', shape: [1, 2, 256, 32] });
    expect(io['new_k_7']).toMatchObject({ dtype: 'float32', shape: [1, 2, 1, 32] });
    // A prefill call of 16 tokens: 16 residual and K/V rows, the states whole.
    const pio = Object.fromEntries([...p0.inputs, ...p0.outputs, ...p1.inputs, ...p1.outputs].map((t) => [t.name, t]));
    expect(pio['hidden_in'].shape).toEqual([1, 16, 64]);
    expect(pio['attn_mask'].shape).toEqual([1, 1, 16, 256 + 16]);
    expect(pio['new_k_7'].shape).toEqual([1, 2, 16, 32]);
    expect(pio['new_rec_state_0'].shape).toEqual([1, 4, 16, 32]);
  });

  it("runs every gate: the runtime's qwen3_5_generate matches HF N/N on every prompt in fp32 and in the shipped W8, no ties allowed", () => {
    expect(record.gatesNotRun).toBeUndefined();
    const parity = record.gates.parity as any;
    expect(parity).toMatchObject({ ok: true, target: 'host', ties: 0, maxTies: 0, thresholds: { minMatch: 1, maxTies: 0 }, mismatches: { count: 0 } });
    expect(parity).not.toHaveProperty('w8Why');
    const { gates } = loadRecipe('tiny-qwen3.5').recipe;
    const total = gates.prompts.length * gates.parity.tokens;
    for (const v of ['export', 'quantize']) expect(parity.variants[v], v).toMatchObject({ ok: true, matched: total, total, ties: 0, mismatches: 0 });
  });

  it("compiles the three contexts for the arch and passes the simulator's teacher-forced gate", () => {
    const compile = record.summaries.compile as any;
    expect(compile.contexts.map((c: any) => c.name)).toEqual(['shard0', 'shard1', 'lm_head']);
    for (const c of compile.contexts) expect(c).toMatchObject({ dspArch: 'v81', socModel: 87 });
    const emu = record.gates.emulation as any;
    expect(emu).toMatchObject({ ok: true, ran: true });
    for (const g of ['shard0.prefill', 'shard0.decode', 'shard1.prefill', 'shard1.decode', 'lm_head']) expect(emu.graphs[g].minCosine, g).toBeGreaterThanOrEqual(0.999);
    // Every prefill chunk of every prompt is gated (the long prompt crosses several, its last one padded).
    const { prompts } = readTraceMeta(entry('trace'));
    const chunks = prompts.reduce((n, p) => n + Math.ceil(p.prompt_tokens.length / 16), 0);
    expect(prompts.some((p) => p.prompt_tokens.length > 2 * 16 && p.prompt_tokens.length % 16 !== 0)).toBe(true);
    const cases = JSON.parse(readFileSync(join(entry('emulation'), 'emulation.json'), 'utf8')).oracle.graphs;
    for (const g of ['shard0.prefill', 'shard1.prefill']) expect(cases[g].cases, g).toBe(chunks);
    // The card says how the runtime takes a prompt.
    expect(readFileSync(join(record.bundle!, 'README.md'), 'utf8')).toContain('**Prompt:** prefilled 16 tokens per call (batched prefill graphs): a longer prompt runs in chunks of 16, the last one padded');
  });

  it('writes graphs that pass the full onnx.checker', async () => {
    for (const id of ['export', 'quantize']) expect(await checkExportedGraphs(entry(id))).toBeGreaterThan(0);
  });

  it('quantizes only matmul weights under W8: conv taps, A_log, dt_bias and norms stay float32, no fp16 anywhere in the state math', () => {
    const m = readModel(join(entry('quantize'), 'shard0.decode.onnx'));
    const init = (n: string) => m.initializers().find((t) => t.name === `model.language_model.layers.1.linear_attn.${n}`)!;
    // 8-bit codes in whatever form quant/weights.ts gives W8 (MatMulNBits: uint8).
    for (const n of ['in_proj_qkv.weight', 'in_proj_z.weight', 'in_proj_a.weight', 'in_proj_b.weight', 'out_proj.weight']) expect(['int8', 'uint8']).toContain(init(n).dtype);
    expect(init('conv1d.weight')).toMatchObject({ dtype: 'float32', dims: [192, 1, 4] });
    expect(init('A_log').dtype).toBe('float32');
    expect(init('dt_bias').dtype).toBe('float32');
    expect(init('norm.weight').dtype).toBe('float32');
    expect(m.nodes().some((n) => n.opType === 'Cast')).toBe(false);
  });

  it('derives each component\'s tensors from its builder: exactly the checkpoint tensors its graphs hold, conv taps, A_log and dt_bias included', async () => {
    const dir = readCheckpointRef(entry('fetch')).absDir;
    const config = parseQwen35Config(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')), 'config.json');
    const mf = manifest(entry('quantize'));
    const plan = JSON.parse(readFileSync(join(entry('plan'), 'plan.json'), 'utf8'));
    const components = qwen3_5.components(config, layoutOf(plan, { prefillLength: 0, maxContext: mf.maxContext }));
    const ckpt = await openCheckpoint(dir);
    try {
      for (const [i, c] of components.entries()) {
        const read = new Set(mf.contexts[i].graphs.flatMap((g) => readModel(join(entry('quantize'), g.file)).initializers().map((t) => t.name).filter((n) => ckpt.has(n))));
        expect((await componentTensors(c)).map((t) => t.name).sort(), c.name).toEqual([...read].sort());
      }
    } finally {
      await ckpt.close();
    }
  });

  it('assembles a manifest the runtime accepts: recurrent states replaced whole, KV caches by rows', async () => {
    const { recipe } = loadRecipe('tiny-qwen3.5');
    const { arch } = archSettings(recipe, 'v81');
    const m = await assembleBundle({
      recipe, arch, graphsDir: entry('quantize'), embeddingDir: entry('quantize'),
      checkpointDir: readCheckpointRef(entry('fetch')).absDir, maxNewTokens: 8,
    }, mkdtempSync(join(tmpdir(), 'forge-q35-bundle-')));
    expect(m.hostOp).toBe('qwen3_5_generate');
    const state = Object.fromEntries(m.state.map((s) => [s.name, s]));
    expect(state['conv.0']).toEqual({ name: 'conv.0', kind: 'recurrent', dtype: 'float32', shape: [1, 192, 4] });
    expect(state['rec.6']).toEqual({ name: 'rec.6', kind: 'recurrent', dtype: 'float32', shape: [1, 4, 16, 32] });
    expect(state['kv.3.k']).toMatchObject({ kind: 'kv-cache', shape: [1, 2, 256, 32], positionAxis: 2 });
    expect(Object.keys(state).sort()).toEqual(['conv.0', 'conv.1', 'conv.2', 'conv.4', 'conv.5', 'conv.6', 'kv.3.k', 'kv.3.v', 'kv.7.k', 'kv.7.v',
      'rec.0', 'rec.1', 'rec.2', 'rec.4', 'rec.5', 'rec.6']);
    expect(m.contexts[1].graphs.map((g) => [g.role, g.tokens])).toEqual([['prefill', 16], ['decode', 1]]);
    const shard1 = m.contexts[1].graphs[1];
    expect(shard1.inputs.find((i) => i.name === 'rec_state_4')).toMatchObject({ bind: 'state', state: 'rec.4' });
    expect(shard1.outputs.find((o) => o.name === 'new_rec_state_4')).toMatchObject({ bind: 'state-replace', state: 'rec.4' });
    expect(shard1.outputs.find((o) => o.name === 'new_conv_state_5')).toMatchObject({ bind: 'state-replace', state: 'conv.5' });
    expect(shard1.outputs.find((o) => o.name === 'new_k_7')).toMatchObject({ bind: 'state-rows', state: 'kv.7.k', axis: 2 });
    expect(shard1.inputs.find((i) => i.name === 'position')).toMatchObject({ bind: 'positions' });
  });
});

describe('qwen3_5 oracle gate', () => {
  const result = () => JSON.parse(readFileSync(join(entry('oracle'), 'oracle.json'), 'utf8')) as OracleResult;
  const kind = (output: string) => /^new_(conv|rec)_state_/.exec(output)?.[1] ?? (/^new_([kv])_/.test(output) ? 'kv' : 'residual');

  it('passes the twin: fp32 ≥ 0.99999 on every layer and state tensor, W8 at the recipe threshold', () => {
    const g = record.gates.oracle as any;
    expect(g.ok).toBe(true);
    const rows = result().rows;
    for (const variant of ['export:fp32', 'quantize:w8']) {
      const mine = rows.filter((r) => r.variant === variant && r.graph !== 'lm_head');
      // The prefill graphs are gated as the decode graphs are: the same outputs, every state.
      expect([...new Set(mine.map((r) => r.graph))].sort()).toEqual(['shard0.decode', 'shard0.prefill', 'shard1.decode', 'shard1.prefill']);
      // Every linear-attention layer's conv and recurrent state, every full layer's K and V, every residual.
      const kinds = new Set(mine.map((r) => `${kind(r.output)}`));
      expect([...kinds].sort()).toEqual(['conv', 'kv', 'rec', 'residual']);
      expect([...new Set(mine.filter((r) => kind(r.output) === 'rec').map((r) => r.output))].sort())
        .toEqual(['new_rec_state_0', 'new_rec_state_1', 'new_rec_state_2', 'new_rec_state_4', 'new_rec_state_5', 'new_rec_state_6']);
      // Each state row of the per-layer table names its layer (what a bisecting porter reads first).
      for (const r of mine.filter((x) => kind(x.output) !== 'residual')) expect(r.layer, r.output).toBe(/(\d+)$/.exec(r.output)![1]);
    }
    for (const r of rows.filter((x) => x.variant === 'export:fp32')) expect(r.minCosine, `${r.graph} ${r.output}`).toBeGreaterThanOrEqual(0.99999);
    for (const r of rows.filter((x) => x.variant === 'quantize:w8')) expect(r.minCosine, `${r.graph} ${r.output}`).toBeGreaterThanOrEqual(0.999); // the recipe's W8 threshold, held by the trained twin
    expect(g.graphs['export:fp32/lm_head'].top1).toMatch(/^(\d+)\/\1$/);
    expect(g.graphs['quantize:w8/lm_head'].top1).toMatch(/^(\d+)\/\1$/);
  });

  it('fails on a copy with a perturbed linear-attention weight, naming that layer first', async () => {
    const work = mkdtempSync(join(tmpdir(), 'forge-q35-corrupt-'));
    const copy = join(work, 'export');
    cpSync(entry('export'), copy, { recursive: true });
    const name = 'model.language_model.layers.1.linear_attn.in_proj_qkv.weight';
    const file = join(copy, 'shard0.decode.onnx');
    // The reference graphs hold the checkpoint's bf16 bytes (cpSync made a copy of the linked file): flip signs.
    const m = readModel(file);
    expect(m.initializer(name).dtype).toBe('bfloat16');
    const w = m.initializerData(name) as Uint16Array;
    overwriteInitializer(file, name, Uint16Array.from(w, (x, i) => (i % 3 === 0 ? x ^ 0x8000 : x)));
    const r = await runOracleGate('qwen3_5', readCheckpointRef(entry('fetch')).absDir, entry('trace'),
      [{ label: 'export', dir: copy, minCosine: 0.99999 }], 1, join(work, 'scratch'));
    expect(r.ok).toBe(false);
    expect(firstMiss(r.rows)).toMatchObject({ graph: 'shard0.decode', layer: '1', output: 'h.2' });
    const bad = new Set(r.rows.filter((x) => !x.ok).map((x) => x.output));
    // The layer's own states leave the oracle (the conv FIFO holds raw in_proj_qkv rows); layer 0's do not.
    for (const o of ['new_conv_state_1', 'new_rec_state_1']) expect(bad.has(o), o).toBe(true);
    for (const o of ['h.1', 'new_conv_state_0', 'new_rec_state_0']) expect(bad.has(o), o).toBe(false);
    expect(r.graphs['export:fp32/shard1.decode'].ok).toBe(true);
  });
});

describe('qwen3_5 plan and config', () => {
  const { recipe } = loadRecipe('qwen3.5-4b');
  const config = parseQwen35Config(recipe.config, 'qwen3.5-4b');
  const v81 = getArch('v81');

  it('reads the nested 4B config: 24 linear + 8 full layers, partial rotary 64 of 256, tied', () => {
    expect(config).toMatchObject({ hidden: 2560, ffn: 9216, layers: 32, heads: 16, kvHeads: 4, headDim: 256, rotaryDim: 64, vocab: 248320, ropeTheta: 1e7, tied: true });
    expect(config.linear).toEqual({ kHeads: 16, vHeads: 32, kDim: 128, vDim: 128, convKernel: 4, convDim: 8192 });
    expect(config.layerTypes.flatMap((t, i) => (t === 'full_attention' ? [i] : []))).toEqual([3, 7, 11, 15, 19, 23, 27, 31]);
  });

  it('cuts Qwen3.5-4B W8 for v81 into two 16-layer shards of ~1.8 GB with prefill and decode graphs, lm-head fp16 apart, embedding on the host', async () => {
    const plan = await planRecipe('qwen3.5-4b', 'v81');
    expect(plan.shards.map((s) => [s.first, s.last, s.graphs])).toEqual([[0, 15, ['prefill', 'decode']], [16, 31, ['prefill', 'decode']]]);
    const mm = (o: number, i: number) => o * i + o * (i / 256) * 4; // int8 codes + a float32 scale per 256-wide block of a row (2560, 4096, 9216 are multiples of 256)
    const mlp = 2 * mm(9216, 2560) + mm(2560, 9216) + 2 * 2560 * 4;
    const linear = mlp + mm(8192, 2560) + mm(4096, 2560) + 2 * mm(32, 2560) + mm(2560, 4096) + 8192 * 4 * 4 + 2 * 32 * 4 + 128 * 4;
    const full = mlp + mm(8192, 2560) + 2 * mm(1024, 2560) + mm(2560, 4096) + 2 * 256 * 4;
    expect(sumBytes(await layerTensors(qwen3_5, config, 0), 'w8')).toBe(linear);
    expect(sumBytes(await layerTensors(qwen3_5, config, 3), 'w8')).toBe(full);
    for (const s of plan.shards) {
      expect(s.weightBytes).toBe(12 * linear + 4 * full);
      expect(s.weightBytes).toBeLessThanOrEqual(v81.contextCeilingBytes);
      expect(s.weightBytes).toBeGreaterThan(1.7e9);
    }
    expect(plan.lmHead).toEqual({ placement: 'separate', quant: 'fp16', tied: true, bytes: storedBytes({ name: 'lm_head', shape: [248320, 2560], role: 'matmul' }, 'fp16') + 2560 * 4 });
    expect((await headTensors(qwen3_5, config)).lmHead.map((t) => t.name)).toEqual(['model.language_model.embed_tokens.weight']);
    expect(plan.hostTables).toEqual([{ name: 'embedding', dtype: 'f16', bytes: 248320 * 2560 * 2 }]);
    expect(plan.contexts).toBe(3);
    // The same numbers straight from the family and the settings (what `forge plan --json` prints).
    expect(await makePlan(qwen3_5, config, v81, archSettings(recipe, 'v81').settings)).toEqual(plan);
  });

  it('defaults layer types from full_attention_interval when layer_types is absent', () => {
    const { layer_types: _drop, ...text } = recipe.config!.text_config as Record<string, unknown>;
    const c = parseQwen35Config({ ...recipe.config, text_config: { ...text, full_attention_interval: 2 } }, 'config.json');
    expect(c.layerTypes.slice(0, 4)).toEqual(['linear_attention', 'full_attention', 'linear_attention', 'full_attention']);
  });

  it('rejects a config it cannot honour, naming the file and the nested field', () => {
    const text = recipe.config!.text_config as Record<string, unknown>;
    const withText = (patch: Record<string, unknown>) => ({ ...recipe.config, text_config: { ...text, ...patch } });
    expect(() => parseQwen35Config(withText({ hidden_size: 'big' }), 'config.json')).toThrow(/^config.json: field text_config.hidden_size/);
    const { linear_num_value_heads: _v, ...noHeads } = text;
    expect(() => parseQwen35Config({ ...recipe.config, text_config: noHeads }, 'config.json')).toThrow(/config.json: field text_config.linear_num_value_heads/);
    expect(() => parseQwen35Config(withText({ linear_num_key_heads: 12 }), 'config.json'))
      .toThrow('config.json: field text_config.linear_num_key_heads: 12 does not divide linear_num_value_heads 32');
    expect(() => parseQwen35Config(withText({ layer_types: ['full_attention'] }), 'config.json')).toThrow('config.json: field text_config.layer_types: 1 entries for 32 layers');
    expect(() => parseQwen35Config(withText({ rope_parameters: { rope_theta: 1e7, rope_type: 'yarn' } }), 'config.json'))
      .toThrow(/field text_config.rope_parameters.rope_type: 'yarn' is not supported/);
    // The checks it shares with Qwen3 name the nested path too.
    expect(() => parseQwen35Config(withText({ num_key_value_heads: 3 }), 'config.json')).toThrow(/^config.json: field text_config.num_key_value_heads: 3 does not divide/);
    expect(() => parseQwen35Config(withText({ attention_bias: true }), 'config.json')).toThrow(/^config.json: field text_config.attention_bias: /);
    expect(() => parseQwen35Config({ ...recipe.config, text_config: undefined }, 'config.json')).toThrow(/config.json: field text_config/);
    expect(() => parseQwen35Config({ ...recipe.config, model_type: 'qwen3' }, 'config.json')).toThrow(/config.json: field model_type/);
  });
});
