// Gemma 4 image prompts through a real build up to the oracle gate: the tiny-gemma4 twin with images
// given a soft-token budget (70) and two image prompts of different aspect ratios. The trace runs
// HF's Gemma 4 processor and tower once per image and feeds its soft tokens at the placeholders (the
// pad token's per-layer rows there); the export adds the vision encoder as a context of its own; the
// oracle gate holds the encoder per block and the decoder shards at every step of the image prompts
// to HF. At fp32, so the figures are the graphs' own: the twin's vision tower is untrained (its soft
// tokens lie far from any text the twin saw), and W8 error at those steps says nothing about a real
// model (measured: shard0 0.9960 against 0.9996 on text). The runtime's image path for Gemma 4 is not
// built yet, so nothing here goes past the oracle.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { forge, lastJson } from './helpers/forge-cli.js';
import { recipeSandbox, stageEntry, writeRecipeVariant } from './helpers/recipe-sandbox.js';
import type { TraceMeta } from '../src/gates/trace.js';

let work = '';
let recipes = '';
let record: any;

const IMAGE_PROMPTS = [
  { text: 'This picture shows', image: { made: 'red-circle.png' } },
  { text: 'This picture shows', image: { made: 'blue-square.jpg' } },
];

beforeAll(async () => {
  ({ work, recipes } = recipeSandbox('forge-gemma4-image-'));
  writeRecipeVariant(recipes, 'tiny-gemma4', 'tiny-gemma4-image', (r) => {
    r.modalities = ['text', 'image'];
    Object.assign(r.arch.default, { quant: 'fp32', lmHead: { placement: 'separate', quant: 'fp32' }, image: { maxSoftTokens: 70 } });
    r.gates.prompts = ['The capital of France is'];
    r.gates.imagePrompts = IMAGE_PROMPTS;
    r.gates.parity.tokens = 8;
  });
  const r = await forge(['build', 'tiny-gemma4-image', '--arch', 'v81', '--until', 'oracle', '--json', '--out', join(work, 'out')], { FORGE_RECIPES: recipes });
  record = lastJson(r.stdout);
  if (r.code !== 0) throw new Error(`the build failed: ${r.stderr}`);
}, 1_800_000);

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('tiny-gemma4 with image prompts, up to the oracle gate', () => {
  it('traces each image with its own grid: the aspect ratio kept within the 70-token budget', () => {
    const meta = JSON.parse(readFileSync(join(stageEntry(record, 'trace'), 'trace.json'), 'utf8')) as TraceMeta;
    const images = meta.prompts.filter((p) => p.image).map((p) => p.image!);
    expect(images.map((i) => i.file)).toEqual(['red-circle.png', 'blue-square.jpg']);
    // red-circle.png is 200×150: 21×27 patches (432×336 px) → 63 tokens; blue-square.jpg 96×96: 24×24 → 64.
    expect(images.map((i) => [i.grid, i.tokens])).toEqual([[[1, 21, 27], 63], [[1, 24, 24], 64]]);
    for (const p of meta.prompts.filter((x) => x.image)) {
      expect(p.prompt_tokens.filter((t, k) => k >= p.image!.start && k < p.image!.start + p.image!.tokens).every((t) => t === p.prompt_tokens[p.image!.start])).toBe(true);
    }
  });

  it('gates the vision encoder per block and the shards at every step of the image prompts against HF', () => {
    const graphs = record.gates.oracle.graphs as Record<string, { minCosine: number; ok: boolean }>;
    const vision = Object.entries(graphs).filter(([k]) => k.endsWith('/vision'));
    expect(vision.length).toBe(2); // the float32 reference and the shipped (here also fp32) graphs
    for (const [name, g] of Object.entries(graphs)) expect(g.minCosine, name).toBeGreaterThanOrEqual(0.99999);
    expect(record.gates.oracle.ok).toBe(true);
  });

  it('refuses Gemma 4 image prompts without an image budget, saying what to set', async () => {
    writeRecipeVariant(recipes, 'tiny-gemma4-image', 'tiny-gemma4-image-unset', (r) => { r.arch.default.image = null; });
    const r = await forge(['build', 'tiny-gemma4-image-unset', '--arch', 'v81', '--until', 'trace', '--out', join(work, 'unset')], { FORGE_RECIPES: recipes });
    expect(r.code).not.toBe(0);
    expect(r.stdout + r.stderr).toMatch(/2 image prompt\(s\) but no image setting.*\{"maxSoftTokens"\} for Gemma 4/);
  }, 600_000);
});
