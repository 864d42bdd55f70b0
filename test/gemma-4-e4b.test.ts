// The gemma-4-e4b recipe (google/gemma-4-E4B, the base model) plans offline from its recorded
// config: the parts fit each arch's per-context ceiling (the lm-head apart, or inside the last part
// where a recipe asks: it fits too), the plan JSON carries the two host tables with their bytes, and each part stores only its layers' rows of
// the per-layer projection (per_layer_model_projection [42·256, 2560]), so the model's parts hold
// that matrix once between them instead of once per layer; the parts' prefill graphs take 128
// tokens over rings of window + 127 slots, the last part reading its donors' caches.
import { describe, expect, it } from 'vitest';
import { loadRecipe, archSettings } from '../src/recipe/load.js';
import { planRecipe } from '../src/plan/for-recipe.js';
import { makePlan } from '../src/plan/shards.js';
import { getArch } from '../src/arch/table.js';
import { gemma4, parseGemma4Config, PREFIX } from '../src/families/gemma4.js';
import { componentTensors, layerTensors, modelTensors, allTensors } from '../src/families/tensors.js';
import { storedBytes, sumBytes } from '../src/quant/bytes.js';
import { GraphBuilder } from '../src/onnx/index.js';

const PROJ = `${PREFIX}.per_layer_model_projection.weight`;
const { recipe } = loadRecipe('gemma-4-e4b');
const config = parseGemma4Config(recipe.config, 'gemma-4-e4b');
const V = 262144, H = 2560, L = 42, P = 256;

describe('gemma-4-e4b recipe', () => {
  it('pins a hub revision of google/gemma-4-E4B and records the real text config', () => {
    expect(recipe.source).toMatchObject({ kind: 'hub', repo: 'google/gemma-4-E4B' });
    expect((recipe.source as { revision: string }).revision).toMatch(/^[0-9a-f]{40}$/);
    expect(config).toMatchObject({ hidden: H, layers: L, vocab: V, ple: P, slidingWindow: 512, softcap: 30, tied: true });
    expect(config.layer.filter((l) => l.type === 'full_attention').map((l) => l.headDim)).toEqual(Array(7).fill(512));
    expect(config.layer.map((l, i) => (l.type === 'full_attention') === (i % 6 === 5)).every(Boolean)).toBe(true);
    // The last 18 layers read layer 22's (sliding) or 23's (full) K/V.
    expect([...new Set(config.layer.slice(24).map((l) => l.kvFrom))].sort()).toEqual([22, 23]);
    expect(config.layer.slice(0, 24).every((l, i) => l.kvFrom === i)).toBe(true);
    const s = archSettings(recipe, 'v81').settings;
    expect(s).toMatchObject({ shards: 'auto', quant: 'w8', maxContext: 4096, prefillLength: 128, lmHead: { placement: 'separate', quant: 'fp16' } });
  });
});

