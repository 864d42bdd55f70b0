// Qwen3-VL's graphs against Hugging Face on a random-weight checkpoint (no twin, no training): the
// vision encoder (patch embedding, the resampled position table, 2-D RoPE, the blocks, the merger and
// the DeepStack mergers), and the text shards with interleaved M-RoPE and the DeepStack additions,
// over two shards, a padded prefill chunk and one decode step after it. Plus what the family reads
// of a config and what the planner makes of the real 2B recipe.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import * as ort from 'onnxruntime-node';
import { ensureVenv } from '../src/toolchain/venv.js';
import { runExport } from '../src/export/stage.js';
import { openSafetensors, type SafetensorsFile } from '../src/io/safetensors.js';
import { toFloat32 } from '../src/io/dtype.js';
import { attentionMask } from '../src/families/blocks.js';
import { mropeAxes, parseQwen3VLConfig, qwen3_vl } from '../src/families/qwen3_vl.js';
import { mergeBlockOrder, positionTaps } from '../src/families/qwen-vit.js';
import { planRecipe } from '../src/plan/for-recipe.js';
import { loadRecipe } from '../src/recipe/load.js';
import { getArch } from '../src/arch/table.js';
import type { ExportManifest, GraphEntry } from '../src/export/graphs.js';
import type { Trace } from '../src/gates/trace.js';

let dir = '';
let ref: SafetensorsFile;
const H = 64;
const CTX = 64;
const N = 20; // prefill tokens per call: the 17-token prompt is one chunk with 3 padding rows
const get = async (name: string) => {
  const info = ref.tensors.get(name)!;
  return toFloat32(info.dtype, await ref.read(name));
};
const ints = async (name: string) => Int32Array.from(await get(name));

function similarity(a: Float32Array, b: Float32Array, n = b.length): { cosine: number; maxAbs: number } {
  let dot = 0, aa = 0, bb = 0, maxAbs = 0;
  for (let i = 0; i < n; i++) {
    dot += a[i] * b[i]; aa += a[i] * a[i]; bb += b[i] * b[i];
    maxAbs = Math.max(maxAbs, Math.abs(a[i] - b[i]));
  }
  return { cosine: dot / Math.sqrt(aa * bb), maxAbs };
}

async function exportAs(scheme: 'fp32' | 'w8'): Promise<string> {
  const out = join(dir, scheme);
  mkdirSync(out);
  const plan = { shards: [{ first: 0, last: 1 }, { first: 2, last: 3 }], lmHead: { placement: 'separate' as const } };
  await runExport({ family: 'qwen3_vl', scheme, lmHeadScheme: scheme, maxContext: CTX, prefillLength: N, hostTables: false, image: { height: 96, width: 128 } },
    join(dir, 'ckpt'), plan, out, { log() {}, progress() {} });
  return out;
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'forge-qwen3-vl-'));
  const python = await ensureVenv();
  await $({ quiet: true })`${python} test/helpers/qwen3_vl_reference.py ${dir}`;
  ref = await openSafetensors(join(dir, 'reference.safetensors'));
}, 600_000);

