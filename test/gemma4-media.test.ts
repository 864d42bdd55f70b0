// Gemma 4 image and audio prompts through one real build to the runtime's parity gate on the host:
// the tiny-gemma4 twin with images given a soft-token budget (70) and clips a length budget (2 s),
// two image prompts of different aspect ratios and two audio prompts of different clips
// (oracles/twin_audio.py). The trace runs HF's Gemma 4 processor / feature extractor and its towers
// once per image or clip and feeds their soft tokens at the placeholders (the pad token's per-layer
// rows there); the export adds the vision and audio encoders as contexts of their own; the oracle
// gate holds each encoder (per block / layer) and the decoder shards at every step of the media
// prompts to HF; the parity gate runs gemma4_split_generate with --image and --audio (the runtime's
// own front-ends, checked against HF's processor and extractor) and compares every token with HF's.
// At fp32, so the figures are the graphs' own: the twin's vision tower learnt to caption only these
// two pictures (after "This picture shows a") and its audio tower is random (its soft tokens lie far
// from any text the twin saw), so W8 error at those steps says nothing about a real model. The
// W8 image path on v81 and v79 with the simulator is test/gemma4.test.ts's (tiny-gemma4 reads images).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { forge, lastJson } from './helpers/forge-cli.js';
import { recipeSandbox, stageEntry, writeRecipeVariant } from './helpers/recipe-sandbox.js';
import { twinDir } from './helpers/twin.js';
import { Trace, type TraceMeta } from '../src/gates/trace.js';
import { gemma4, parseGemma4Config } from '../src/families/gemma4.js';
import { gemma4AudioFrames } from '../src/families/gemma4-audio.js';

let work = '';
let recipes = '';
let twin = '';
let record: any;

const IMAGE_PROMPTS = [
  { text: 'This picture shows a', image: { made: 'red-circle.png' } },
  { text: 'This picture shows a', image: { made: 'blue-square.jpg' } },
];
const AUDIO_PROMPTS = [
  { text: 'This sound is', audio: { made: 'low-tones.wav' } },
  { text: 'This sound is', audio: { made: 'noise-burst.wav' } },
];

beforeAll(async () => {
  ({ work, recipes } = recipeSandbox('forge-gemma4-media-'));
  twin = await twinDir('gemma4');
  writeRecipeVariant(recipes, 'tiny-gemma4', 'tiny-gemma4-media', (r) => {
    r.modalities = ['text', 'image', 'audio'];
    Object.assign(r.arch.default, { quant: 'fp32', lmHead: { placement: 'separate', quant: 'fp32' }, image: { maxSoftTokens: 70 }, audio: { maxSeconds: 2 } });
    r.gates.prompts = ['The capital of France is'];
    r.gates.imagePrompts = IMAGE_PROMPTS;
    r.gates.audioPrompts = AUDIO_PROMPTS;
    r.gates.parity.tokens = 8;
  });
  const r = await forge(['build', 'tiny-gemma4-media', '--arch', 'v81', '--until', 'parity', '--json', '--out', join(work, 'out')], { FORGE_RECIPES: recipes });
  record = lastJson(r.stdout);
  if (r.code !== 0) throw new Error(`the build failed: ${r.stderr}`);
}, 1_800_000);

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

const traceMeta = () => JSON.parse(readFileSync(join(stageEntry(record, 'trace'), 'trace.json'), 'utf8')) as TraceMeta;

