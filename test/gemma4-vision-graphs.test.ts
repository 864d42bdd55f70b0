// Gemma 4's vision encoder graph against Hugging Face on a random-weight checkpoint (no twin, no
// training): two images of other aspect ratios than each other's, through HF's own image processor at
// a budget of 70 soft tokens (630 patches; neither image fills it), a tower with 2 layers,
// standardize on and clipped linears whose ranges bite. The oracle gate's own cases
// (gemma4VisionCases, fed from a trace in the trace's layout made by the trace's own hooks) run the
// exported graph in its CPU-gate form: patch embedding with both position tables, every block and
// the soft tokens, the image's rows only. Plus what the family reads of a vision config.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import * as ort from 'onnxruntime-node';
import { ensureVenv } from '../src/toolchain/venv.js';
import { runExport } from '../src/export/stage.js';
import { GRAPHS_JSON, type ExportManifest, type GraphEntry } from '../src/export/graphs.js';
import { gemma4, parseGemma4Config } from '../src/families/gemma4.js';
import { parseGemma4VisionConfig } from '../src/families/gemma4-vision.js';
import { gateSessionOptions, writeGateModel } from '../src/gates/cpu-form.js';
import { compare } from '../src/gates/compare.js';
import { Trace } from '../src/gates/trace.js';
import { loadRecipe } from '../src/recipe/load.js';
import { planRecipe } from '../src/plan/for-recipe.js';
import { getArch } from '../src/arch/table.js';
import { parseQwen3VLConfig, qwen3_vl } from '../src/families/qwen3_vl.js';
import { recipeSandbox, writeRecipeVariant } from './helpers/recipe-sandbox.js';
import { runPython } from '../src/toolchain/python.js';
import { openSafetensors } from '../src/io/safetensors.js';
import { toFloat32 } from '../src/io/dtype.js';

let dir = '';
let trace: Trace;
let made: { images: Array<{ patches: number; tokens: number }> };

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'forge-gemma4-vision-'));
  const python = await ensureVenv();
  const r = await $({ quiet: true })`${python} test/helpers/gemma4_vision_reference.py ${dir}`;
  made = JSON.parse(r.stdout.trim().split('\n').pop()!);
  trace = await Trace.open(join(dir, 'trace'));
}, 600_000);

