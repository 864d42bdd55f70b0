// phi-tiny-moe: a hub recipe whose revision is not pinned ("revision": null, with the reason). Its
// plan at real size for v79 and v81 through `forge plan --json` (offline, from the recorded config),
// against sizes derived here from the config alone; `forge build` refusing it without --revision,
// and a bad --revision; and, against the loopback hub stand-in, a build that --revision pins: the
// fetched config.json checked against the recorded config, the revision in the run record.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { forge, lastJson } from './helpers/forge-cli.js';
import { getArch } from '../src/arch/table.js';
import { listFilesBelow } from '../src/io/files.js';
import { HubStandin } from './hub/standin.js';

const FILE = resolve('recipes/phi-tiny-moe/recipe.json');
const raw = () => JSON.parse(readFileSync(FILE, 'utf8'));
const statuses = (record: { stages: Array<{ name: string; status: string }> }) => Object.fromEntries(record.stages.map((s) => [s.name, s.status]));

describe('phi-tiny-moe recipe', () => {
  it('is microsoft/Phi-tiny-MoE-instruct, unpinned with the reason, its config recorded with where it came from', () => {
    const r = raw();
    expect(r.source).toMatchObject({ kind: 'hub', repo: 'microsoft/Phi-tiny-MoE-instruct', revision: null, unpinned: expect.stringMatching(/cannot reach the Hugging Face hub/) });
    expect(r.configSource).toMatchObject({ repo: 'github.com/kunalm2345/slm-aplit', path: 'config.json', commit: '43979ed7a3057c8066829696dec6e2fc65fd0d27' });
    expect(r.config).toMatchObject({ model_type: 'phimoe', hidden_size: 4096, num_hidden_layers: 32, num_local_experts: 16, vocab_size: 32064, sliding_window: 2047 });
    expect(r.arch.default).toEqual({ shards: 'auto', quant: 'w8', lmHead: { placement: 'separate', quant: 'fp16' }, maxContext: 2048, prefillLength: 64 });
  });
});

/** W8 as the HTP takes it (MatMulNBits bits=8): int8 codes, one float32 scale per row and block of the in-features (the largest of 256 … 16 dividing them). */
function w8Bytes(rows: number, cols: number): number {
  const block = [256, 128, 64, 32, 16].find((b) => cols % b === 0)!;
  return rows * cols + rows * (cols / block) * 4;
}

describe('forge plan phi-tiny-moe at real size', () => {
  const c = raw().config;
  const H = c.hidden_size, d = c.head_dim, q = c.num_attention_heads * d, kv = c.num_key_value_heads * d;
  // One layer's attention+router graph: q, k, v, o and the router in W8; the attention biases and
  // both LayerNorms (weight and bias) in float32. The experts are host tables, not context weights.
  const layerBytes = w8Bytes(q, H) + 2 * w8Bytes(kv, H) + w8Bytes(H, q) + w8Bytes(c.num_local_experts, H)
    + (q + 2 * kv + H) * 4 + 2 * 2 * H * 4;
  // The lm-head on its own, fp16, with its float32 bias and the final LayerNorm.
  const lmHeadBytes = c.vocab_size * H * 2 + c.vocab_size * 4 + 2 * H * 4;

  it('derives the sizes from the config: 21.46 MB a layer, 686.7 MB for 32, a 262.8 MB lm-head', () => {
    expect(layerBytes).toBe(21_459_968);
    expect(32 * layerBytes).toBe(686_718_976);
    expect(lmHeadBytes).toBe(262_829_312);
  });

  for (const archId of ['v79', 'v81']) {
    it(`${archId}: 3 contexts and 34 graphs within the arch's limits (batched prefill's 33 left out, with why), every context under the ceiling, with those sizes`, async () => {
      const arch = getArch(archId);
      const r = await forge(['plan', 'phi-tiny-moe', '--arch', archId, '--json'], { HF_HUB_OFFLINE: '1' });
      expect(r.stderr).toBe('');
      expect(r.code).toBe(0);
      const plan = lastJson(r.stdout);
      expect(plan).toMatchObject({ arch: archId, socModel: arch.socModel, quant: 'w8', layers: 32, contexts: 3, graphs: 34 });
      expect(plan.contexts).toBeLessThanOrEqual(arch.maxContexts);
      expect(plan.graphs).toBeLessThanOrEqual(arch.maxGraphsPerProcess);
      // 32 + 1 + 1 decode graphs and 32 + 1 batched-prefill ones: 67, over v79's 64 and v81's 34.
      expect(plan.dropped.map((d: { graph: string }) => d.graph)).toEqual([...Array.from({ length: 32 }, (_, l) => `shard0.layer${l}.prefill`), 'experts.prefill']);
      for (const d of plan.dropped) expect(d.why).toBe(`67 graphs are over the ${archId} limit of ${arch.maxGraphsPerProcess} graphs per process (arch table: cdsp-heap); optional, batched prefill: without it the runtime decodes over the prompt one token at a time`);
      // The contexts: every layer's attention+router graph in one shard, the experts graph (its rows
      // are graph inputs: no weights of its own), the lm-head.
      expect(plan.shards).toEqual([{ index: 0, first: 0, last: 31, weightBytes: 32 * layerBytes, graphs: Array.from({ length: 32 }, (_, l) => `layer${l}`) }]);
      expect(plan.lmHead).toEqual({ placement: 'separate', quant: 'fp16', bytes: lmHeadBytes, tied: false });
      expect(plan.totalContextBytes).toBe(32 * layerBytes + lmHeadBytes);
      expect(plan.totalContextBytes).toBe(949_548_288);
      for (const bytes of [plan.shards[0].weightBytes, plan.lmHead.bytes]) expect(bytes).toBeLessThanOrEqual(arch.contextCeilingBytes);
      // Host tables: the f16 embedding; int8 rows of 32 layers × 16 experts, gate/up [2·448, 4096]
      // and down [4096, 448], one float32 scale per row.
      const E = c.num_local_experts, L = c.num_hidden_layers, F = c.intermediate_size;
      expect(plan.hostTables).toEqual([
        { name: 'embedding', dtype: 'f16', bytes: c.vocab_size * H * 2 },
        { name: 'experts.gate_up', dtype: 'i8', bytes: L * E * 2 * F * H }, { name: 'experts.gate_up.scale', dtype: 'f32', bytes: L * E * 2 * F * 4 },
        { name: 'experts.down', dtype: 'i8', bytes: L * E * H * F }, { name: 'experts.down.scale', dtype: 'f32', bytes: L * E * H * 4 },
      ]);
    });
  }
});

