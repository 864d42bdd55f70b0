import { describe, it, expect } from 'vitest';
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { loadRecipe, archSettings, listRecipeIds, parseRecipe, checkLocalSource } from '../src/recipe/load.js';
import { getArch, ARCH_IDS } from '../src/arch/table.js';

const base = () => JSON.parse(readFileSync('recipes/tiny-qwen3/recipe.json', 'utf8'));

function expectInvalid(mutate: (r: any) => void, fieldPath: string) {
  const r = base();
  mutate(r);
  expect(() => parseRecipe(r, 'recipes/x/recipe.json')).toThrow(new RegExp(`recipes/x/recipe.json[\\s\\S]*${fieldPath.replace(/\./g, '\\.')}`));
}

describe('recipes', () => {
  it('ships tiny-qwen3 and qwen3-4b, both valid for every arch', () => {
    expect(listRecipeIds()).toEqual(expect.arrayContaining(['tiny-qwen3', 'qwen3-4b']));
    for (const id of listRecipeIds()) {
      const { recipe } = loadRecipe(id);
      for (const a of ARCH_IDS) expect(archSettings(recipe, a).arch.id).toBe(a);
    }
  });

  it('takes a tiny twin of the recipe\'s family only: a family\'s own, or a variant of it (qwen3_odd)', () => {
    const r = base();
    r.source.twin = 'qwen3_odd';
    expect(parseRecipe(r, 'recipes/x/recipe.json').source).toEqual({ kind: 'tiny', twin: 'qwen3_odd' });
    expect(() => parseRecipe({ ...r, family: 'phimoe' }, 'recipes/x/recipe.json')).toThrow(/recipes\/x\/recipe.json[\s\S]*source\.twin: the twin qwen3_odd is of family qwen3, not the recipe's phimoe/);
    expectInvalid((x) => { x.source.twin = 'qwen3_even'; }, 'source.twin');
    expect(loadRecipe('tiny-qwen3-odd').recipe).toMatchObject({ family: 'qwen3', source: { kind: 'tiny', twin: 'qwen3_odd' } });
  });

  it('pins hub sources to a commit and records the model config for offline planning', () => {
    const { recipe } = loadRecipe('qwen3-4b');
    expect(recipe.source).toMatchObject({ kind: 'hub', repo: 'Qwen/Qwen3-4B', revision: '1cfa9a7208912126459214e8b04321603b3df60c' });
    expect(recipe.config).toMatchObject({ num_hidden_layers: 36, hidden_size: 2560, vocab_size: 151936 });
  });

  it('ships every hub recipe pinned to a commit, or unpinned with the reason, its config and where the config came from', () => {
    const hub = listRecipeIds().map((id) => loadRecipe(id).recipe).filter((r) => r.source.kind === 'hub');
    expect(hub.map((r) => r.id)).toEqual(expect.arrayContaining(['qwen3-4b', 'phi-tiny-moe']));
    for (const r of hub) {
      if (r.source.kind !== 'hub') continue;
      expect(r.config, r.id).toBeDefined();
      if (r.source.revision !== null) expect(r.source.revision, r.id).toMatch(/^[0-9a-f]{40}$/);
      else expect([r.source.unpinned, r.configSource], r.id).toEqual([expect.stringMatching(/\S/), expect.objectContaining({ commit: expect.stringMatching(/^[0-9a-f]{40}$/) })]);
    }
  });

  it('takes "revision": null only with the reason in "unpinned", the config and its source; a missing revision stays an error', () => {
    const unpinned = () => ({ ...base(), source: { kind: 'hub', repo: 'org/m', revision: null, unpinned: 'no hub here' }, config: { model_type: 'qwen3' }, configSource: { repo: 'github.com/o/r', path: 'config.json', commit: 'c'.repeat(40), note: 'a copy' } });
    expect(parseRecipe(unpinned(), 'recipes/x/recipe.json').source).toEqual({ kind: 'hub', repo: 'org/m', revision: null, unpinned: 'no hub here' });
    const refused = (edit: (r: any) => void) => { const r = unpinned(); edit(r); return () => parseRecipe(r, 'recipes/x/recipe.json'); };
    expect(refused((r) => delete r.source.unpinned)).toThrow(/^invalid recipe recipes\/x\/recipe\.json: source\.unpinned: a hub source with "revision": null must say why it is not pinned \("unpinned": "<why>"\)$/);
    expect(refused((r) => (r.source.unpinned = ' '))).toThrow(/source\.unpinned: say why the revision is not pinned$/);
    expect(refused((r) => { delete r.source.revision; delete r.source.unpinned; })).toThrow(/^invalid recipe recipes\/x\/recipe\.json: source\.revision: required: a 40-hex-digit commit sha, or null with "unpinned": "<why>" while it cannot be pinned$/);
    expect(refused((r) => delete r.source.revision)).toThrow(/source\.revision: required/);
    expect(refused((r) => (r.source.revision = 'c'.repeat(40)))).toThrow(/source\.unpinned: the revision is pinned: drop "unpinned"/);
    expect(refused((r) => delete r.config)).toThrow(/: config: an unpinned hub recipe must record the model config/);
    expect(refused((r) => delete r.configSource)).toThrow(/: configSource: an unpinned hub recipe must say where its recorded config was copied from/);
    expect(refused((r) => (r.configSource.commit = 'main'))).toThrow(/configSource\.commit/);
  });

  it('names the field path of an invalid value', () => {
    expectInvalid((r) => (r.arch.default.quant = 'w3'), 'arch.default.quant');
    expectInvalid((r) => (r.gates.oracle.w4MinCosine = 1.5), 'gates.oracle.w4MinCosine');
    expectInvalid((r) => delete r.gates.prompts, 'gates.prompts');
    expectInvalid((r) => (r.source = { kind: 'hub', repo: 'Qwen/Qwen3-4B', revision: 'main' }), 'source.revision');
    expectInvalid((r) => (r.family = 'llama'), 'family');
    expectInvalid((r) => (r.gates.oracle.fp32MinCosine = 2), 'gates.oracle.fp32MinCosine');
    expectInvalid((r) => (r.arch.v99 = {}), 'arch.v99');
    expectInvalid((r) => (r.surprise = 1), 'surprise');
  });

  it('refuses the removed w8MinMatch and w8Why, naming the field and what replaced it, in one line', () => {
    const parse = (fields: object) => {
      const r = base();
      Object.assign(r.gates.parity, fields);
      return () => parseRecipe(r, 'recipes/x/recipe.json');
    };
    expect(parse({ w8MinMatch: 0 })).toThrow(/^invalid recipe recipes\/x\/recipe.json: gates\.parity\.w8MinMatch: w8MinMatch was removed \(issue 13\): every variant is gated at minMatch; name near-ties with maxTies and tiesWhy$/);
    expect(parse({ w8Why: 'random twin' })).toThrow(/^invalid recipe recipes\/x\/recipe.json: gates\.parity\.w8Why: w8Why was removed \(issue 13\): a reason for allowed ties goes in tiesWhy \(with maxTies\)$/);
  });

  it('bounds ties at 0 by default, and takes a higher maxTies only with a stated reason', () => {
    expect(parseRecipe(base(), 'recipes/x/recipe.json').gates.parity).toEqual({ tokens: 32, minMatch: 1, maxTies: 0 });
    expectInvalid((r) => (r.gates.parity.maxTies = 2), 'gates.parity.tiesWhy');
    expectInvalid((r) => (r.gates.parity.maxTies = -1), 'gates.parity.maxTies');
    expectInvalid((r) => (r.gates.parity.maxTies = 1.5), 'gates.parity.maxTies');
    expectInvalid((r) => Object.assign(r.gates.parity, { maxTies: 2, tiesWhy: '' }), 'gates.parity.tiesWhy');
    const r = base();
    Object.assign(r.gates.parity, { maxTies: 2, tiesWhy: 'synthetic random weights' });
    expect(parseRecipe(r, 'recipes/x/recipe.json').gates.parity).toMatchObject({ minMatch: 1, maxTies: 2, tiesWhy: 'synthetic random weights' });
  });

  it('ships no recipe with a lowered parity threshold or allowed ties', () => {
    for (const id of listRecipeIds()) {
      const raw = readFileSync(`recipes/${id}/recipe.json`, 'utf8');
      expect(raw, id).not.toMatch(/w8MinMatch|w8Why/);
      expect(loadRecipe(id).recipe.gates.parity, id).toMatchObject({ minMatch: 1, maxTies: 0 });
    }
  });

  it('lets a recipe allow non-finite weights only with a stated reason, on any source kind', () => {
    expectInvalid((r) => { r.source.allowNonFinite = {}; }, 'source.allowNonFinite.reason');
    expectInvalid((r) => { r.source.allowNonFinite = { reason: '  ' }; }, 'source.allowNonFinite.reason');
    expectInvalid((r) => { r.source.allowNonFinite = true; }, 'source.allowNonFinite');
    const r = base();
    r.source = { kind: 'local', path: '/models/x', allowNonFinite: { reason: 'padding rows are -inf by design' } };
    expect(parseRecipe(r, 'recipes/x/recipe.json').source).toEqual(r.source);
    expect(loadRecipe('qwen3-4b').recipe.source.allowNonFinite).toBeUndefined(); // shipped recipes keep the check
  });

  it('validates per-arch settings, naming the arch block', () => {
    expectInvalid((r) => (r.arch.v81 = { maxContext: -5 }), 'arch.v81.maxContext');
    expectInvalid((r) => (r.arch.v79 = { lmHead: { placement: 'middle' } }), 'arch.v79.lmHead');
  });

  it('fills settings a recipe leaves out with forge defaults', () => {
    const r = base();
    r.arch = { default: {} };
    expect(archSettings(parseRecipe(r, 'x'), 'v81').settings).toEqual({
      shards: 'auto', quant: 'w8', lmHead: { placement: 'separate', quant: 'fp16' }, maxContext: 512, prefillLength: 32, handoff: 'f32', overrides: [], rescale: [], equalize: [], image: null, audio: null,
    });
  });

  it('takes an audio budget in seconds and audio prompts naming a made clip, refusing others by their field', () => {
    const r = base();
    r.modalities = ['text', 'audio'];
    r.arch.default.audio = { maxSeconds: 2 };
    r.gates.audioPrompts = [{ text: 'This sound is', audio: { made: 'chirp.wav' } }];
    const recipe = parseRecipe(r, 'x');
    expect(archSettings(recipe, 'v81').settings.audio).toEqual({ maxSeconds: 2 });
    expect(recipe.gates.audioPrompts).toEqual([{ text: 'This sound is', audio: { made: 'chirp.wav' } }]);
    expect(parseRecipe(base(), 'x').gates.audioPrompts).toEqual([]);
    expectInvalid((x) => (x.arch.default.audio = { maxSeconds: 0 }), 'arch.default.audio.maxSeconds');
    expectInvalid((x) => (x.arch.default.audio = { frames: 100 }), 'arch.default.audio');
    expectInvalid((x) => (x.gates.audioPrompts = [{ text: 'x', audio: { made: 'chirp.mp3' } }]), 'gates.audioPrompts\\[0\\].audio.made');
    expectInvalid((x) => (x.gates.audioPrompts = [{ text: 'x', audio: { file: '/tmp/a.wav' } }]), 'gates.audioPrompts\\[0\\].audio');
    expectInvalid((x) => (x.modalities = ['text', 'speech']), 'modalities\\[1\\]');
  });

  it('overlays arch-specific settings on the defaults', () => {
    const r = base();
    r.arch.v79 = { quant: 'fp16' };
    const recipe = parseRecipe(r, 'x');
    expect(archSettings(recipe, 'v79').settings).toMatchObject({ quant: 'fp16', maxContext: 256 }); // tiny-qwen3's default
    expect(archSettings(recipe, 'v81').settings.quant).toBe('w8');
  });

  it('refuses a recipe whose id differs from its folder, or that is not JSON', () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-recipes-'));
    mkdirSync(join(dir, 'mine'));
    writeFileSync(join(dir, 'mine', 'recipe.json'), JSON.stringify(base()));
    expect(() => loadRecipe('mine', dir)).toThrow(/id: 'tiny-qwen3' does not match its folder 'mine'/);
    mkdirSync(join(dir, 'broken'));
    writeFileSync(join(dir, 'broken', 'recipe.json'), '{ not json');
    expect(() => loadRecipe('broken', dir)).toThrow(/broken\/recipe.json: not valid JSON/);
    expect(() => loadRecipe('absent', dir)).toThrow(/no recipe 'absent'.*known recipes: broken, mine/);
  });
});