afterAll(async () => {
  await trace?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** Exports the checkpoint with a 70-token image budget and runs the vision graph's gate cases; the worst cosine per value. */
async function gateVision(scheme: 'fp32' | 'w8'): Promise<Record<string, number>> {
  const out = join(dir, scheme);
  mkdirSync(out);
  const plan = { shards: [{ first: 0, last: 1 }], lmHead: { placement: 'separate' as const } };
  await runExport({ family: 'gemma4', scheme, lmHeadScheme: scheme, maxContext: 64, prefillLength: 0, hostTables: false, image: { maxSoftTokens: 70 } },
    join(dir, 'ckpt'), plan, out, { log() {}, progress() {} });
  const graphs = JSON.parse(readFileSync(join(out, GRAPHS_JSON), 'utf8')) as ExportManifest;
  const entry = graphs.contexts.flatMap((c) => c.graphs).find((g) => g.kind === 'vision') as GraphEntry;
  expect(entry.inputs.map((t) => [t.name, t.dtype, t.shape])).toEqual([['pixel_values', 'float32', [630, 768]], ['pixel_position_ids', 'int32', [630, 2]]]);
  expect(entry.outputs.map((t) => [t.name, t.shape])).toEqual([['soft_tokens', [70, 64]]]);
  const config = parseGemma4Config(JSON.parse(readFileSync(join(dir, 'ckpt', 'config.json'), 'utf8')), 'config.json');
  const scratch = join(out, 'gate');
  mkdirSync(scratch);
  const { path } = writeGateModel(join(out, entry.file), Object.keys(entry.probes), scratch, { tokensPerCall: entry.n });
  const session = await ort.InferenceSession.create(path, gateSessionOptions(1));
  const worst: Record<string, number> = {};
  let cases = 0;
  for await (const c of gemma4.gateCases(config, entry, trace, 64, out)) {
    const feeds = Object.fromEntries(Object.entries(c.feeds).map(([k, f]) => [k, new ort.Tensor(f.dtype, f.data, f.dims)]));
    const r = await session.run(feeds);
    for (const [name, expected] of Object.entries(c.expected)) {
      const what = entry.probes[name]?.name ?? name;
      const mask = c.masks![name];
      // The compared rows are the image's own: its real patches, its soft tokens.
      const tokens = what === 'soft_tokens';
      const width = expected.length / (tokens ? 70 : 630);
      expect(mask.reduce((a, m) => a + m, 0) / width).toBe(tokens ? made.images[c.prompt].tokens : made.images[c.prompt].patches);
      const cmp = compare(r[name].data as Float32Array, expected, mask);
      worst[what] = Math.min(worst[what] ?? 1, cmp.cosine);
    }
    cases++;
  }
  await session.release();
  expect(cases).toBe(2);
  return worst;
}

describe('gemma4 vision encoder against Hugging Face (random weights, two aspect ratios, padded budget)', () => {
  it('fp32: the patch embedding, every block and the soft tokens are HF\'s (cosine ≥ 0.99999 on the image\'s rows)', async () => {
    const worst = await gateVision('fp32');
    expect(Object.keys(worst).sort()).toEqual(['soft_tokens', 'vision.block.0', 'vision.block.1', 'vision.embed']);
    for (const [what, cos] of Object.entries(worst)) expect(cos, what).toBeGreaterThanOrEqual(0.99999);
  }, 300_000);

  it('w8: weight-only int8 keeps every value at cosine ≥ 0.999', async () => {
    const worst = await gateVision('w8');
    for (const [what, cos] of Object.entries(worst)) expect(cos, what).toBeGreaterThanOrEqual(0.999);
  }, 300_000);

  it('w8 compiled for v81 (SM8850) runs whole on the x86 HTP simulator: soft tokens at cosine ≥ 0.9995 to HF\'s', async () => {
    // The w8 export of the test above; compiled alone (no CPU fallback allowed), then both images run.
    const qnn = join(dir, 'qnn');
    const compiled = JSON.parse((await runPython('oracles/qnn_compile.py', ['--out', qnn, '--name', 'vision', '--soc-model', '87', '--fp16', '--separate', join(dir, 'w8', 'vision.onnx')])).stdout);
    expect(compiled.wrappers[0].cpuNodes).toEqual([]);
    expect(compiled.target).toMatchObject({ socModel: 87, dspArch: 'v81' });
    const outFile = join(dir, 'sim-out.safetensors');
    await runPython('oracles/qnn_simulate.py', ['run', '--wrapper', join(qnn, 'vision_ctx.onnx'), '--soc-model', '87', '--feeds', join(dir, 'sim-feeds.safetensors'), '--out', outFile]);
    const sim = await openSafetensors(outFile);
    try {
      for (const [i, image] of made.images.entries()) {
        const got = toFloat32(sim.tensors.get(`${i}/soft_tokens`)!.dtype, await sim.read(`${i}/soft_tokens`));
        const want = await trace.getPrompt(i, 'vision.tokens');
        expect(want.length).toBe(image.tokens * 64);
        expect(compare(got.subarray(0, want.length), want).cosine).toBeGreaterThanOrEqual(0.9995);
      }
    } finally {
      await sim.close();
    }
  }, 300_000);

  it('the two images had their own grids and left part of the budget as padding', () => {
    expect(made.images.map((i) => i.tokens)).toEqual([60, 65]);
    for (const i of made.images) expect(i.patches).toBeLessThan(630);
  });
});

describe('what the family reads of a vision config', () => {
  const base = {
    hidden_size: 48, intermediate_size: 96, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 2, head_dim: 24,
    hidden_activation: 'gelu_pytorch_tanh', rms_norm_eps: 1e-6, pooling_kernel_size: 3, patch_size: 16, position_embedding_size: 64,
    rope_parameters: { rope_type: 'axial', rope_theta: 100 },
  };
  it('reads the tower\'s sizes, RoPE θ, clipping and standardization', () => {
    expect(parseGemma4VisionConfig({ ...base, use_clipped_linears: true, standardize: true }, 'config.json')).toMatchObject({ hidden: 48, heads: 2, headDim: 24, pooling: 3, ropeTheta: 100, clipped: true, standardize: true });
  });
  it('refuses what the graph does not build, naming the field', () => {
    expect(() => parseGemma4VisionConfig({ ...base, num_key_value_heads: 1 }, 'config.json')).toThrow(/config.json: field vision_config.num_key_value_heads: 1 differs/);
    expect(() => parseGemma4VisionConfig({ ...base, head_dim: 22 }, 'config.json')).toThrow(/vision_config.head_dim: 22 is not divisible by 4/);
    expect(() => parseGemma4VisionConfig({ ...base, rope_parameters: { rope_type: 'default', rope_theta: 100 } }, 'config.json')).toThrow(/rope_parameters.rope_type: only axial/);
    expect(() => parseGemma4VisionConfig({ ...base, hidden_activation: 'gelu' }, 'config.json')).toThrow(/hidden_activation: only gelu_pytorch_tanh/);
  });
});

describe('the vision encoder as a component of the family', () => {
  const e4b = () => loadRecipe('gemma-4-e4b').recipe.config as Record<string, unknown>;
  // Gemma 4 E4B's vision tower at transformers' Gemma4VisionConfig defaults (the recipe records the
  // text model only; the hub config was not available here to copy the tower's from) and its tokens
  // from the hub tokenizer (REFERENCE.md).
  const withTower = () => ({ ...e4b(), vision_config: { hidden_size: 768, intermediate_size: 3072, num_hidden_layers: 16, num_attention_heads: 12, num_key_value_heads: 12, head_dim: 64, hidden_activation: 'gelu_pytorch_tanh', rms_norm_eps: 1e-6, pooling_kernel_size: 3, patch_size: 16, position_embedding_size: 10240, rope_parameters: { rope_type: 'axial', rope_theta: 100 } }, image_token_id: 258880, boi_token_id: 255999, eoi_token_id: 258882 });
  const layout = { shards: [{ first: 0, last: 41, isLast: true }], lmHeadInside: false, prefillLength: 0, maxContext: 64 };

  it('is there only when the recipe gives images a soft-token budget, and refuses the other forms', () => {
    const c = parseGemma4Config(withTower(), 'config.json');
    expect(gemma4.components(c, layout).map((x) => x.name)).toEqual(['shard0', 'lm_head']);
    const vision = gemma4.components(c, { ...layout, image: { maxSoftTokens: 280 } })[0];
    expect([vision.name, vision.weights, vision.variants[0].n]).toEqual(['vision', 'encoder', 2520]);
    expect(() => gemma4.components(c, { ...layout, image: { height: 768, width: 768 } })).toThrow(/soft-token budget: the recipe's image setting is \{"maxSoftTokens": N\}/);
    expect(() => gemma4.components(c, { ...layout, image: { maxSoftTokens: 256 } })).toThrow(/maxSoftTokens 256: Gemma 4's image processor supports 70, 140, 280, 560, 1120/);
    const text = parseGemma4Config(e4b(), 'config.json');
    expect(() => gemma4.components(text, { ...layout, image: { maxSoftTokens: 280 } })).toThrow(/no vision tower \(config.json has no vision_config\)/);
    expect(() => parseGemma4Config({ ...withTower(), eoi_token_id: undefined }, 'config.json')).toThrow(/config.json: field eoi_token_id: is missing/);
  });

  it('qwen3_vl refuses a soft-token budget: its encoder has a fixed grid', () => {
    const c = parseQwen3VLConfig(loadRecipe('qwen3-vl-2b').recipe.config, 'config.json');
    expect(() => qwen3_vl.components(c, { shards: [{ first: 0, last: 27, isLast: true }], lmHeadInside: false, prefillLength: 0, maxContext: 64, image: { maxSoftTokens: 280 } }))
      .toThrow(/qwen3_vl stretches every image to one size/);
  });

  for (const arch of ['v79', 'v81']) {
    it(`plans gemma-4-e4b with the E4B vision tower (280 soft tokens) for ${arch}: the encoder in a context of its own, within the arch's limits`, async () => {
      const { recipes } = recipeSandbox('forge-gemma4-vision-plan-');
      writeRecipeVariant(recipes, 'gemma-4-e4b', 'gemma-4-e4b-vision', (r) => { r.config = withTower(); r.arch.default.image = { maxSoftTokens: 280 }; r.modalities = ['text', 'image']; });
      const before = process.env.FORGE_RECIPES;
      process.env.FORGE_RECIPES = recipes;
      try {
        const plan = await planRecipe('gemma-4-e4b-vision', arch);
        const a = getArch(arch);
        expect(plan.encoders).toEqual([{ name: 'vision', weightBytes: expect.any(Number), graphs: ['vision'] }]);
        // ~152 M matrix weights at W8 (~1 byte each) plus the position table and norms in float32.
        expect(plan.encoders![0].weightBytes).toBeGreaterThan(150e6);
        expect(plan.encoders![0].weightBytes).toBeLessThanOrEqual(a.contextCeilingBytes);
        expect(plan.contexts).toBeLessThanOrEqual(a.maxContexts);
        expect(plan.graphs).toBeLessThanOrEqual(a.maxGraphsPerProcess);
      } finally {
        if (before === undefined) delete process.env.FORGE_RECIPES;
        else process.env.FORGE_RECIPES = before;
      }
    });
  }
});