describe('forge build phi-tiny-moe', () => {
  const out = () => join(mkdtempSync(join(tmpdir(), 'forge-unpinned-')), 'out');
  const lastLine = (stderr: string) => stderr.trim().split('\n').pop();

  it('refuses without --revision, naming the recipe file and source.revision and saying how to proceed, before doing anything', async () => {
    const dir = out();
    const r = await forge(['build', 'phi-tiny-moe', '--arch', 'v81', '--out', dir]);
    expect(r.code).toBe(1);
    expect(lastLine(r.stderr)).toBe(`forge: ${FILE}: source.revision: not pinned (${raw().source.unpinned}); forge build needs the commit of microsoft/Phi-tiny-MoE-instruct to fetch: pass --revision <40-hex commit sha> (its config.json must match the recipe's recorded config), or pin source.revision in the recipe (forge plan needs neither)`);
    expect(r.stderr).not.toMatch(/\n\s+at |\[forge\]/); // no stack trace, and nothing started (no setup, no stage)
    expect(existsSync(dir)).toBe(false);
  });

  it('refuses a --revision that is not a 40-hex commit sha, by the recipe schema\'s rule', async () => {
    for (const bad of ['main', 'v1.0', 'A'.repeat(40), 'a'.repeat(39), `${'a'.repeat(40)}0`]) {
      const dir = out();
      const r = await forge(['build', 'phi-tiny-moe', '--arch', 'v81', '--revision', bad, '--out', dir]);
      expect(r.code, bad).toBe(1);
      expect(lastLine(r.stderr), bad).toBe(`forge: --revision '${bad}': a pinned revision is a 40-hex-digit commit sha (not a branch or tag)`);
      expect(existsSync(dir)).toBe(false);
    }
  });

  it('refuses a --revision other than the sha a pinned recipe names, and on a source that is not the hub', async () => {
    const other = 'b'.repeat(40);
    const pinned = await forge(['build', 'qwen3-4b', '--arch', 'v81', '--revision', other, '--out', out()]);
    expect(pinned.code).toBe(1);
    expect(lastLine(pinned.stderr)).toBe(`forge: ${resolve('recipes/qwen3-4b/recipe.json')}: source.revision pins 1cfa9a7208912126459214e8b04321603b3df60c; --revision ${other} differs (to build another commit, change source.revision and the recorded config to that commit's)`);
    const tiny = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--revision', other, '--out', out()]);
    expect(tiny.code).toBe(1);
    expect(lastLine(tiny.stderr)).toBe(`forge: --revision pins a hub revision, but ${resolve('recipes/tiny-qwen3/recipe.json')} has source.kind 'tiny'`);
  });
});

