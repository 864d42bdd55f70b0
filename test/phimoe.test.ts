// PhiMoE as components: per layer an attention+router graph, one experts graph every layer shares,
// fed the chosen experts' rows from host tables, and the lm-head; run by the runtime's
// phimoe_generate host-op (host top-2 routing between them); batched prefill: the same attention
// graph over 8 tokens per layer and one experts-prefill graph run once per chosen expert. The whole
// build of the twin, every gate.
import { describe, it, expect, beforeAll } from 'vitest';
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { readModel } from '../src/onnx/reader.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import { openCheckpoint } from '../src/io/checkpoint.js';
import type { ExportManifest } from '../src/export/graphs.js';
import { runOracleGate, type OracleResult } from '../src/gates/oracle.js';
import { Trace } from '../src/gates/trace.js';
import { assembleBundle } from '../src/bundle/assemble.js';
import { ManifestSchema, type Manifest } from '../src/bundle/manifest.js';
import { parsePhimoeConfig, phimoe } from '../src/families/phimoe.js';
import { readExpertRows } from '../src/families/expert-tables.js';
import { getArch } from '../src/arch/table.js';
import { loadRecipe } from '../src/recipe/load.js';
import type { RunRecord } from '../src/engine/record.js';

let record: RunRecord;
const entry = (id: string) => join(cacheRoot(), id, record.stages.find((s) => s.name === id)!.key!);
const manifest = (dir: string) => JSON.parse(readFileSync(join(dir, 'graphs.json'), 'utf8')) as ExportManifest;
const graphs = (dir: string) => manifest(dir).contexts.flatMap((c) => c.graphs);
const twinConfig = () => JSON.parse(readFileSync(join(readCheckpointRef(entry('fetch')).absDir, 'config.json'), 'utf8'));