afterAll(async () => {
  await ref?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('qwen3_vl graphs against Hugging Face (random weights)', () => {
  let fp32 = '';
  beforeAll(async () => { fp32 = await exportAs('fp32'); }, 120_000);

  it('the vision encoder gives HF\'s merged image tokens, DeepStack features and block outputs', async () => {
    const s = await ort.InferenceSession.create(join(fp32, 'vision.onnx'));
    const r = await s.run({ pixel_values: new ort.Tensor('float32', await get('pixels'), [48, 1536]) });
    expect(r.image_embeds.dims).toEqual([12, 64]);
    expect(similarity(r.image_embeds.data as Float32Array, await get('merged')).cosine).toBeGreaterThan(0.999999);
    for (const k of [0, 1, 2]) expect(similarity(r[`deepstack_${k}`].data as Float32Array, await get(`deepstack.${k}`)).cosine).toBeGreaterThan(0.999999);
    await s.release();
  });

  it('the text shards with M-RoPE and DeepStack give HF\'s final hidden state for an image prompt, then one decode step', async () => {
    const mrope = await ints('mrope'); // [3, 17]
    const pos = new Int32Array(3 * N);
    // Padding rows (17..19) get positions one further each; the mask hides them.
    for (let a = 0; a < 3; a++) for (let r = 0; r < N; r++) pos[a * N + r] = mrope[a * 17 + Math.min(r, 16)] + Math.max(0, r - 16);
    const pad = (x: Float32Array) => { const o = new Float32Array(N * H); o.set(x.subarray(0, 17 * H)); return o; };
    const caches = new Map<string, Float32Array>();
    let x: Float32Array = pad(await get('embeds'));
    const shards: Array<[number, number[]]> = [[0, [0, 1]], [1, [2, 3]]];
    for (const [k, layers] of shards) {
      const s = await ort.InferenceSession.create(join(fp32, `shard${k}.prefill.onnx`));
      const feeds: Record<string, ort.Tensor> = {
        hidden_in: new ort.Tensor('float32', x, [1, N, H]), position: new ort.Tensor('int32', pos, [3, N]),
        attn_mask: new ort.Tensor('float32', attentionMask(CTX, N, 0, 17), [1, 1, N, CTX + N]),
      };
      for (const l of layers) {
        for (const kv of ['k', 'v']) feeds[`past_${kv}_${l}`] = new ort.Tensor('float32', new Float32Array(2 * CTX * 32), [1, 2, CTX, 32]);
        if (l < 3) feeds[`deepstack_${l}`] = new ort.Tensor('float32', pad(await get(`ds.${l}`)), [1, N, H]);
      }
      const r = await s.run(feeds);
      x = r.hidden_out.data as Float32Array;
      // Keep the prompt's K/V rows for the decode step (slots 0..16).
      for (const l of layers) {
        for (const kv of ['k', 'v']) {
          const rows = r[`new_${kv}_${l}`].data as Float32Array; // [1, 2, N, 32]
          const cache = new Float32Array(2 * CTX * 32);
          for (let h = 0; h < 2; h++) cache.set(rows.subarray(h * N * 32, (h * N + 17) * 32), h * CTX * 32);
          caches.set(`${kv}${l}`, cache);
        }
      }
      await s.release();
    }
    expect(similarity(x, await get('final'), 17 * H).cosine).toBeGreaterThan(0.999999);

    // One decode step after the prompt: a text token at HF's position 17 + rope_delta, no DeepStack.
    const next = (await ints('token_next'))[0];
    const nextPos = await ints('mrope_next');
    let h: Float32Array = await readEmbeddingRow(next);
    for (const [k, layers] of shards) {
      const s = await ort.InferenceSession.create(join(fp32, `shard${k}.decode.onnx`));
      const feeds: Record<string, ort.Tensor> = {
        hidden_in: new ort.Tensor('float32', h, [1, 1, H]), position: new ort.Tensor('int32', Int32Array.from(nextPos), [3, 1]),
        attn_mask: new ort.Tensor('float32', attentionMask(CTX, 1, 17), [1, 1, 1, CTX + 1]),
      };
      for (const l of layers) {
        for (const kv of ['k', 'v']) feeds[`past_${kv}_${l}`] = new ort.Tensor('float32', caches.get(`${kv}${l}`)!, [1, 2, CTX, 32]);
        if (l < 3) feeds[`deepstack_${l}`] = new ort.Tensor('float32', new Float32Array(H), [1, 1, H]);
      }
      h = (await s.run(feeds)).hidden_out.data as Float32Array;
      await s.release();
    }
    expect(similarity(h, await get('final_next')).cosine).toBeGreaterThan(0.999999);
  });

  it('the W8 graphs stay within the shipped threshold of HF', async () => {
    const w8 = await exportAs('w8');
    const s = await ort.InferenceSession.create(join(w8, 'vision.onnx'));
    const r = await s.run({ pixel_values: new ort.Tensor('float32', await get('pixels'), [48, 1536]) });
    expect(similarity(r.image_embeds.data as Float32Array, await get('merged')).cosine).toBeGreaterThan(0.999);
    await s.release();
    const exp = JSON.parse(readFileSync(join(w8, 'graphs.json'), 'utf8')) as ExportManifest;
    // The encoder is a context of its own, first; its matmuls stored at W8 like the layers'.
    expect(exp.contexts.map((c) => c.name)).toEqual(['vision', 'shard0', 'shard1', 'lm_head']);
    expect(exp.contexts[0].matrices!.every((x) => x.scheme === 'w8')).toBe(true);
    expect(exp.image).toEqual({ height: 96, width: 128 });
  });
});

/** The checkpoint's (tied) embedding row of a token, as float32. */
async function readEmbeddingRow(token: number): Promise<Float32Array> {
  const ck = await openSafetensors(join(dir, 'ckpt', 'model.safetensors'));
  try {
    const name = 'model.language_model.embed_tokens.weight';
    const all = toFloat32(ck.tensors.get(name)!.dtype, await ck.read(name));
    return all.slice(token * H, (token + 1) * H);
  } finally {
    await ck.close();
  }
}

describe('qwen3_vl pieces', () => {
  it('interleaves the t, h, w frequencies as HF does: h at 1, 4, 7 … and w at 2, 5, 8 … within 3 × their section', () => {
    const axes = mropeAxes([24, 20, 20], 128);
    expect(axes.length).toBe(128);
    expect(axes.slice(0, 9)).toEqual([0, 1, 2, 0, 1, 2, 0, 1, 2]);
    // Past 3·20 = 60 only t is left; both halves are alike.
    expect(axes.slice(60, 64)).toEqual([0, 0, 0, 0]);
    expect(axes.slice(64, 73)).toEqual(axes.slice(0, 9));
    expect(axes.filter((a) => a === 1).length).toBe(2 * 20);
  });

  it('orders patches in 2×2 merge blocks and takes bilinear position taps with aligned corners', () => {
    expect(mergeBlockOrder(4, 4, 2).slice(0, 6)).toEqual([[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3]]);
    // A 2×2 grid on a 2×2 table is the table itself: each patch one tap of weight 1.
    const t = positionTaps(2, 2, 2, 2);
    for (let p = 0; p < 4; p++) {
      const w = Array.from(t.weights.subarray(p * 4, p * 4 + 4));
      expect(w.filter((x) => x === 1).length).toBe(1);
      expect(Number(t.indices[p * 4 + w.indexOf(1)])).toBe(p);
    }
  });

  it("reads the hub's config.json (rope_scaling beside rope_theta) as transformers 5 writes it (rope_parameters)", () => {
    const { recipe } = loadRecipe('qwen3-vl-2b');
    const c = parseQwen3VLConfig(recipe.config, 'config.json');
    expect(c).toMatchObject({ hidden: 2048, layers: 28, heads: 16, kvHeads: 8, headDim: 128, ropeTheta: 5e6, tied: true, mropeSection: [24, 20, 20] });
    expect(c.vision).toMatchObject({ depth: 24, hidden: 1024, heads: 16, patch: 16, merge: 2, outHidden: 2048, deepstack: [5, 11, 17], ropeTheta: 10_000 });
    expect(c.tokens).toEqual({ image: 151655, visionStart: 151652, visionEnd: 151653 });
  });

  it('refuses a config it would get wrong, naming the field', () => {
    const { recipe } = loadRecipe('qwen3-vl-2b');
    const raw = JSON.parse(JSON.stringify(recipe.config)) as { text_config: Record<string, any>; vision_config: Record<string, any> };
    const variant = (f: (r: typeof raw) => void) => { const r = JSON.parse(JSON.stringify(raw)); f(r); return () => parseQwen3VLConfig(r, 'config.json'); };
    expect(variant((r) => { r.text_config.rope_scaling.mrope_interleaved = false; })).toThrow(/text_config\.rope_parameters\.mrope_interleaved/);
    expect(variant((r) => { r.text_config.rope_scaling.mrope_section = [24, 20, 19]; })).toThrow(/mrope_section.*head_dim\/2 = 64/);
    expect(variant((r) => { r.vision_config.deepstack_visual_indexes = [5, 11, 24]; })).toThrow(/deepstack_visual_indexes\.2.*depth 24/);
    expect(variant((r) => { r.vision_config.out_hidden_size = 1024; })).toThrow(/vision_config\.out_hidden_size/);
    expect(variant((r) => { r.vision_config.hidden_act = 'gelu'; })).toThrow(/vision_config\.hidden_act/);
  });

  it('an image size the grid cannot take is refused; without one the family has no encoder (text path only)', () => {
    const c = parseQwen3VLConfig(loadRecipe('qwen3-vl-2b').recipe.config, 'config.json');
    const layout = { shards: [{ first: 0, last: 27, isLast: true }], lmHeadInside: false, prefillLength: 0, maxContext: 64 };
    expect(qwen3_vl.components(c, layout).map((x) => x.name)).toEqual(['shard0', 'lm_head']);
    expect(qwen3_vl.components(c, { ...layout, image: { height: 512, width: 512 } }).map((x) => x.name)).toEqual(['vision', 'shard0', 'lm_head']);
    expect(() => qwen3_vl.components(c, { ...layout, image: { height: 500, width: 512 } })).toThrow(/image height 500 is not a multiple of patch 16 × merge 2/);
  });

  it('refuses to gate the vision encoder on a trace without an image prompt, saying what is missing', async () => {
    const c = parseQwen3VLConfig(loadRecipe('qwen3-vl-2b').recipe.config, 'config.json');
    const trace = { meta: { prompts: [{ text: 'x', prompt_tokens: [1], generated: [2], steps: 1 }] } } as unknown as Trace;
    const entry = { name: 'vision', kind: 'vision', inputs: [], outputs: [], probes: {} } as unknown as GraphEntry;
    await expect(qwen3_vl.gateCases(c, entry, trace, 64, '').next()).rejects.toThrow(/vision: the trace holds no image prompt.*gates\.imagePrompts/);
  });

  for (const arch of ['v79', 'v81']) {
    it(`plans qwen3-vl-2b for ${arch}: the vision encoder in a context of its own, prefill and decode sharing one, within the arch's limits`, async () => {
      const plan = await planRecipe('qwen3-vl-2b', arch);
      const a = getArch(arch);
      expect(plan.encoders).toEqual([{ name: 'vision', weightBytes: expect.any(Number), graphs: ['vision'] }]);
      expect(plan.encoders![0].weightBytes).toBeGreaterThan(300e6);
      expect(plan.shards.map((s) => s.graphs)).toEqual([['prefill', 'decode']]);
      expect(plan.lmHead).toMatchObject({ placement: 'last-shard', quant: 'w8', tied: true });
      expect(plan.contexts).toBe(2);
      expect(plan.contexts).toBeLessThanOrEqual(a.maxContexts);
      expect(plan.graphs).toBeLessThanOrEqual(a.maxGraphsPerProcess);
      for (const s of plan.shards) expect(s.weightBytes).toBeLessThanOrEqual(a.contextCeilingBytes);
      expect(plan.encoders![0].weightBytes).toBeLessThanOrEqual(a.contextCeilingBytes);
    });
  }
});
