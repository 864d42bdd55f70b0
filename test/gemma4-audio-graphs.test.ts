// Gemma 4's audio encoder graph (src/families/gemma4-audio.ts) against Hugging Face on a random-weight
// checkpoint (test/helpers/gemma4_audio_reference.py: 3 conformer layers, hidden 32, chunks of 4
// tokens with 4 rows of left context over 16 tokens, a padded tail, clip bounds that cut): every
// probe at fp32, the soft tokens at W8 as the export stage writes them, and the config refusals.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import * as ort from 'onnxruntime-node';
import { ensureVenv } from '../src/toolchain/venv.js';
import { openSafetensors, type SafetensorsFile } from '../src/io/safetensors.js';
import { toFloat32 } from '../src/io/dtype.js';
import { openCheckpoint } from '../src/io/checkpoint.js';
import { ExternalDataWriter } from '../src/onnx/external.js';
import { GraphBuilder, type RescaleRule } from '../src/onnx/builder.js';
import { writeModel } from '../src/onnx/writer.js';
import { writeProbeModel } from '../src/gates/probe.js';
import { WeightStore } from '../src/quant/weights.js';
import type { QuantScheme } from '../src/recipe/schema.js';
import { getArch } from '../src/arch/table.js';
import { compileContext } from '../src/toolchain/qnn/compile.js';
import { hostWithoutSimulator, qnnSimulateScript, simulateBatch, simulatorInfo, writeFeeds } from '../src/gates/emulation.js';
import { venvPython } from '../src/toolchain/venv.js';
import type { GraphInterface } from '../src/families/types.js';
import { type Gemma4AudioConfig, AUDIO_EMBEDS, AUDIO_FEATURES, AUDIO_MASK, audioShapes, bandMask, gemma4AudioEncoderGraph, gemma4AudioFrames, parseGemma4AudioConfig, relativePositions } from '../src/families/gemma4-audio.js';
import { loadRecipe } from '../src/recipe/load.js';
import { planRecipe } from '../src/plan/for-recipe.js';
import { recipeSandbox, writeRecipeVariant } from './helpers/recipe-sandbox.js';

const FRAMES = 64;
const T = 16;
const VALID = 14; // HF's output mask: ceil(53 / 4) rows
const H = 32;
const TEXT = 64;
let dir = '';
let ref: SafetensorsFile;
const get = async (name: string) => toFloat32(ref.tensors.get(name)!.dtype, await ref.read(name));

function cosine(a: Float32Array, b: Float32Array, n = b.length): number {
  let dot = 0, aa = 0, bb = 0;
  for (let i = 0; i < n; i++) { dot += a[i] * b[i]; aa += a[i] * a[i]; bb += b[i] * b[i]; }
  return dot / Math.sqrt(aa * bb);
}

/** The encoder graph built as the export stage builds a component: one data file, weights in `scheme`. */
async function buildAudio(scheme: QuantScheme, change: Partial<Gemma4AudioConfig> = {}, name: string = scheme, rescale: RescaleRule[] = []): Promise<{ file: string; iface: GraphInterface; unused: RescaleRule[] }> {
  const out = join(dir, name);
  mkdirSync(out);
  const ckptDir = join(dir, 'ckpt');
  const config = { ...parseGemma4AudioConfig(JSON.parse(readFileSync(join(ckptDir, 'config.json'), 'utf8')), 'config.json'), ...change };
  const ckpt = await openCheckpoint(ckptDir);
  const sink = new ExternalDataWriter(join(out, 'audio.data'));
  try {
    const g = new GraphBuilder('audio', { rescale });
    const iface = await gemma4AudioEncoderGraph(g, config, TEXT, FRAMES, { store: new WeightStore(ckpt, sink), scheme, lmHeadScheme: scheme });
    await sink.commitAsync();
    const file = join(out, 'audio.onnx');
    writeModel(g, file, { externalThreshold: Infinity });
    return { file, iface, unused: g.unusedRescales() };
  } finally {
    await ckpt.close();
  }
}