describe('a local source path', () => {
  const { recipe } = loadRecipe('tiny-qwen3');
  const local = (path: string) => ({ ...recipe, source: { kind: 'local' as const, path } });
  const FILE = 'recipes/x/recipe.json';

  it('is refused in one line naming the recipe file and source.path when it does not exist', () => {
    expect(() => checkLocalSource(local('/nonexistent/m'), FILE)).toThrow(/^recipes\/x\/recipe\.json: source\.path: \/nonexistent\/m does not exist$/);
    expect(() => checkLocalSource(local('rel/m'), FILE)).toThrow(new RegExp(`^recipes/x/recipe\\.json: source\\.path: rel/m \\(${join(process.cwd(), 'rel/m')}\\) does not exist$`));
  });

  it('is resolved against the working directory once, when the recipe is read, so every stage reads the folder that was checked', () => {
    const parsed = parseRecipe({ ...base(), source: { kind: 'local', path: 'rel/m' } }, FILE);
    expect(parsed.source).toMatchObject({ kind: 'local', path: join(process.cwd(), 'rel/m') });
  });

  it('is refused when it names a file, not a folder', () => {
    const file = join(mkdtempSync(join(tmpdir(), 'forge-src-')), 'model.safetensors');
    writeFileSync(file, '');
    expect(() => checkLocalSource(local(file), FILE)).toThrow(`${FILE}: source.path: ${file} is not a directory (a local source names the checkpoint's folder)`);
  });

  it('passes a folder, and ignores sources that are not local', () => {
    expect(() => checkLocalSource(local(tmpdir()), FILE)).not.toThrow();
    expect(() => checkLocalSource(recipe, FILE)).not.toThrow();
  });
});

describe('arch table', () => {
  it('knows v73..v81 with their soc_model ids', () => {
    expect(ARCH_IDS).toEqual(['v73', 'v75', 'v79', 'v81']);
    expect(getArch('v79')).toMatchObject({ soc: 'SM8750', socModel: 69, dspArch: 'v79' });
    expect(getArch('v81')).toMatchObject({ soc: 'SM8850', socModel: 87, dspArch: 'v81', bf16: false });
  });

  it('keeps the v81 ceiling above the proven 1.81 GB shards and below the failing 3.6 GB context', () => {
    const c = getArch('v81').contextCeilingBytes;
    expect(c).toBeGreaterThan(1.81e9);
    expect(c).toBeLessThan(3.6e9);
  });

  it('lists the valid arches when given an unknown one', () => {
    expect(() => getArch('v80')).toThrow("unknown arch 'v80': valid arches are v73, v75, v79, v81");
  });
});