describe('an unpinned hub recipe built with --revision (hub stand-in)', () => {
  const REPO = 'org/phimoe-twin';
  let hub: HubStandin;
  let work: string;
  let rev: string;
  let twinConfig: Record<string, unknown>;
  let env: Record<string, string>;

  /** recipes/<id> in the test's own recipes folder: phi-tiny-moe's fields on the twin's checkpoint, served by the stand-in. */
  function writeRecipe(id: string, source: object, config = twinConfig) {
    const tiny = JSON.parse(readFileSync('recipes/tiny-phimoe/recipe.json', 'utf8'));
    const recorded = Object.fromEntries(Object.keys(raw().config).map((k) => [k, config[k]]));
    mkdirSync(join(work, 'recipes', id), { recursive: true });
    writeFileSync(join(work, 'recipes', id, 'recipe.json'), JSON.stringify({ ...raw(), id, source: { kind: 'hub', repo: REPO, ...source }, config: recorded, arch: tiny.arch }));
  }
  const build = async (id: string, extra: string[] = []) => {
    const r = await forge(['build', id, '--arch', 'v81', '--until', 'plan', '--json', '--out', join(work, 'out', id), ...extra], env);
    return { code: r.code, rec: lastJson(r.stdout) };
  };

  beforeAll(async () => {
    work = mkdtempSync(join(tmpdir(), 'forge-hub-unpinned-'));
    const twin = await forge(['build', 'tiny-phimoe', '--arch', 'v81', '--until', 'fetch', '--json', '--out', join(work, 'twin')]);
    expect(twin.code).toBe(0);
    const modelDir = join(process.env.FORGE_CACHE!, 'fetch', lastJson(twin.stdout).stages[0].key, 'model');
    hub = await HubStandin.start();
    rev = hub.seed(REPO, Object.fromEntries(listFilesBelow(modelDir).map((f) => [f, readFileSync(join(modelDir, f))])));
    twinConfig = JSON.parse(readFileSync(join(modelDir, 'config.json'), 'utf8'));
    cpSync('recipes', join(work, 'recipes'), { recursive: true });
    env = { FORGE_RECIPES: join(work, 'recipes'), HF_ENDPOINT: hub.url, HF_HOME: join(work, 'hf'), HF_HUB_CACHE: join(work, 'hf', 'hub'), HF_HUB_OFFLINE: '' };
  }, 600_000); // the trained twin is made first (~15 s here)
  afterAll(async () => {
    await hub?.close();
    expect(hub?.unexpected ?? []).toEqual([]);
  });

  it('fetches the given commit, checks its config.json against the recorded config, and records the revision and where it came from', async () => {
    writeRecipe('hub-unpinned', { revision: null, unpinned: 'the stand-in hub has no pinned commit yet' });
    const { code, rec } = await build('hub-unpinned', ['--revision', rev]);
    expect(rec.error).toBeUndefined();
    expect(code).toBe(0);
    expect(rec).toMatchObject({ status: 'partial', hubRevision: { repo: REPO, revision: rev, from: '--revision', unpinned: 'the stand-in hub has no pinned commit yet' } });
    expect(statuses(rec)).toEqual({ fetch: 'ran', plan: 'ran' });
    expect(JSON.parse(readFileSync(join(work, 'out', 'hub-unpinned', 'build', 'run.json'), 'utf8')).hubRevision.revision).toBe(rev);
    // The same commit pinned in a recipe: the same fetch (keyed on repo and revision, not on how it was given).
    writeRecipe('hub-pinned', { revision: rev });
    const pinned = await build('hub-pinned');
    expect(pinned.rec.hubRevision).toEqual({ repo: REPO, revision: rev, from: 'recipe' });
    expect(statuses(pinned.rec)).toEqual({ fetch: 'cached', plan: 'cached' });
  });

  it('refuses a commit whose config.json differs from the recorded config, naming the field', async () => {
    writeRecipe('hub-other', { revision: null, unpinned: 'stand-in' }, { ...twinConfig, hidden_size: 4096 });
    const { code, rec } = await build('hub-other', ['--revision', rev]);
    expect(code).toBe(1);
    expect(rec.error).toMatch(new RegExp(`config\\.json: field hidden_size is ${twinConfig.hidden_size}, but the recipe expects 4096`));
    expect(statuses(rec).plan).toBe('failed');
  });
});