/** The graph with its probes as outputs, as the oracle gate writes it. */
const probed = (file: string, iface: GraphInterface) => writeProbeModel(file, Object.keys(iface.probes), join(file, '..', 'probed'));

/** Runs the graph with every probe as an extra output: probe name → values. */
async function runAudio(file: string, iface: GraphInterface): Promise<Record<string, Float32Array>> {
  const s = await ort.InferenceSession.create(probed(file, iface));
  try {
    const feeds = {
      [AUDIO_FEATURES]: new ort.Tensor('float32', await get('features'), [FRAMES, 128]),
      [AUDIO_MASK]: new ort.Tensor('float32', await get('mask'), [FRAMES]),
    };
    const r = await s.run(feeds, [AUDIO_EMBEDS, ...Object.keys(iface.probes)]);
    return Object.fromEntries(Object.entries(r).map(([k, v]) => [k, v.data as Float32Array]));
  } finally {
    await s.release();
  }
}

/** Each probe's HF tensor and width; only the valid rows are compared (HF drops the rest). */
const PROBES: Array<[string, string, number]> = [
  ['audio.embed', 'embed', H], ['audio.layer.0', 'layer.0', H], ['audio.layer.1', 'layer.1', H], ['audio.layer.2', 'layer.2', H],
  ['audio.encoder', 'encoder', 48], ['audio.tokens', 'tokens', TEXT],
];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'forge-gemma4-audio-'));
  const python = await ensureVenv();
  await $({ quiet: true })`${python} test/helpers/gemma4_audio_reference.py ${dir}`;
  ref = await openSafetensors(join(dir, 'reference.safetensors'));
}, 600_000);