beforeAll(async () => {
  record = await build({ recipe: 'tiny-phimoe', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-phimoe-')), progress: silentProgress });
  expect(record.error).toBeUndefined();
  expect(record.ok).toBe(true);
}, 1_800_000); // the trained twin is made first

describe('phimoe export', () => {
  it('exports per layer an attention+router graph for one token and one for a prefill chunk, the experts graph and its prefill twin, and the lm-head, each with its role', () => {
    const m = manifest(entry('quantize'));
    expect(m.contexts.map((c) => c.name)).toEqual(['shard0', 'experts', 'lm_head']);
    expect(graphs(entry('quantize')).map((g) => [g.name, g.role, g.n])).toEqual([
      ...[0, 1, 2, 3].flatMap((l) => [[`shard0.layer${l}`, 'attn_router', 1], [`shard0.layer${l}.prefill`, 'attn_router_prefill', 8]]),
      ['experts', 'experts', 1], ['experts.prefill', 'experts_prefill', 8], ['lm_head', 'lm_head', 1],
    ]);
    const layer2 = graphs(entry('quantize')).find((g) => g.name === 'shard0.layer2.prefill')!;
    expect(layer2.outputs.map((o) => `${o.name}[${o.shape}]`)).toEqual(['attn_res[1,8,64]', 'moe_in[1,8,64]', 'router_logits[1,8,4]', 'new_k_2[1,2,8,32]', 'new_v_2[1,2,8,32]']);
    // One expert per call, slot 0's rows; its running sum in, the sum with that expert's weighted output out.
    const prefill = graphs(entry('quantize')).find((g) => g.name === 'experts.prefill')!;
    expect(prefill.inputs.map((t) => `${t.name}[${t.shape}]`)).toEqual([
      'acc[1,8,64]', 'moe_in[1,8,64]', 'routing[8]', 'expert_gate_up_0[64,64]', 'expert_gate_up_0_scale[64]', 'expert_down_0[64,32]', 'expert_down_0_scale[64]',
    ]);
    expect(prefill.outputs.map((t) => t.name)).toEqual(['hidden_out']);
  });

  it('keeps the experts on the host: the experts graph holds no checkpoint weight, its rows are int8 tables with per-row scales (fp32 in the reference)', () => {
    const experts = graphs(entry('quantize')).find((g) => g.name === 'experts')!;
    const model = readModel(join(entry('quantize'), experts.file));
    expect(model.initializers().filter((t) => t.name.startsWith('model.'))).toEqual([]);
    expect(experts.inputs.map((t) => `${t.name}:${t.dtype}`)).toEqual([
      'attn_res:float32', 'moe_in:float32', 'routing:float32',
      'expert_gate_up_0:int8', 'expert_gate_up_0_scale:float32', 'expert_down_0:int8', 'expert_down_0_scale:float32',
      'expert_gate_up_1:int8', 'expert_gate_up_1_scale:float32', 'expert_down_1:int8', 'expert_down_1_scale:float32',
    ]);
    const c = parsePhimoeConfig(twinConfig(), 'config.json');
    const [L, E, F, H] = [c.layers, c.experts, c.ffn, c.hidden];
    expect(manifest(entry('quantize')).madeTables!.map((t) => [t.name, t.dtype, t.shape, t.file])).toEqual([
      ['experts.gate_up', 'int8', [L, E, 2 * F, H], 'experts.gate_up.i8.bin'], ['experts.gate_up.scale', 'float32', [L, E, 2 * F], 'experts.gate_up.scale.f32.bin'],
      ['experts.down', 'int8', [L, E, H, F], 'experts.down.i8.bin'], ['experts.down.scale', 'float32', [L, E, H], 'experts.down.scale.f32.bin'],
    ]);
    expect(manifest(entry('export')).madeTables!.map((t) => [t.name, t.dtype])).toEqual([['experts.gate_up', 'float32'], ['experts.down', 'float32']]);
  });

  it("stores each expert's checkpoint rows: gate then up (HF's gate_up_proj), exactly in fp32, within half an int8 step in W8", async () => {
    const c = parsePhimoeConfig(twinConfig(), 'config.json');
    const ckpt = await openCheckpoint(readCheckpointRef(entry('fetch')).absDir);
    try {
      const [l, e] = [2, 3];
      const want = new Float32Array([
        ...(await ckpt.readRows(`model.layers.${l}.block_sparse_moe.experts.${e}.w1.weight`, 0, c.ffn)),
        ...(await ckpt.readRows(`model.layers.${l}.block_sparse_moe.experts.${e}.w3.weight`, 0, c.ffn)),
      ]);
      const ref = manifest(entry('export')).madeTables!.find((t) => t.name === 'experts.gate_up')!;
      expect(readExpertRows(join(entry('export'), ref.file), ref.dtype, ref.shape, l, e)).toEqual(want);
      const [q, s] = ['experts.gate_up', 'experts.gate_up.scale'].map((n) => manifest(entry('quantize')).madeTables!.find((t) => t.name === n)!);
      const codes = readExpertRows(join(entry('quantize'), q.file), q.dtype, q.shape, l, e) as Int8Array;
      const scales = readExpertRows(join(entry('quantize'), s.file), s.dtype, s.shape, l, e) as Float32Array;
      let worst = 0;
      for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(codes[i] * scales[Math.floor(i / c.hidden)] - want[i]) / scales[Math.floor(i / c.hidden)]);
      expect(worst).toBeLessThanOrEqual(0.5 + 1e-6);
      expect(Math.max(...codes.map(Math.abs))).toBe(127);
    } finally {
      await ckpt.close();
    }
  });
});

describe('phimoe oracle gate', () => {
  const result = () => JSON.parse(readFileSync(join(entry('oracle'), 'oracle.json'), 'utf8')) as OracleResult;

  it("meets HF's fp32 trace in every graph: the attention residual, MoE input, router logits and K/V rows per layer, the experts' output at every layer, the logits", () => {
    const r = result();
    expect(r.ok).toBe(true);
    for (const row of r.rows.filter((x) => x.variant === 'export:fp32')) expect(row.minCosine, `${row.graph} ${row.output}`).toBeGreaterThanOrEqual(0.99999);
    for (const row of r.rows.filter((x) => x.variant === 'quantize:w8')) expect(row.minCosine, `${row.graph} ${row.output}`).toBeGreaterThanOrEqual(0.999);
    const outputs = (graph: string) => r.rows.filter((x) => x.variant === 'quantize:w8' && x.graph === graph).map((x) => x.output).sort();
    expect(outputs('shard0.layer1')).toEqual(['attn_res', 'moe_in', 'new_k_1', 'new_v_1', 'router_logits']);
    expect(outputs('shard0.layer1.prefill')).toEqual(['attn_res', 'moe_in', 'new_k_1', 'new_v_1', 'router_logits']);
    // Every output of a layer's own graph is that layer's; the experts graphs every layer shares are reported per layer they served.
    const layers = (graph: string) => r.rows.filter((x) => x.variant === 'quantize:w8' && x.graph === graph).map((x) => `${x.layer}:${x.output}`);
    expect(layers('shard0.layer1')).toEqual(['1:attn_res', '1:moe_in', '1:new_k_1', '1:new_v_1', '1:router_logits']);
    for (const g of ['experts', 'experts.prefill']) expect(layers(g)).toEqual([0, 1, 2, 3].map((l) => `${l}:hidden_out`));
    expect(r.graphs['quantize:w8/lm_head'].top1).toMatch(/^(\d+)\/\1$/);
  });

  it('chains its one-token graphs as the host runs them (attention, then the experts with HF\'s routing, layer by layer; the lm-head), which gives the parity gates their tie margin', () => {
    const r = result();
    for (const v of ['export', 'quantize']) {
      expect(r.logitChain[v]).toEqual([...[0, 1, 2, 3].flatMap((l) => [`shard0.layer${l}`, 'experts']), 'lm_head']);
      // Every greedy step of the traced prompts picks HF's token along the chain.
      expect(r.decisions![v].agree).toBe(r.decisions![v].steps);
      expect(r.decisions![v].steps).toBeGreaterThan(0);
    }
    // fp32 moves the logits by float rounding only; W8's error is measured, larger, and finite.
    expect(r.logitError.export).toBeLessThan(1e-3);
    expect(r.logitError.quantize).toBeGreaterThan(r.logitError.export);
    expect(r.logitError.quantize).toBeLessThan(1);
  });

  it("feeds the experts graphs no residual: their gate compares HF's MoE output (one token) and one expert's weighted output (prefill) alone", async () => {
    const trace = await Trace.open(entry('trace'));
    const c = parsePhimoeConfig(twinConfig(), 'config.json');
    const byRole = (role: string) => graphs(entry('quantize')).find((g) => g.role === role)!;
    const first = async (role: string) => (await phimoe.gateCases(c, byRole(role), trace, 256, entry('quantize')).next()).value!;
    const one = await first('experts');
    expect(Array.from(one.feeds.attn_res.data as Float32Array).every((x) => x === 0)).toBe(true);
    expect(one.expected.hidden_out).toEqual(await trace.get(0, 0, 'moe_out.0'));
    const chunk = await first('experts_prefill');
    expect(Array.from(chunk.feeds.acc.data as Float32Array).every((x) => x === 0)).toBe(true);
    // Prompt 0's first chunk at layer 0, its lowest chosen expert (HF's order): each real row gives
    // its weight for that expert times HF's output of it, or 0 where the row chose others.
    const rows = Math.min(8, trace.meta.prompts[0].prompt_tokens.length);
    const chosen = await Promise.all(Array.from({ length: rows }, async (_, r) => Array.from(await trace.get(0, r, 'expert_ids.0'))));
    const e = Math.min(...chosen.flat());
    const H = c.hidden;
    for (let r = 0; r < rows; r++) {
      const slot = chosen[r].indexOf(e);
      const w = slot < 0 ? 0 : (await trace.get(0, r, 'expert_weights.0'))[slot];
      expect((chunk.feeds.routing.data as Float32Array)[r], `row ${r}`).toBe(w);
      const want = slot < 0 ? new Float32Array(H) : Float32Array.from((await trace.get(0, r, 'expert_out.0')).subarray(slot * H, (slot + 1) * H), (v) => w * v);
      expect(chunk.expected.hidden_out.subarray(r * H, (r + 1) * H), `row ${r}`).toEqual(want);
    }
  });

  it('fails the experts graphs (one token, prefill) when a layer is fed another expert\'s rows, and only them', async () => {
    const work = mkdtempSync(join(tmpdir(), 'forge-phimoe-swap-'));
    const copy = join(work, 'quantize');
    cpSync(entry('quantize'), copy, { recursive: true });
    // Swap experts 0 and 1 of layer 1 in the down table (codes only: the scales stay, so neither is right).
    const t = manifest(copy).madeTables!.find((x) => x.name === 'experts.down')!;
    const bytes = readFileSync(join(copy, t.file));
    const per = t.shape[2] * t.shape[3];
    const at = (e: number) => (1 * t.shape[1] + e) * per;
    const e0 = Buffer.from(bytes.subarray(at(0), at(0) + per));
    bytes.copy(bytes, at(0), at(1), at(1) + per);
    e0.copy(bytes, at(1));
    writeFileSync(join(copy, t.file), bytes);
    const r = await runOracleGate('phimoe', readCheckpointRef(entry('fetch')).absDir, entry('trace'), [{ label: 'quantize', dir: copy, minCosine: 0.999 }], 1, join(work, 'scratch'));
    expect(r.ok).toBe(false);
    expect(Object.entries(r.graphs).filter(([, g]) => !g.ok).map(([name]) => name)).toEqual(['quantize:w8/experts', 'quantize:w8/experts.prefill']);
    // …at the layer whose experts were swapped, and no other.
    expect(r.rows.filter((x) => !x.ok).map((x) => `${x.graph} layer ${x.layer}`)).toEqual(['experts layer 1', 'experts.prefill layer 1']);
  });
});

describe('phimoe on the runtime', () => {
  it("generates HF's tokens with phimoe_generate: teacher-forced parity N/N in fp32 and W8 on the host, and on the HTP simulator", () => {
    const parity = record.gates.parity as { ok: boolean; variants: Record<string, { matched: number; total: number; ties: number }> };
    expect(parity.ok).toBe(true);
    for (const v of ['export', 'quantize']) {
      expect(parity.variants[v].total, v).toBeGreaterThan(0);
      expect(parity.variants[v].matched, v).toBe(parity.variants[v].total);
      expect(parity.variants[v].ties, v).toBe(0);
    }
    const emulation = record.gates.emulation as { ok: boolean; graphs: Record<string, { minCosine: number }>; parity: { matched: number; total: number } };
    expect(emulation.ok).toBe(true);
    expect(Object.keys(emulation.graphs).sort()).toEqual(['experts', 'experts.prefill', 'lm_head', ...[0, 1, 2, 3].flatMap((l) => [`shard0.layer${l}`, `shard0.layer${l}.prefill`])]);
    expect(emulation.parity.matched).toBe(emulation.parity.total);
  });
});

describe('phimoe bundle manifest', () => {
  let assembled: Manifest | undefined;
  const bundleManifest = async () => {
    const { recipe } = loadRecipe('tiny-phimoe');
    assembled ??= await assembleBundle({ recipe, arch: getArch('v81'), graphsDir: entry('quantize'), embeddingDir: entry('quantize'), checkpointDir: readCheckpointRef(entry('fetch')).absDir, maxNewTokens: 4 }, mkdtempSync(join(tmpdir(), 'forge-phimoe-bundle-')));
    return structuredClone(assembled);
  };

  it('binds the graphs for phimoe_generate: residual threaded through, moe_in handed off, the slot\'s expert rows from the tables, the routing weights of the layer that routed last', async () => {
    const m = await bundleManifest();
    expect(() => ManifestSchema.parse(m)).not.toThrow();
    expect(m.hostOp).toBe('phimoe_generate');
    expect(m.hostOpParams).toEqual({ experts: 4, top_k: 2, router_jitter_eps: 0.01 });
    expect(m.hostTables.map((t) => `${t.name}:${t.use}:${t.dtype}`)).toEqual([
      'embedding:embedding:float16', 'experts.gate_up:expert-weights:int8', 'experts.gate_up.scale:expert-scales:float32',
      'experts.down:expert-weights:int8', 'experts.down.scale:expert-scales:float32',
    ]);
    const graph = (name: string) => m.contexts.flatMap((c) => c.graphs).find((g) => g.name === name)!;
    expect(graph('shard0.layer3').outputs.map((o) => o.bind === 'router-logits' ? `${o.name}:${o.bind}:${o.layer}:${o.topK}` : `${o.name}:${o.bind}`)).toEqual([
      'attn_res:residual', 'moe_in:hand-off', 'router_logits:router-logits:3:2', 'new_k_3:state-rows', 'new_v_3:state-rows',
    ]);
    expect(graph('experts').inputs.slice(0, 5)).toMatchObject([
      { name: 'attn_res', bind: 'residual' }, { name: 'moe_in', bind: 'hand-off', handoff: 'moe_in' }, { name: 'routing', bind: 'routing-weights' },
      { name: 'expert_gate_up_0', bind: 'host-rows', table: 'experts.gate_up', index: 'expert', slot: 0 },
      { name: 'expert_gate_up_0_scale', bind: 'host-rows', table: 'experts.gate_up.scale', index: 'expert', slot: 0 },
    ]);
    expect(graph('experts').inputs.find((i) => i.bind === 'routing-weights')).not.toHaveProperty('layer');
    // Prefill: N rows handed off under their own name, the running sum threaded as the residual, slot 0's rows only.
    expect(graph('shard0.layer3.prefill').outputs.find((o) => o.name === 'moe_in')).toMatchObject({ bind: 'hand-off', handoff: 'moe_in_prefill', shape: [1, 8, 64] });
    expect(graph('experts.prefill').inputs.map((i) => `${i.name}:${i.bind}${'handoff' in i ? `:${i.handoff}` : ''}${'slot' in i ? `:${i.slot}` : ''}`)).toEqual([
      'acc:residual', 'moe_in:hand-off:moe_in_prefill', 'routing:routing-weights',
      'expert_gate_up_0:host-rows:0', 'expert_gate_up_0_scale:host-rows:0', 'expert_down_0:host-rows:0', 'expert_down_0_scale:host-rows:0',
    ]);
    expect(m.state.map((s) => s.name)).toEqual(['kv.0.k', 'kv.0.v', 'kv.1.k', 'kv.1.v', 'kv.2.k', 'kv.2.v', 'kv.3.k', 'kv.3.v']);
  });

  it('the schema refuses a hand-off no graph gives, one whose shape differs from where it is given, and routing weights with no router', async () => {
    const issues = (m: Manifest) => { const r = ManifestSchema.safeParse(m); return r.success ? [] : r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`); };
    const experts = (m: Manifest) => m.contexts.find((c) => c.name === 'experts')!.graphs[0];
    const renamed = await bundleManifest();
    Object.assign(experts(renamed).inputs[1], { handoff: 'moe_out' });
    expect(issues(renamed)).toEqual(["contexts.1.graphs.0.inputs.1.handoff: no graph gives hand-off 'moe_out'"]);
    const reshaped = await bundleManifest();
    experts(reshaped).inputs[1].shape = [1, 1, 32];
    expect(issues(reshaped)).toEqual(["contexts.1.graphs.0.inputs.1.shape: hand-off 'moe_in' is float32 [1,1,64] where it is given, float32 [1,1,32] here"]);
    const unrouted = await bundleManifest();
    for (const g of unrouted.contexts[0].graphs) g.outputs = g.outputs.filter((o) => o.bind !== 'router-logits');
    expect(issues(unrouted)).toEqual(['contexts.1.graphs.0.inputs.2.layer: no graph gives router-logits', 'contexts.1.graphs.1.inputs.2.layer: no graph gives router-logits']);
  });
});

describe('phimoe config', () => {
  const base = () => ({
    model_type: 'phimoe', hidden_size: 64, intermediate_size: 32, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 32,
    num_local_experts: 4, num_experts_per_tok: 2, router_jitter_noise: 0.01, vocab_size: 1029, rms_norm_eps: 1e-5, max_position_embeddings: 4096,
    rope_theta: 1e4, attention_bias: true, lm_head_bias: true, tie_word_embeddings: false, sliding_window: 2047,
  });

  it('reads the legacy top-level rope_theta of the real config.json as well as rope_parameters', () => {
    expect(parsePhimoeConfig(base(), 'config.json')).toMatchObject({ ropeTheta: 1e4, headDim: 32, experts: 4, slidingWindow: 2047 });
    const { rope_theta: _, ...modern } = base();
    expect(parsePhimoeConfig({ ...modern, rope_parameters: { rope_type: 'default', rope_theta: 2e4 } }, 'config.json').ropeTheta).toBe(2e4);
  });

  it('refuses, naming the field, what the graphs do not build', () => {
    const { rope_theta: _, ...noTheta } = base();
    const cases: Array<[object, RegExp]> = [
      [noTheta, /config\.json: field rope_parameters\.rope_theta: missing/],
      [{ ...base(), rope_scaling: { type: 'longrope' } }, /field rope_scaling: .*LongRoPE/],
      [{ ...base(), num_experts_per_tok: 3 }, /field num_experts_per_tok: sparsemixer routing is top-2 only/],
      [{ ...base(), tie_word_embeddings: true }, /field tie_word_embeddings: a tied PhiMoE lm-head is not supported/],
      [{ ...base(), lm_head_bias: false }, /field lm_head_bias/],
      [{ ...base(), num_key_value_heads: 3 }, /field num_key_value_heads: 3 does not divide/],
    ];
    for (const [raw, msg] of cases) expect(() => parsePhimoeConfig(raw, 'config.json')).toThrow(msg);
  });

  it('declares batched prefill optional (one feature: every layer\'s prefill graph and the experts-prefill graph); refuses the lm-head inside the last shard and a cache past the sliding window, naming the recipe field', () => {
    const c = parsePhimoeConfig(base(), 'config.json');
    const layout = { shards: [{ first: 0, last: 3, isLast: true }], lmHeadInside: false, prefillLength: 0, maxContext: 256 };
    expect(phimoe.components(c, layout).map((x) => x.name)).toEqual(['shard0', 'experts', 'lm_head']);
    expect(phimoe.components(c, layout).flatMap((x) => x.variants).filter((v) => v.optional)).toEqual([]);
    const optional = phimoe.components(c, { ...layout, prefillLength: 8 }).flatMap((x) => x.variants.filter((v) => v.optional).map((v) => [x.name, v.name, v.n, v.optional]));
    expect(optional.map(([comp, v, n]) => `${comp}.${v}:${n}`)).toEqual(['shard0.layer0.prefill:8', 'shard0.layer1.prefill:8', 'shard0.layer2.prefill:8', 'shard0.layer3.prefill:8', 'experts.prefill:8']);
    expect(new Set(optional.map((o) => o[3])).size).toBe(1);
    expect(() => phimoe.components(c, { ...layout, lmHeadInside: true })).toThrow(/field arch\.lmHead\.placement/);
    expect(() => phimoe.components(c, { ...layout, maxContext: 4096 })).toThrow(/field arch\.maxContext: 4096 is over the model's sliding_window 2047 \+ 1/);
    expect(phimoe.components(c, { ...layout, maxContext: 2048 })).toHaveLength(3);
  });
});