describe('tiny-gemma4 with image and audio prompts, to the runtime on the host', () => {
  it('traces each image with its own grid: the aspect ratio kept within the 70-token budget', () => {
    const images = traceMeta().prompts.filter((p) => p.image).map((p) => p.image!);
    expect(images.map((i) => i.file)).toEqual(['red-circle.png', 'blue-square.jpg']);
    // red-circle.png is 200×150: 21×27 patches (432×336 px) → 63 tokens; blue-square.jpg 96×96: 24×24 → 64.
    expect(images.map((i) => [i.grid, i.tokens])).toEqual([[[1, 21, 27], 63], [[1, 24, 24], 64]]);
    for (const p of traceMeta().prompts.filter((x) => x.image)) {
      expect(p.prompt_tokens.filter((t, k) => k >= p.image!.start && k < p.image!.start + p.image!.tokens).every((t) => t === p.prompt_tokens[p.image!.start])).toBe(true);
    }
  });

  it('gives each image the caption the twin learnt for it: confident at every traced step, parting at the first token', () => {
    // twin.json: the twin's own greedy captions of these two pictures behind the same text (oracles/twin_training.py).
    const learnt = JSON.parse(readFileSync(join(twin, 'twin.json'), 'utf8')).image_prompts as { image: string; tokens: number[] }[];
    const prompts = traceMeta().prompts.filter((p) => p.image);
    for (const p of prompts) {
      const want = learnt.find((l) => l.image === p.image!.file)!.tokens;
      expect(p.generated.length, p.image!.file).toBeGreaterThan(0);
      expect(p.generated, p.image!.file).toEqual(want.slice(0, p.generated.length));
      expect(Math.min(...p.margins), p.image!.file).toBeGreaterThanOrEqual(0.5); // the twin's margin floor (measured ≥ 4.5)
    }
    expect(prompts[0].generated[0]).not.toBe(prompts[1].generated[0]);
  });

  it('traces each clip padded to the 2 s budget (199 frames) with ceil(valid frames / 4) audio tokens between <start_of_audio> and <end_of_audio>', () => {
    const prompts = traceMeta().prompts.filter((p) => p.audio);
    expect(prompts.map((p) => p.audio!.file)).toEqual(['low-tones.wav', 'noise-burst.wav']);
    // 1.2 s = 19,200 samples: frames 0..118 see only the clip (a frame reads 321 samples from 160 before its hop); 0.7 s: 69.
    expect(prompts.map((p) => [p.audio!.frames, p.audio!.valid_frames, p.audio!.tokens])).toEqual([[199, 119, 30], [199, 69, 18]]);
    expect(gemma4AudioFrames(2)).toBe(199);
    const cfg = JSON.parse(readFileSync(join(twin, 'config.json'), 'utf8'));
    for (const p of prompts) {
      const { start, tokens } = p.audio!;
      expect(p.prompt_tokens[0]).toBe(cfg.text_config.bos_token_id);
      expect(p.prompt_tokens.slice(start - 1, start + tokens + 1)).toEqual([cfg.boa_token_id, ...new Array(tokens).fill(cfg.audio_token_id), cfg.eoa_token_index]);
    }
  });

  it('gives the two clips different soft tokens (the encoder sees their different spectra)', async () => {
    const meta = traceMeta();
    const [a, b] = meta.prompts.map((p, i) => ({ p, i })).filter(({ p }) => p.audio).map(({ i }) => i);
    const trace = await Trace.open(stageEntry(record, 'trace'));
    try {
      const [ta, tb] = [await trace.getPrompt(a, 'audio.tokens'), await trace.getPrompt(b, 'audio.tokens')];
      const n = Math.min(ta.length, tb.length);
      let dot = 0, aa = 0, bb = 0;
      for (let k = 0; k < n; k++) { dot += ta[k] * tb[k]; aa += ta[k] * ta[k]; bb += tb[k] * tb[k]; }
      const cos = dot / Math.sqrt(aa * bb);
      console.log(`[measured] tiny-gemma4 audio: the two clips' first ${n / meta.hidden} soft tokens have cosine ${cos.toFixed(5)}`);
      expect(cos).toBeLessThan(0.99);
    } finally {
      await trace.close();
    }
  });

  it('gates the vision and audio encoders and the shards at every step of the media prompts against HF', () => {
    const graphs = record.gates.oracle.graphs as Record<string, { minCosine: number; ok: boolean }>;
    // The float32 reference and the shipped (here also fp32) graphs of each encoder.
    expect(Object.keys(graphs).filter((k) => k.endsWith('/vision')).length).toBe(2);
    const audio = Object.entries(graphs).filter(([k]) => k.endsWith('/audio'));
    expect(audio.length).toBe(2);
    console.log(`[measured] tiny-gemma4 audio encoder against HF: ${audio.map(([k, g]) => `${k} 1 − ${(1 - g.minCosine).toExponential(1)}`).join(', ')}`);
    for (const [name, g] of Object.entries(graphs)) expect(g.minCosine, name).toBeGreaterThanOrEqual(0.99999);
    expect(record.gates.oracle.ok).toBe(true);
  });

  it('runs every image and audio prompt through the runtime as HF does: each token of both variants, the front-ends equal to HF\'s', () => {
    const parity = record.gates.parity;
    expect(parity.ok).toBe(true);
    // 1 text + 2 image + 2 audio prompts × 8 tokens, teacher-forced, in each variant.
    for (const v of ['export', 'quantize']) expect(parity.variants[v], v).toMatchObject({ ok: true, matched: 40, total: 40, mismatches: 0 });
    expect(parity.pixels.map((c: { image: string; ok: boolean }) => [c.image, c.ok])).toEqual([['red-circle.png', true], ['blue-square.jpg', true]]);
    expect(parity.audioFeatures.map((c: { clip: string; frames: number }) => [c.clip, c.frames])).toEqual([['low-tones.wav', 119], ['noise-burst.wav', 69]]);
    for (const c of parity.audioFeatures) {
      console.log(`[measured] tiny-gemma4 ${c.clip}: the runtime's features against HF's extractor, cosine ${c.cosine.toFixed(9)}, max |error| ${c.maxAbs.toExponential(2)}`);
      expect(c.cosine).toBeGreaterThan(0.99999);
    }
    // The text manifest (no encoders) on the text prompt.
    expect(parity.textManifest.variants.quantize).toMatchObject({ ok: true, matched: 8, total: 8 });
    // The runtime matched HF at every step of both clips, and HF's answers to them differ: it heard them.
    const clips = traceMeta().prompts.filter((p) => p.audio).map((p) => p.generated.join(','));
    expect(clips[0]).not.toBe(clips[1]);
  });

  it('refuses Gemma 4 image prompts without an image budget, saying what to set', async () => {
    writeRecipeVariant(recipes, 'tiny-gemma4-media', 'tiny-gemma4-media-unset', (r) => { r.arch.default.image = null; });
    const r = await forge(['build', 'tiny-gemma4-media-unset', '--arch', 'v81', '--until', 'trace', '--out', join(work, 'unset')], { FORGE_RECIPES: recipes });
    expect(r.code).not.toBe(0);
    expect(r.stdout + r.stderr).toMatch(/2 image prompt\(s\) but no image setting.*\{"maxSoftTokens"\} for Gemma 4/);
  }, 600_000);

  it('refuses audio prompts without an audio budget, and a clip longer than the budget, naming the file', async () => {
    writeRecipeVariant(recipes, 'tiny-gemma4-media', 'tiny-gemma4-media-noaudio', (r) => { r.arch.default.audio = null; });
    const unset = await forge(['build', 'tiny-gemma4-media-noaudio', '--arch', 'v81', '--until', 'trace', '--out', join(work, 'noaudio')], { FORGE_RECIPES: recipes });
    expect(unset.code).not.toBe(0);
    expect(unset.stdout + unset.stderr).toMatch(/2 audio prompt\(s\) \(gates\.audioPrompts\) but no audio setting: set the recipe's arch setting "audio" \(\{"maxSeconds": S\}/);
    writeRecipeVariant(recipes, 'tiny-gemma4-media', 'tiny-gemma4-media-short', (r) => { r.arch.default.audio = { maxSeconds: 1 }; });
    const short = await forge(['build', 'tiny-gemma4-media-short', '--arch', 'v81', '--until', 'trace', '--out', join(work, 'short')], { FORGE_RECIPES: recipes });
    expect(short.code).not.toBe(0);
    expect(short.stdout + short.stderr).toMatch(/low-tones\.wav: the clip is 1\.200 s \(19200 samples at 16000 Hz\), longer than the recipe's audio budget of 1 s \(arch setting audio\.maxSeconds\)/);
  }, 600_000);

  it('refuses an audio setting for a checkpoint without an audio tower, or with one forge cannot build, naming the field', () => {
    const layout = { shards: [{ first: 0, last: 7, isLast: true }], lmHeadInside: false, prefillLength: 0, maxContext: 64, audio: { maxSeconds: 2 } };
    const raw = JSON.parse(readFileSync(join(twin, 'config.json'), 'utf8'));
    expect(gemma4.components(parseGemma4Config(raw, 'config.json'), layout).map((c) => c.name)).toContain('audio');
    expect(() => gemma4.components(parseGemma4Config(raw, 'config.json'), { ...layout, audio: { maxSeconds: 31 } })).toThrow(/arch setting audio\.maxSeconds 31: Gemma 4's processor takes clips of at most 30 s/);
    const textOnly = { ...raw };
    delete textOnly.audio_config;
    expect(() => gemma4.components(parseGemma4Config(textOnly, 'config.json'), layout)).toThrow(/arch setting "audio".*no audio tower \(config\.json has no audio_config\)/);
    // The twin's own tower is one HF runs: subsampling channels [128, 4] (128 = mel bins).
    expect(raw.audio_config.subsampling_conv_channels).toEqual([128, 4]);
    // A tower HF cannot run (channels[0] ≠ 128 mel bins, as the twin's once was): text and images still
    // build, audio is refused with the field.
    const narrow = parseGemma4Config({ ...raw, audio_config: { ...raw.audio_config, subsampling_conv_channels: [8, 4] } }, 'config.json');
    expect(gemma4.components(narrow, { ...layout, audio: undefined }).map((c) => c.name)).not.toContain('audio');
    expect(() => gemma4.components(narrow, layout)).toThrow(/audio tower cannot be built: config\.json: field audio_config\.subsampling_conv_channels\.0: must be 128/);
  });
});