describe('gemma-4-e4b plan', () => {
  for (const arch of ['v81', 'v79']) {
    it(`${arch}: three parts under the ceiling, the lm-head apart, host tables with their bytes`, async () => {
      const plan = await planRecipe('gemma-4-e4b', arch);
      const json = JSON.parse(JSON.stringify(plan)) as typeof plan; // what --json prints
      const ceiling = getArch(arch).contextCeilingBytes;
      expect(json.shards.length).toBe(3);
      expect(json.shards.map((s) => [s.first, s.last]).flat()[0]).toBe(0);
      expect(json.shards[json.shards.length - 1].last).toBe(L - 1);
      for (const s of json.shards) {
        expect(s.weightBytes).toBeGreaterThan(0);
        expect(s.weightBytes).toBeLessThanOrEqual(ceiling);
      }
      expect(json.lmHead).toMatchObject({ placement: 'separate', quant: 'fp16', tied: true, bytes: V * H * 2 + H * 4 });
      expect(json.contexts).toBe(4);
      // Each part prefills 128 tokens a call and decodes one, in one context: 7 graphs, nothing dropped.
      for (const s of json.shards) expect(s.graphs).toEqual(['prefill', 'decode']);
      expect(json.graphs).toBe(7);
      expect(json.dropped).toBeUndefined();
      expect(json.hostTables).toEqual([
        { name: 'embedding', dtype: 'f16', bytes: V * H * 2 },
        { name: 'per_layer_embedding', dtype: 'f16', bytes: V * L * P * 2 },
      ]);
      expect(json.totalContextBytes).toBe(json.shards.reduce((a, s) => a + s.weightBytes, 0) + json.lmHead.bytes);
    });
  }

  it('fits the lm-head inside the last part too: three contexts, each under the ceiling', async () => {
    const settings = { ...archSettings(recipe, 'v81').settings, lmHead: { placement: 'last-shard' as const, quant: 'fp16' as const } };
    const plan = await makePlan(gemma4, config, getArch('v81'), settings);
    expect(plan.contexts).toBe(3);
    for (const s of plan.shards) expect(s.weightBytes).toBeLessThanOrEqual(getArch('v81').contextCeilingBytes);
    const apart = await planRecipe('gemma-4-e4b', 'v81');
    expect(plan.totalContextBytes).toBe(apart.totalContextBytes);
  });

  it("stores each part's rows of the per-layer projection, the whole matrix once across the parts", async () => {
    const w8 = (rows: number) => storedBytes({ name: PROJ, shape: [rows, H], role: 'matmul' }, 'w8');
    // A one-layer part reads rows i·P..(i+1)·P.
    const one = (await layerTensors(gemma4, config, 7)).find((t) => t.name === PROJ)!;
    expect(one).toMatchObject({ shape: [L * P, H], rows: [7 * P, 8 * P] });
    expect(storedBytes(one, 'w8')).toBe(w8(P));
    // A planned part reads its layers' rows.
    const plan = await makePlan(gemma4, config, getArch('v81'), archSettings(recipe, 'v81').settings);
    const layout = { shards: plan.shards.map((s, i) => ({ first: s.first, last: s.last, isLast: i === plan.shards.length - 1 })), lmHeadInside: false, prefillLength: 0, maxContext: 0 };
    let across = 0;
    for (const [i, c] of gemma4.components(config, layout).filter((k) => k.entry.shard !== undefined).entries()) {
      const proj = (await componentTensors(c)).find((t) => t.name === PROJ)!;
      const { first, last } = plan.shards[i];
      expect(proj.rows).toEqual([first * P, (last + 1) * P]);
      across += storedBytes(proj, 'w8');
    }
    expect(across).toBe(w8(L * P));
    // The parts' bytes are the layers' plus the head: the projection is not counted once per layer.
    const m = await modelTensors(gemma4, config);
    const layers = m.layers.reduce((a, ts) => a + sumBytes(ts, 'w8'), 0);
    const head = sumBytes(m.lmHead, 'fp16') + sumBytes(m.final, 'fp16');
    expect(plan.totalContextBytes).toBe(layers + head);
    expect(plan.shards.reduce((a, s) => a + s.weightBytes, 0)).toBe(layers); // the final norm goes with the lm-head apart
    const perLayerWhole = L * (w8(L * P) - w8(P)); // what reading the whole matrix in every layer added
    expect(perLayerWhole).toBeGreaterThan(1.1e9);
    // The checkpoint's tensor list keeps the whole matrix.
    expect(allTensors(m).find((t) => t.name === PROJ)).toEqual({ name: PROJ, shape: [L * P, H], role: 'matmul', scheme: 'fp32' });
  });
});

describe('gemma-4-e4b prefill graphs (built dry: no checkpoint)', () => {
  // A store whose every read is one node: the graphs' interfaces, not their numbers.
  const store = {
    linear: async (g: GraphBuilder, x: string) => g.op('Identity', [x]),
    small: async (g: GraphBuilder, name: string, shape: number[]) => g.initializer(name.replace(/\W/g, '_'), new Float32Array(shape.reduce((a, b) => a * b, 1)), shape, 'float32'),
  };
  it('takes 128 tokens a call over rings of 639 slots (window 512 + 127); the last part, KV-shared layers only, reads donor 22\'s ring and 23\'s cache at the call\'s slots and writes none', async () => {
    const s = archSettings(recipe, 'v81').settings;
    const plan = await makePlan(gemma4, config, getArch('v81'), s);
    const layout = { shards: plan.shards.map((x, i) => ({ first: x.first, last: x.last, isLast: i === plan.shards.length - 1 })), lmHeadInside: false, prefillLength: s.prefillLength, maxContext: s.maxContext };
    const parts = gemma4.components(config, layout).filter((c) => c.entry.shard !== undefined);
    expect(parts.map((c) => c.variants.map((v) => `${v.name}:${v.n}`))).toEqual(Array(3).fill(['prefill:128', 'decode:1']));
    const io = async (part: number, variant: number) => {
      const built = await parts[part].variants[variant].build(new GraphBuilder('p'), { store: store as any, scheme: 'fp32', lmHeadScheme: 'fp32' });
      return { in: Object.fromEntries(built.inputs.map((t) => [t.name, t.shape])), out: built.outputs.map((t) => t.name) };
    };
    const first = await io(0, 0);
    expect(first.in.hidden_in).toEqual([1, 128, H]);
    expect(first.in.attn_mask).toEqual([1, 1, 128, 4096 + 128]);
    expect(first.in.attn_mask_sliding).toEqual([1, 1, 128, 639 + 128]);
    expect(first.in.past_k_0).toEqual([1, 2, 639, 256]); // sliding: a ring
    expect(first.in.past_k_5).toEqual([1, 2, 4096, 512]); // full: every position
    const last = await io(2, 0);
    expect(Object.keys(last.in).filter((n) => n.startsWith('past_'))).toEqual(['past_k_22', 'past_v_22', 'past_k_23', 'past_v_23']);
    expect(last.in.past_k_22).toEqual([1, 2, 639, 256]);
    expect(last.in.ring_slot).toEqual([128]);
    expect(last.out).toEqual(['hidden_out']);
    // The decode graph of the same part reads the same caches, one token a call.
    const decode = await io(2, 1);
    expect(decode.in.past_k_22).toEqual([1, 2, 639, 256]);
    expect(decode.in.attn_mask_sliding).toEqual([1, 1, 1, 640]);
  });
});