afterAll(async () => {
  await ref?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('gemma4 audio encoder graph against Hugging Face (random weights)', () => {
  it('has HF\'s valid rows: the first ceil(valid frames / 4) tokens', async () => {
    expect(Array.from(await get('valid'))).toEqual([...new Array(VALID).fill(1), ...new Array(T - VALID).fill(0)]);
  });

  it('fp32: the subsampling, every conformer layer, the output projection and the soft tokens match HF', async () => {
    const { file, iface } = await buildAudio('fp32');
    expect(iface.inputs).toEqual([{ name: 'input_features', dtype: 'float32', shape: [FRAMES, 128] }, { name: 'input_features_mask', dtype: 'float32', shape: [FRAMES] }]);
    expect(iface.outputs).toEqual([{ name: 'audio_embeds', dtype: 'float32', shape: [T, TEXT] }]);
    expect(Object.keys(iface.probes)).toEqual(PROBES.map(([p]) => p));
    const r = await runAudio(file, iface);
    const cos = Object.fromEntries(await Promise.all(PROBES.map(async ([p, hf, width]) => [p, cosine(r[p], await get(hf), VALID * width)] as const)));
    console.log('gemma4 audio fp32 cosines', cos);
    for (const [p] of PROBES) expect(cos[p], p).toBeGreaterThan(0.99999);
    expect(cosine(r[AUDIO_EMBEDS], await get('tokens'), VALID * TEXT)).toBeGreaterThan(0.99999);
  }, 120_000);

  it("takes a recipe's exact RMSNorm rescaling (forge bisect's fp16 fix) by the norm's path in its layer", async () => {
    const rule = { match: 'audio\\.layers\\.1/lconv1d\\.conv_norm', scale: 1 / 64 };
    const { file, iface, unused } = await buildAudio('fp32', {}, 'rescaled', [rule]);
    expect(unused).toEqual([]);
    const r = await runAudio(file, iface);
    expect(cosine(r['audio.layer.1'], await get('layer.1'), VALID * H)).toBeGreaterThan(0.99999);
  }, 120_000);

  it('needs the clipped linears\' bounds: without them the same weights give other tokens', async () => {
    const { file, iface } = await buildAudio('fp32', { clipped: false }, 'unclipped');
    const r = await runAudio(file, iface);
    expect(cosine(r[AUDIO_EMBEDS], await get('tokens'), VALID * TEXT)).toBeLessThan(0.999);
  }, 120_000);

  it('W8 (MatMulNBits, as the export stage writes it) stays within its measured bound of HF', async () => {
    const { file, iface } = await buildAudio('w8');
    const r = await runAudio(file, iface);
    const cos = Object.fromEntries(await Promise.all(PROBES.map(async ([p, hf, width]) => [p, cosine(r[p], await get(hf), VALID * width)] as const)));
    console.log('gemma4 audio W8 cosines', cos);
    for (const [p] of PROBES) expect(cos[p], p).toBeGreaterThan(0.9998); // measured: 0.99992 at worst (audio.encoder)
  }, 120_000);

  // Compiled for v81 by onnxruntime-qnn (no node left on the CPU, fp16 precision) and run on its x86
  // HTP simulator: ~5 s per scheme for this config.
  for (const [scheme, bound] of [['fp32', 0.99999], ['w8', 0.9998]] as const) {
    it(`${scheme} compiles for v81 whole and the HTP simulator's probes match HF (cosine > ${bound})`, async (ctx) => {
      const python = venvPython();
      const why = hostWithoutSimulator(await simulatorInfo(python));
      if (why) ctx.skip(why);
      const { file, iface } = await buildAudio(scheme, {}, `sim-${scheme}`);
      const arch = getArch('v81');
      const work = join(dir, `sim-${scheme}`, 'qnn');
      const report = await compileContext({ graphs: [probed(file, iface)], outDir: work, contextName: 'audio', arch: { socModel: arch.socModel, dspArch: arch.dspArch, vtcmMb: arch.vtcmMb }, fp16: true, timeoutSeconds: 300, separate: true, python });
      expect(report.wrappers[0].cpuNodes).toEqual([]);
      const feeds = join(work, 'feeds.safetensors');
      const input = { [AUDIO_FEATURES]: { dtype: 'float32' as const, data: await get('features'), dims: [FRAMES, 128] }, [AUDIO_MASK]: { dtype: 'float32' as const, data: await get('mask'), dims: [FRAMES] } };
      await writeFeeds(feeds, [{ prompt: 0, step: 0, feeds: input, expected: {} }]);
      const out = join(work, 'out.safetensors');
      await simulateBatch(python, qnnSimulateScript(), report.wrappers[0].path, arch, true, feeds, out, 300, `audio ${scheme}`);
      const sim = await openSafetensors(out);
      try {
        const cos: Record<string, number> = {};
        for (const [p, hf, width] of PROBES) cos[p] = cosine(toFloat32(sim.tensors.get(`0/${p}`)!.dtype, await sim.read(`0/${p}`)), await get(hf), VALID * width);
        console.log(`gemma4 audio ${scheme} on the v81 simulator: cosines`, cos);
        for (const [p] of PROBES) expect(cos[p], p).toBeGreaterThan(bound);
      } finally {
        await sim.close();
      }
    }, 300_000);
  }
});

describe('gemma4 audio pieces', () => {
  it('sizes a 30 s clip (3000 frames) as HF does: 750 tokens in 63 blocks of 12 with 24 context slots and 13 distances', () => {
    expect(audioShapes({ chunk: 12, contextLeft: 13 }, 3000)).toEqual({ half: 1500, tokens: 750, past: 12, blocks: 63, context: 24, positions: 13 });
    expect(audioShapes({ chunk: 12, contextLeft: 13 }, 61).tokens).toBe(16); // odd lengths round up twice, like the stride-2 convs
  });

  it('lets a block row see itself and past rows at distances below context_left − 1 (HF\'s sliding window), nothing later', () => {
    const m = bandMask(2, 2); // [2, 4]: slots are rows b·2−2 … b·2+1
    expect(Array.from(m)).toEqual([0, 1, 1, 0, 0, 0, 1, 1]);
  });

  it('puts distance positions−1 first, [sin, cos] halves (distance 0 is sin 0, cos 1)', () => {
    const p = relativePositions(4, 3);
    expect(Array.from(p.subarray(8, 12))).toEqual([0, 0, 1, 1]);
    expect(p[0]).toBeCloseTo(Math.sin(2), 6);
  });

  it('refuses an audio config it would get wrong, naming the field', () => {
    const raw = { audio_config: { hidden_size: 1024, num_hidden_layers: 12, num_attention_heads: 8, hidden_act: 'silu', subsampling_conv_channels: [128, 32], conv_kernel_size: 5, residual_weight: 0.5, attention_chunk_size: 12, attention_context_left: 13, attention_context_right: 0, attention_logit_cap: 50, use_clipped_linears: true, rms_norm_eps: 1e-6, gradient_clipping: 1e10, output_proj_dims: 1536 } };
    expect(parseGemma4AudioConfig(raw, 'config.json')).toMatchObject({ hidden: 1024, layers: 12, heads: 8, chunk: 12, contextLeft: 13, outDims: 1536, clipped: true });
    const variant = (patch: Record<string, unknown>) => () => parseGemma4AudioConfig({ audio_config: { ...raw.audio_config, ...patch } }, 'config.json');
    expect(variant({ attention_context_right: 2 })).toThrow(/config\.json: field audio_config\.attention_context_right: must be 0/);
    expect(variant({ subsampling_conv_channels: [64, 32] })).toThrow(/field audio_config\.subsampling_conv_channels\.0/);
    expect(variant({ hidden_act: 'gelu' })).toThrow(/field audio_config\.hidden_act/);
    expect(variant({ num_attention_heads: 7 })).toThrow(/field audio_config\.num_attention_heads: 7 does not divide hidden_size 1024/);
    expect(variant({ attention_chunk_size: 16 })).toThrow(/field audio_config\.attention_chunk_size: 16 exceeds attention_context_left 13/);
    expect(() => parseGemma4AudioConfig({ text_config: {} }, 'config.json')).toThrow(/field audio_config: /);
    // Fields left out take transformers' defaults (E4B's tower), as HF reads the file.
    expect(parseGemma4AudioConfig({ audio_config: {} }, 'config.json')).toEqual(parseGemma4AudioConfig(raw, 'config.json'));
  });
});

describe('the audio encoder as a component of the family', () => {
  // Gemma 4 E4B's audio tower at transformers' Gemma4AudioConfig defaults (E4B's: the recipe records
  // the text model only) and HF's default audio tokens.
  const withAudio = () => ({ ...(loadRecipe('gemma-4-e4b').recipe.config as Record<string, unknown>), audio_config: {} });

  it('plans gemma-4-e4b with the E4B audio tower over 30 s (2999 frames, 750 tokens) for v81: the encoder in a context of its own, within the arch\'s limits', async () => {
    const { recipes } = recipeSandbox('forge-gemma4-audio-plan-');
    writeRecipeVariant(recipes, 'gemma-4-e4b', 'gemma-4-e4b-audio', (r) => { r.config = withAudio(); r.arch.default.audio = { maxSeconds: 30 }; r.modalities = ['text', 'audio']; });
    const before = process.env.FORGE_RECIPES;
    process.env.FORGE_RECIPES = recipes;
    try {
      const plan = await planRecipe('gemma-4-e4b-audio', 'v81');
      const a = getArch('v81');
      expect(plan.encoders).toEqual([{ name: 'audio', weightBytes: expect.any(Number), graphs: ['audio'] }]);
      console.log(`[measured] gemma-4-e4b audio encoder at W8: ${(plan.encoders![0].weightBytes / 1e6).toFixed(1)} MB`);
      expect(plan.encoders![0].weightBytes).toBeGreaterThan(300e6); // measured: 314.2 MB (12 conformer layers of width 1024, ~1 byte a matrix weight)
      expect(plan.encoders![0].weightBytes).toBeLessThanOrEqual(a.contextCeilingBytes);
      expect(plan.contexts).toBeLessThanOrEqual(a.maxContexts);
    } finally {
      if (before === undefined) delete process.env.FORGE_RECIPES;
      else process.env.FORGE_RECIPES = before;
    }
    expect(gemma4AudioFrames(30)).toBe(2999);
    expect(audioShapes({ chunk: 12, contextLeft: 13 }, gemma4AudioFrames(30)).tokens).toBe(750);
  }, 120_000);
});
