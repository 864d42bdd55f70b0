import { describe, it, expect } from 'vitest';
import { makePlan, PlanError } from '../src/plan/shards.js';
import { formatPlan } from '../src/plan/for-recipe.js';
import { qwen3, parseQwen3Config } from '../src/families/qwen3.js';
import { getArch } from '../src/arch/table.js';
import { loadRecipe, archSettings } from '../src/recipe/load.js';
import { storedBytes, sumBytes } from '../src/quant/bytes.js';
import { layerTensors } from '../src/families/tensors.js';
import { ArchSettingsSchema } from '../src/recipe/schema.js';

const { recipe } = loadRecipe('qwen3-4b');
const config = parseQwen3Config(recipe.config, 'qwen3-4b');
const v81 = getArch('v81');
const settings = (over: object = {}) => ArchSettingsSchema.parse({ ...archSettings(recipe, 'v81').settings, ...over });

describe('shard plan', async () => {
  it('cuts Qwen3-4B W8 for v81 into two 18-layer shards under the ceiling, lm-head apart', async () => {
    const plan = await makePlan(qwen3, config, v81, settings());
    expect(plan.shards.map((s) => [s.first, s.last])).toEqual([[0, 17], [18, 35]]);
    for (const s of plan.shards) expect(s.weightBytes).toBeLessThanOrEqual(v81.contextCeilingBytes);
    expect(plan.lmHead).toMatchObject({ placement: 'separate', tied: true });
    expect(plan.contexts).toBe(3);
    expect(plan.hostTables).toEqual([{ name: 'embedding', dtype: 'f16', bytes: 151936 * 2560 * 2 }]);
  });

  it('counts bytes from the tensors: a W8 matmul is one byte per weight plus a float32 scale per 256-wide block of a row', async () => {
    const perLayer = sumBytes(await layerTensors(qwen3, config, 0), 'w8');
    const matmul = (o: number, i: number) => o * i + o * (i / 256) * 4; // 2560, 4096 and 9728 are multiples of 256
    const expected = matmul(4096, 2560) + 2 * matmul(1024, 2560) + matmul(2560, 4096) + 2 * matmul(9728, 2560) + matmul(2560, 9728) + 4 * (2560 * 2 + 128 * 2);
    expect(perLayer).toBe(expected);
    const plan = await makePlan(qwen3, config, v81, settings());
    expect(plan.shards[0].weightBytes).toBe(18 * perLayer);
    expect(plan.lmHead.bytes).toBe(storedBytes({ name: 'model.embed_tokens.weight', shape: [151936, 2560], role: 'matmul' }, 'fp16') + 2560 * 4);
  });

  it('plans lmHead.quant auto at w4 until the precision stage has chosen, then at its choice, and says so', async () => {
    const before = await makePlan(qwen3, config, v81, settings({ lmHead: { placement: 'separate', quant: 'auto' } }));
    const head = { name: 'model.embed_tokens.weight', shape: [151936, 2560], role: 'matmul' as const };
    expect(before.lmHead).toMatchObject({ quant: 'auto', chosen: 'w4', bytes: storedBytes(head, 'w4') + 2560 * 4 });
    expect(before.precisionNote).toMatch(/^lmHead.quant 'auto' planned with the lm-head at w4 \(the least bytes\)/);
    expect(formatPlan(before)).toContain('lm-head: separate auto (w4) (tied)');
    const after = await makePlan(qwen3, config, v81, settings({ lmHead: { placement: 'separate', quant: 'auto' } }), undefined, { 'model.embed_tokens.weight': { scheme: 'w8', why: 'auto: …' } });
    expect(after.lmHead).toMatchObject({ chosen: 'w8', bytes: storedBytes(head, 'w8') + 2560 * 4 });
    expect(after.precisionNote).toBeUndefined();
  });

  it('needs more shards when the weights are bigger, and balances them', async () => {
    const plan = await makePlan(qwen3, config, v81, settings({ quant: 'fp16' }));
    expect(plan.shards.length).toBe(4);
    const sizes = plan.shards.map((s) => s.last - s.first + 1);
    expect(Math.max(...sizes) - Math.min(...sizes)).toBeLessThanOrEqual(1);
  });

  it('refuses fp32 when the contexts exceed the arch limit', async () => {
    await expect(makePlan(qwen3, config, v81, settings({ quant: 'fp32' }))).rejects.toThrow(PlanError);
    await expect(makePlan(qwen3, config, v81, settings({ quant: 'fp32' }))).rejects.toThrow(/needs \d+ contexts, over the v81 limit of 8/);
  });

  it('checks pinned shards for coverage and size', async () => {
    const ok = await makePlan(qwen3, config, v81, settings({ shards: [[0, 17], [18, 35]] }));
    expect(ok.shards.length).toBe(2);
    await expect(makePlan(qwen3, config, v81, settings({ shards: [[0, 10], [12, 35]] }))).rejects.toThrow(/without gaps/);
    await expect(makePlan(qwen3, config, v81, settings({ shards: [[0, 34]] }))).rejects.toThrow(/model has 36 layers/);
    await expect(makePlan(qwen3, config, v81, settings({ shards: [[0, 25], [26, 35]] }))).rejects.toThrow(/shard 0 \(layers 0-25\) stores .* over the v81 ceiling/);
  });

  it('puts the lm-head in the last shard when asked, and counts it there', async () => {
    const plan = await makePlan(qwen3, config, v81, settings({ lmHead: { placement: 'last-shard', quant: 'w8' } }));
    expect(plan.contexts).toBe(plan.shards.length);
    const last = plan.shards[plan.shards.length - 1];
    expect(last.weightBytes).toBeLessThanOrEqual(v81.contextCeilingBytes);
  });

  it('counts the graphs a process sets up, and keeps Qwen3-4B\'s five within v81\'s limit', async () => {
    const plan = await makePlan(qwen3, config, v81, settings());
    expect(plan.graphs).toBe(5); // two shards × {prefill, decode} + the lm-head
    expect(plan.dropped).toBeUndefined();
    expect(plan.shards.map((s) => s.graphs)).toEqual([['prefill', 'decode'], ['prefill', 'decode']]);
  });

  it('drops the optional batched prefill, saying why in the plan, when the graphs would exceed the arch\'s graphs per process', async () => {
    const tight = { ...v81, maxGraphsPerProcess: 3 };
    const plan = await makePlan(qwen3, config, tight, settings());
    expect(plan.graphs).toBe(3);
    expect(plan.shards.map((s) => s.graphs)).toEqual([['decode'], ['decode']]);
    expect(plan.dropped!.map((d) => d.graph)).toEqual(['shard0.prefill', 'shard1.prefill']);
    for (const d of plan.dropped!) expect(d.why).toMatch(/^5 graphs are over the v81 limit of 3 graphs per process .*optional, batched prefill: without it the runtime decodes over the prompt/);
    // Only the graphs change: the cut and the bytes are the unconstrained plan's.
    const free = await makePlan(qwen3, config, v81, settings());
    expect(plan.shards.map((s) => [s.first, s.last, s.weightBytes])).toEqual(free.shards.map((s) => [s.first, s.last, s.weightBytes]));
    expect(formatPlan(plan)).toContain('dropped shard0.prefill: 5 graphs are over the v81 limit of 3');
  });

  it('refuses, naming the limit, when the required graphs alone exceed the graphs per process', async () => {
    const tiny = { ...v81, maxGraphsPerProcess: 2 };
    await expect(makePlan(qwen3, config, tiny, settings())).rejects.toThrow(PlanError);
    await expect(makePlan(qwen3, config, tiny, settings())).rejects.toThrow('the plan needs 3 graphs after dropping the optional shard0.prefill, shard1.prefill, over the v81 limit of 2 graphs per process');
    // Without a prefill there is nothing optional to drop.
    await expect(makePlan(qwen3, config, tiny, settings({ prefillLength: 0 }))).rejects.toThrow(/^the plan needs 3 graphs, over the v81 limit of 2 graphs per process/);
  });

  it('records where each arch\'s graphs-per-process limit comes from: v79 ran the 64-graph Phi-tiny-MoE bundle, v81 did not', () => {
    expect(getArch('v79').maxGraphsPerProcess).toBe(64);
    expect(v81.maxGraphsPerProcess).toBeLessThan(64);
    expect(v81.knownBlocks.find((b) => b.id === 'cdsp-heap')).toMatchObject({ source: '[phimoe]' });
  });

  it('rejects a config field it cannot honour, naming the file and field', () => {
    expect(() => parseQwen3Config({ ...recipe.config, num_key_value_heads: 7 }, 'config.json')).toThrow('config.json: field num_key_value_heads: 7 does not divide num_attention_heads 32');
    expect(() => parseQwen3Config({ ...recipe.config, hidden_size: 'big' }, 'config.json')).toThrow(/config.json: field hidden_size/);
  });
});
