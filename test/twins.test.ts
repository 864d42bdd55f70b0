import { describe, it, expect } from 'vitest';
import { mkdtempSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { createHash } from 'node:crypto';
import { runPython } from '../src/toolchain/python.js';
import { TWIN_FAMILY, TWIN_IDS } from '../src/recipe/schema.js';
import { listRecipeIds, loadRecipe } from '../src/recipe/load.js';
import { openSafetensors } from '../src/io/safetensors.js';
import { twinDir } from './helpers/twin.js';
import { placeTwin, twinStoreDir } from '../src/hub/twin-store.js';

const FACTORY = resolve('oracles/make_twin.py');
const make = async (family: string, out: string, extra: string[] = []) => JSON.parse((await runPython(FACTORY, ['--family', family, '--out', out, ...extra])).stdout.trim().split('\n').pop()!);
// Training a twin takes ~30 s of CPU on two idle cores; several times that on a shared machine.
const MAKE_TIMEOUT = 1_200_000;

interface Margins { count: number; min: number; p5: number; p50: number; max: number; 'below_0.01': number; 'below_0.1': number }
interface TwinJson {
  family: string;
  margins: Margins;
  margin_floor: number;
  new_tokens: number;
  prompts: { prompt: string; prompt_tokens: number; min_margin: number; memorised: number }[];
  training: { steps: number; tokens: number; first_loss: number; final_loss: number };
  features: { min_1d_std: number };
  router_gaps?: Record<'top1_top2' | 'top2_top3', Margins>;
  router_gap_floor?: number;
  /** The vision twins' test image prompts (gemma4: new_tokens and soft_tokens per image). */
  image_prompts?: { image: string; prompt: string; continuation: string; tokens: number[]; min_margin: number; memorised: number; new_tokens?: number; soft_tokens?: number }[];
  image_margins?: Margins;
}

const sha256 = (file: string) => createHash('sha256').update(readFileSync(file)).digest('hex');
const digests = (dir: string) => Object.fromEntries(readdirSync(dir).sort().map((n) => [n, sha256(join(dir, n))]));

describe('tiny twins', () => {
  const dir = mkdtempSync(join(tmpdir(), 'forge-twins-'));
  // Each twin as the builds have it: placed by the fetch stage of a recipe's build from the machine's
  // twin store (made there once per version of make_twin.py and its modules).
  const made = new Map<string, { dir: string }>();
  const twinJson = (family: string): TwinJson => JSON.parse(readFileSync(join(made.get(family)!.dir, 'twin.json'), 'utf8'));

  it.each(TWIN_IDS)('makes a %s twin that reloads and generates, with a tokenizer and a twin.json', async (family) => {
    const out = await twinDir(family);
    made.set(family, { dir: out });
    expect(readdirSync(out)).toEqual(expect.arrayContaining(['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json', 'twin.json']));
    expect(twinJson(family).family).toBe(family);
    const config = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'));
    expect(config.model_type).toBe(TWIN_FAMILY[family]); // a variant twin is a checkpoint of its family
    const vocab = config.vocab_size ?? config.text_config?.vocab_size;
    const tok = JSON.parse(readFileSync(join(out, 'tokenizer.json'), 'utf8'));
    expect(Object.keys(tok.model.vocab).length + tok.added_tokens.filter((t: any) => !(t.content in tok.model.vocab)).length).toBe(vocab);
    const st = await openSafetensors(join(out, 'model.safetensors'));
    const params = [...st.tensors.values()].reduce((n, t) => n + t.shape.reduce((a, b) => a * b, 1), 0);
    await st.close();
    expect(params).toBeLessThan(2_000_000);
  }, MAKE_TIMEOUT);

  it.each(TWIN_IDS)('trains the %s twin until its greedy continuations are confident and memorised', (family) => {
    const t = twinJson(family);
    // A random twin's loss is ~ln(vocab) ≈ 7.2; trained, measured 0.03–0.06, and 0.28 for gemma4, whose
    // final-logit softcap (10) flattens the last steps' gradients: at least 10× down on every family.
    expect(t.training.final_loss).toBeLessThan(t.training.first_loss / 10);
    // Every generated step of every prompt is counted, and none comes near a tie.
    expect(t.margins.count).toBe(t.prompts.length * t.new_tokens);
    expect(t.margins.min).toBeGreaterThanOrEqual(t.margin_floor);
    expect(t.margin_floor).toBeGreaterThanOrEqual(0.5);
    expect(t.margins['below_0.1']).toBe(0);
    for (const p of t.prompts) expect(p.memorised, p.prompt.slice(0, 40)).toBe(t.new_tokens);
    // Training kept the features the twin switches on: no norm weight or bias collapsed to a constant.
    expect(t.features.min_1d_std).toBeGreaterThan(0.01);
  });

  it('covers every tiny recipe prompt, including a long one and non-ASCII text, with its twin\'s continuation', () => {
    const recipes = listRecipeIds().map((id) => loadRecipe(id).recipe).filter((r) => r.source.kind === 'tiny');
    expect(recipes.length).toBeGreaterThan(0);
    for (const r of recipes) {
      const t = twinJson(r.source.kind === 'tiny' ? r.source.twin : '');
      const covered = new Map(t.prompts.map((p) => [p.prompt, p]));
      for (const prompt of r.gates.prompts) expect(covered.has(prompt), `${r.id}: ${prompt.slice(0, 40)}`).toBe(true);
      expect(Math.max(...r.gates.prompts.map((p) => covered.get(p)!.prompt_tokens)), r.id).toBeGreaterThanOrEqual(100);
      expect(r.gates.prompts.some((p) => /[^\x00-\x7f]/.test(p)), r.id).toBe(true);
    }
  });

  it('trains the gemma4 twin to caption its two test images confidently, parting at the first generated token; its audio tower is one HF runs', () => {
    const t = twinJson('gemma4');
    const images = t.image_prompts!;
    // As trace.py makes them: Gemma 4's processor within 70 soft tokens, aspect ratio kept (21×27 and 24×24 patches, pooled 3×3).
    expect(images.map((r) => [r.image, r.prompt, r.soft_tokens])).toEqual([['red-circle.png', 'This picture shows a', 63], ['blue-square.jpg', 'This picture shows a', 64]]);
    // Every token of each whole caption is generated, memorised and confident (measured min 4.54).
    expect(t.image_margins!.count).toBe(images.reduce((n, r) => n + r.new_tokens!, 0));
    expect(t.image_margins!.min).toBeGreaterThanOrEqual(t.margin_floor);
    for (const r of images) expect(r.memorised, r.image).toBe(r.new_tokens);
    expect(images[0].tokens[0]).not.toBe(images[1].tokens[0]);
    expect(images.map((r) => r.continuation.split('.')[0])).toEqual([' red circle on a white background', ' blue square on a white background']);
    const config = JSON.parse(readFileSync(join(made.get('gemma4')!.dir, 'config.json'), 'utf8'));
    expect(config.audio_config.subsampling_conv_channels).toEqual([128, 4]); // 128 = mel bins, as HF needs
  });

  it('keeps the MoE twin\'s top-2 routing off a knife edge on the traced prompts', () => {
    const t = twinJson('phimoe');
    const gaps = t.router_gaps!;
    expect(gaps.top2_top3.count).toBeGreaterThan(0);
    // Which expert is first (top-1 vs top-2) and which is second (top-2 vs top-3), at every token and layer.
    expect(t.router_gap_floor).toBeGreaterThanOrEqual(0.1);
    for (const g of [gaps.top1_top2, gaps.top2_top3]) {
      expect(g.min).toBeGreaterThanOrEqual(t.router_gap_floor!);
      expect(g['below_0.1']).toBe(0);
    }
  });

  it('keeps each twin once per machine, in FORGE_HOME/twins: a build\'s fetch copies it from there instead of training it again', async () => {
    const stored = twinStoreDir('qwen3');
    expect(stored).toMatch(/\/twins\/qwen3-[0-9a-f]{16}$/);
    expect(digests(stored)).toEqual(digests(made.get('qwen3')!.dir));
    const said: string[] = [];
    const placed = await placeTwin('qwen3', join(dir, 'placed'), (m) => said.push(m));
    expect(placed).toEqual({ made: false, peakRssBytes: null });
    expect(said).toEqual([expect.stringContaining(`the tiny qwen3 twin from ${stored}`)]);
    expect(digests(join(dir, 'placed'))).toEqual(digests(stored));
    await expect(placeTwin('qwen3', join(dir, 'placed'), () => {})).rejects.toThrow(/EEXIST/); // never over a folder
  });

  // What keeps the twin store honest: a twin made now equals the one the builds were given.
  it.each(['qwen3'])('makes the %s twin byte-identical a second time, twin.json included', async (family) => {
    const again = await make(family, join(dir, `again-${family}`));
    expect(again.files).toEqual(digests(made.get(family)!.dir));
    expect(again.margins).toEqual(twinJson(family).margins); // what it prints is what it records
  }, MAKE_TIMEOUT);

  it('refuses an untrained (random) twin as not confident, naming its smallest margin, and writes nothing', async () => {
    const out = join(dir, 'untrained');
    await expect(make('qwen3', out, ['--steps', '0'])).rejects.toThrow(/not confident: smallest top-1\/top-2 margin [0-9.e-]+ .* under the floor/);
    expect(readdirSync(dir).filter((n) => n.startsWith('.') || n.includes('untrained'))).toEqual([]);
  }, MAKE_TIMEOUT);

  it('refuses to write into a non-empty directory and leaves nothing half-written', async () => {
    const taken = join(dir, 'taken');
    mkdirSync(taken);
    writeFileSync(join(taken, 'keep.txt'), 'mine');
    await expect(make('qwen3', taken)).rejects.toThrow(/exists and is not an empty directory/);
    expect(readdirSync(taken)).toEqual(['keep.txt']);
    expect(readdirSync(dir).filter((n) => n.startsWith('.') || n.includes('tmp'))).toEqual([]);
  });
});
