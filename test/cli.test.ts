import { describe, it, expect, beforeAll } from 'vitest';
import { execFileSync } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { FAKE_QAIRT_VERSION, makeFakeQairt } from './helpers/fake-qairt.js';
import { forge, lastJson } from './helpers/forge-cli.js';
import { recipeSandbox } from './helpers/recipe-sandbox.js';

const statuses = (record: { stages: Array<{ name: string; status: string }> }) => Object.fromEntries(record.stages.map((s) => [s.name, s.status]));

let work: string;
let recipes: string;
beforeAll(() => void ({ work, recipes } = recipeSandbox('forge-cli-')));

/** A private copy of the recipes: a test that edits one cannot change what another test builds. */
function ownRecipes(name: string): string {
  const dir = join(work, name);
  cpSync('recipes', dir, { recursive: true });
  return dir;
}

function editRecipe(id: string, edit: (r: any) => void, dir = recipes) {
  const file = join(dir, id, 'recipe.json');
  const r = JSON.parse(readFileSync(file, 'utf8'));
  edit(r);
  writeFileSync(file, JSON.stringify(r, null, 2));
}

describe('forge build', () => {
  it('builds tiny-qwen3, prints the run record last, and reuses every stage the second time', async () => {
    const out = join(work, 'out-a');
    const first = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', out], { FORGE_RECIPES: recipes });
    expect(first.stderr).not.toMatch(/\n\s+at /);
    expect(first.code).toBe(0);
    const rec = lastJson(first.stdout);
    expect(rec).toMatchObject({ recipe: 'tiny-qwen3', arch: 'v81', ok: true, bundle: out });
    expect(rec.stages.map((s: any) => s.name)).toEqual(['fetch', 'plan', 'trace', 'export', 'quantize', 'oracle', 'compile', 'native', 'parity', 'emulation', 'bundle']);
    for (const g of ['oracle', 'parity', 'emulation']) expect(rec.gates[g].ok, g).toBe(true);
    // Each stage's figures are recorded once: a gate's under gates, the rest under summaries.
    expect(Object.keys(rec.summaries).sort()).toEqual(expect.arrayContaining(['compile', 'plan']));
    for (const g of ['oracle', 'parity', 'emulation']) expect(rec.summaries, g).not.toHaveProperty(g);
    expect(readFileSync(join(out, 'manifest.json'), 'utf8')).toContain('"hostOp": "decoder_generate"');
    for (const s of rec.stages) {
      expect(['ran', 'cached']).toContain(s.status);
      expect(s.seconds).toBeGreaterThanOrEqual(0);
    }
    expect(rec.tools).toMatchObject({ torch: '2.15.0', transformers: '5.23.0', 'onnxruntime-qnn': '2.7.0' });
    expect(JSON.parse(readFileSync(join(out, 'build/run.json'), 'utf8'))).toEqual(rec);
    const plan = JSON.parse(readFileSync(join(out, 'build', 'plan.json'), 'utf8'));
    expect(plan.shards[0]).toMatchObject({ first: 0 });

    const second = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', out], { FORGE_RECIPES: recipes });
    const rec2 = lastJson(second.stdout);
    expect(Object.values(statuses(rec2)).every((s) => s === 'cached')).toBe(true);
    expect(rec2.stages.every((s: any) => s.peakRssBytes === null)).toBe(true);
    console.log(`[measured] second build of tiny-qwen3: ${rec2.seconds.toFixed(2)} s inside forge`);
  }, 600_000); // the first build of a cold cache compiles the native runtime (~150 s here) and runs every gate

  it('re-runs only the stages downstream of a changed recipe field', async () => {
    const out = join(work, 'out-b');
    const own = ownRecipes('recipes-b');
    // The cache is what this test is about: the simulator's gate (a minute a build) stays out of it.
    editRecipe('tiny-qwen3', (r) => (r.gates.emulation = false), own);
    await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', out], { FORGE_RECIPES: own });
    const again = async () => lastJson((await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', out], { FORGE_RECIPES: own })).stdout);
    editRecipe('tiny-qwen3', (r) => (r.gates.parity.tokens = 24), own);
    // A shorter generation: a new trace and the gates that read it; the graphs and binaries are reused.
    expect(statuses(await again())).toEqual({
      fetch: 'cached', plan: 'cached', trace: 'ran', export: 'cached', quantize: 'cached', oracle: 'ran',
      compile: 'cached', native: 'cached', parity: 'ran', bundle: 'ran',
    });
    // The prefill length: new graphs and binaries; the trace is reused.
    editRecipe('tiny-qwen3', (r) => (r.arch.default.prefillLength = 4), own);
    expect(statuses(await again())).toMatchObject({
      fetch: 'cached', plan: 'ran', trace: 'cached', export: 'ran', quantize: 'ran', oracle: 'ran', compile: 'ran', native: 'cached', bundle: 'ran',
    });
    // Card text only: just the bundle.
    editRecipe('tiny-qwen3', (r) => (r.card.title = 'renamed'), own);
    const r3 = statuses(await again());
    expect(Object.entries(r3).filter(([, s]) => s !== 'cached').map(([n]) => n)).toEqual(['bundle']);
  }, 300_000); // four builds without the simulator's gate: the first reuses the test above's stages

  it('refuses a checkpoint whose config differs from the one the recipe recorded, leaving no plan behind', async () => {
    const twinOut = join(work, 'out-twin');
    const twin = lastJson((await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--until', 'fetch', '--json', '--out', twinOut])).stdout);
    // This build's own fetch entry: the shared test cache also holds other twins' checkpoints.
    const entry = twin.stages.find((s: { name: string }) => s.name === 'fetch').key;
    const modelDir = join(process.env.FORGE_CACHE!, 'fetch', entry, 'model');
    const own = ownRecipes('recipes-c');
    editRecipe('tiny-qwen3', (r) => {
      r.source = { kind: 'local', path: modelDir };
      r.config = { model_type: 'qwen3', hidden_size: 4096 };
    }, own);
    const out = join(work, 'out-c');
    const run = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', out], { FORGE_RECIPES: own });
    expect(run.code).toBe(1);
    const rec = lastJson(run.stdout);
    expect(rec.ok).toBe(false);
    expect(rec.error).toMatch(/config\.json: field hidden_size is 64, but the recipe expects 4096/);
    expect(statuses(rec)).toMatchObject({ fetch: 'ran', plan: 'failed', export: 'skipped', quantize: 'skipped', oracle: 'skipped' });
    expect(readdirSync(out)).toEqual(['build']); // nothing but the run record and its logs
    expect(JSON.parse(readFileSync(join(out, 'build/run.json'), 'utf8')).ok).toBe(false);
  });

  it('keys a local checkpoint by content: a same-size edit with its mtime restored re-plans, a touch alone does not', async () => {
    const twin = lastJson((await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--until', 'fetch', '--json', '--out', join(work, 'out-twin2')])).stdout);
    const modelDir = join(work, 'local-model');
    cpSync(join(process.env.FORGE_CACHE!, 'fetch', twin.stages.find((s: { name: string }) => s.name === 'fetch').key, 'model'), modelDir, { recursive: true });
    const recipe = JSON.parse(readFileSync('recipes/tiny-qwen3/recipe.json', 'utf8'));
    mkdirSync(join(recipes, 'local-qwen3'));
    writeFileSync(join(recipes, 'local-qwen3', 'recipe.json'), JSON.stringify({ ...recipe, id: 'local-qwen3', source: { kind: 'local', path: modelDir } }));
    const planRun = async () => forge(['build', 'local-qwen3', '--arch', 'v81', '--until', 'plan', '--json', '--out', join(work, 'out-local')], { FORGE_RECIPES: recipes });
    const plan = async () => statuses(lastJson((await planRun()).stdout));
    // The first build hashes every file, with progress, and records what that took apart from the stages.
    const first = await planRun();
    const rec = lastJson(first.stdout);
    expect(statuses(rec)).toEqual({ fetch: 'ran', plan: 'ran' });
    const size = readdirSync(modelDir).reduce((a, f) => a + statSync(join(modelDir, f)).size, 0);
    expect(rec.checkpointDigest).toMatchObject({ dir: modelDir, files: readdirSync(modelDir).length, hashedFiles: readdirSync(modelDir).length, hashedBytes: size });
    expect(first.stderr).toContain('[forge] digest: 100%');
    expect(readFileSync(join(work, 'out-local', 'build', 'report.md'), 'utf8')).toContain(`the local checkpoint's content digest read ${rec.checkpointDigest.files} of ${rec.checkpointDigest.files} files`);
    expect(await plan()).toEqual({ fetch: 'cached', plan: 'cached' });
    utimesSync(join(modelDir, 'config.json'), new Date(), new Date(Date.now() + 5000)); // same bytes, a later mtime
    expect(await plan()).toEqual({ fetch: 'cached', plan: 'cached' });
    // One weight byte changed in place (its sign bit: still finite), size kept, mtime put back.
    const weights = join(modelDir, 'model.safetensors');
    const ref = join(work, 'weights.ref');
    writeFileSync(ref, '');
    execFileSync('touch', ['-r', weights, ref]);
    const before = statSync(weights, { bigint: true });
    const bytes = readFileSync(weights);
    bytes[bytes.length - 1] ^= 0x80;
    writeFileSync(weights, bytes);
    execFileSync('touch', ['-r', ref, weights]);
    const after = statSync(weights, { bigint: true });
    expect([after.size, after.mtimeNs]).toEqual([before.size, before.mtimeNs]);
    expect(await plan()).toEqual({ fetch: 'ran', plan: 'ran' });
  });

  it('names the recipe file and source.path when a local source does not exist', async () => {
    const recipe = JSON.parse(readFileSync('recipes/tiny-qwen3/recipe.json', 'utf8'));
    mkdirSync(join(recipes, 'missing-local'));
    const file = join(recipes, 'missing-local', 'recipe.json');
    writeFileSync(file, JSON.stringify({ ...recipe, id: 'missing-local', source: { kind: 'local', path: '/nonexistent/forge-model' } }));
    const run = await forge(['build', 'missing-local', '--arch', 'v81', '--out', join(work, 'out-missing')], { FORGE_RECIPES: recipes });
    expect(run.code).toBe(1);
    expect(run.stderr.trim().split('\n').pop()).toBe(`forge: ${file}: source.path: /nonexistent/forge-model does not exist`);
    expect(run.stderr).not.toMatch(/ENOENT|\n\s+at /);
  });

  it('gives one clear line, without a stack trace, for an unknown arch or an invalid recipe', async () => {
    const bad = await forge(['build', 'tiny-qwen3', '--arch', 'v80']);
    expect(bad.code).toBe(1);
    expect(bad.stderr.trim()).toBe("forge: unknown arch 'v80': valid arches are v73, v75, v79, v81");
    editRecipe('qwen3-4b', (r) => (r.arch.default.quant = 'int3'));
    const invalid = await forge(['plan', 'qwen3-4b', '--arch', 'v81'], { FORGE_RECIPES: recipes });
    expect(invalid.code).toBe(1);
    expect(invalid.stderr).toMatch(/invalid recipe .*qwen3-4b\/recipe.json: arch.default.quant:/);
    expect(invalid.stderr).not.toMatch(/\n\s+at /);
  });
});

describe('forge plan, list, doctor', () => {
  it('plans qwen3-4b for v81 offline from the recorded config', async () => {
    const r = await forge(['plan', 'qwen3-4b', '--arch', 'v81', '--json'], { HF_HUB_OFFLINE: '1' });
    expect(r.code).toBe(0);
    const plan = lastJson(r.stdout);
    expect(plan.shards).toHaveLength(2);
    for (const s of plan.shards) expect(s.weightBytes).toBeLessThanOrEqual(plan.ceilingBytes);
  });

  it('plans a tiny twin by building up to the plan stage', async () => {
    const r = await forge(['plan', 'tiny-qwen3', '--arch', 'v79', '--json']);
    expect(r.code).toBe(0);
    expect(lastJson(r.stdout)).toMatchObject({ arch: 'v79', socModel: 69, layers: 4 });
  });

  it('lists recipes as JSON', async () => {
    const r = await forge(['list', '--json']);
    expect(lastJson(r.stdout).map((x: any) => x.id)).toEqual(expect.arrayContaining(['qwen3-4b', 'tiny-qwen3']));
  });

  it('lists the valid recipes beside an invalid one, names the invalid one and its error, and fails', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-list-'));
    cpSync('recipes/tiny-qwen3', join(dir, 'tiny-qwen3'), { recursive: true });
    mkdirSync(join(dir, 'broken'));
    writeFileSync(join(dir, 'broken', 'recipe.json'), JSON.stringify({ id: 'broken', family: 'qwen4' }));
    const r = await forge(['list', '--json'], { FORGE_RECIPES: dir });
    expect(r.code).toBe(1);
    expect(lastJson(r.stdout).map((x: any) => x.id)).toEqual(['tiny-qwen3']);
    expect(r.stderr).toMatch(/^forge: invalid recipe broken: .*broken\/recipe\.json.*family/m);
  });

  it('reports node, the python env and the toolchain versions', async () => {
    const r = await forge(['doctor', '--json']);
    expect(r.code).toBe(0);
    const d = lastJson(r.stdout);
    expect(d.node.version).toBe(process.versions.node);
    expect(d.python.ready).toBe(true);
    expect(d.python.packages).toMatchObject({ torch: '2.15.0', transformers: '5.23.0', onnxruntime: '1.29.0', 'onnxruntime-qnn': '2.7.0' });
    expect(d.toolchains['qnn-aot'].usable).toBe(true);
    expect(d.toolchains['ort-cpu'].usable).toBe(true);
    expect(d.toolchains['qairt-cli']).toMatchObject({ usable: false, detail: expect.stringMatching(/QAIRT_SDK_ROOT is not set.*onnxruntime-qnn/) });
  });

  it('reports the QAIRT path usable, with its version, when QAIRT_SDK_ROOT names a complete SDK, and what is missing when not', async () => {
    const sdk = await makeFakeQairt();
    const ok = lastJson((await forge(['doctor', '--json'], { QAIRT_SDK_ROOT: sdk.root })).stdout);
    expect(ok.toolchains['qairt-cli']).toMatchObject({ usable: true, detail: expect.stringMatching(new RegExp(`QAIRT ${FAKE_QAIRT_VERSION.replace(/\./g, '\\.')} at .*forge build compiles with it`)) });
    const partial = await makeFakeQairt({ without: 'qnn-onnx-converter' });
    const bad = lastJson((await forge(['doctor', '--json'], { QAIRT_SDK_ROOT: partial.root })).stdout);
    expect(bad.toolchains['qairt-cli']).toMatchObject({ usable: false, detail: expect.stringMatching(/missing \S+qnn-onnx-converter/) });
  });

  it('has --help on every command', async () => {
    for (const cmd of ['list', 'plan', 'build', 'bisect', 'nightly', 'worker', 'publish', 'compare', 'doctor', 'clean', 'test']) {
      const r = await forge([cmd, '--help']);
      expect(r.code).toBe(0);
      expect(r.stdout).toMatch(new RegExp(`Usage: forge ${cmd}`));
    }
  });

  it('forge compare refuses a directory that is not a bundle in one line naming it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-not-bundle-'));
    const r = await forge(['compare', dir, dir]);
    expect(r.code).toBe(1);
    expect(r.stderr.trim()).toBe(`forge: ${dir} is not a bundle: it has no manifest.json`);
  });
});
