import { describe, it, expect } from 'vitest';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { formatBytes } from '../src/units.js';
import { cacheRoot } from '../src/paths.js';
import { toolVersions } from '../src/toolchain/versions.js';
import { buildPipeline } from '../pipelines/build.js';
import { loadRecipe, archSettings } from '../src/recipe/load.js';
import type { RunRecord } from '../src/engine/record.js';
import { recipeSandbox } from './helpers/recipe-sandbox.js';

const compiled = (r: RunRecord) => JSON.parse(readFileSync(join(cacheRoot(), 'compile', r.stages.find((s) => s.name === 'compile')!.key!, 'compile.json'), 'utf8'));

describe('compile stage (real QNN context binaries from onnxruntime-qnn)', () => {
  it('builds v79 and v81 binaries that report their own soc_model, and differ', async () => {
    const r81 = await build({ recipe: 'tiny-qwen3', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-c81-')), progress: silentProgress });
    const r79 = await build({ recipe: 'tiny-qwen3', arch: 'v79', out: mkdtempSync(join(tmpdir(), 'forge-c79-')), progress: silentProgress });
    expect(r81.ok && r79.ok).toBe(true);
    const c81 = compiled(r81);
    const c79 = compiled(r79);
    expect(c81.contexts.map((c: any) => c.name)).toEqual(['shard0', 'lm_head']);
    expect(c81.contexts[0].graphs.map((g: any) => g.graph)).toEqual(['shard0.prefill', 'shard0.decode']); // one weight-shared context
    expect(c81.contexts[0].target).toMatchObject({ socModel: 87, dspArch: 'v81' });
    expect(c79.contexts[0].target).toMatchObject({ socModel: 69, dspArch: 'v79' });
    const bin = (r: RunRecord, c: any) => readFileSync(join(cacheRoot(), 'compile', r.stages.find((s) => s.name === 'compile')!.key!, c.bin));
    expect(bin(r81, c81.contexts[0]).equals(bin(r79, c79.contexts[0]))).toBe(false);
    // The description bundles are compared by (the bytes are not reproducible) tells the targets apart.
    expect(c81.contexts[0].describeSha256).toMatch(/^[0-9a-f]{64}$/);
    expect(c81.contexts[0].describeSha256).not.toBe(c79.contexts[0].describeSha256);
    expect(r81.summaries.compile).toMatchObject({ qairt: '2.51.0' });
    expect(r81.tools['onnxruntime-qnn']).toBe('2.7.0');
  }, 900_000); // run first, it builds the twin and the native runtime from a cold cache (two full builds, ~150 s of native compile alone here)

  it('re-plans with smaller shards when a compile runs out of HTP memory, and says so', async () => {
    process.env.FORGE_FAKE_HTP_LIMIT_BYTES = '200000';
    // A recipe copy without the simulator's gate: the re-plan and the host's parity on the new layout
    // are what this test is about; the simulator's multi-context runs are tiny-qwen3.5's and tiny-gemma4's.
    const { recipes } = recipeSandbox('forge-replan-recipes-');
    const file = join(recipes, 'tiny-qwen3', 'recipe.json');
    const recipe = JSON.parse(readFileSync(file, 'utf8'));
    recipe.gates.emulation = false;
    writeFileSync(file, JSON.stringify(recipe, null, 2));
    process.env.FORGE_RECIPES = recipes;
    try {
      const r = await build({ recipe: 'tiny-qwen3', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-replan-')), progress: silentProgress });
      expect(r.ok).toBe(true);
      expect(r.replans).toHaveLength(1);
      expect(r.replans![0].reason).toMatch(/HTP memory failure compiling shard0/);
      expect((r.summaries.plan as any).shards).toBeGreaterThan(1);
      expect((r.gates.parity as any).ok).toBe(true);
      expect(r.gatesNotRun).toHaveProperty('emulation');
    } finally {
      delete process.env.FORGE_FAKE_HTP_LIMIT_BYTES;
      delete process.env.FORGE_RECIPES;
    }
  });

  it('gives up after two re-plans', async () => {
    process.env.FORGE_FAKE_HTP_LIMIT_BYTES = '1000';
    try {
      const r = await build({ recipe: 'tiny-qwen3', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-replan2-')), progress: silentProgress });
      expect(r.ok).toBe(false);
      expect(r.replans).toHaveLength(2);
      expect(r.error).toMatch(/HTP memory failure/);
    } finally {
      delete process.env.FORGE_FAKE_HTP_LIMIT_BYTES;
    }
  });

  it('keys the compile on the QNN toolchain: a new onnxruntime or onnxruntime-qnn recompiles', () => {
    // The engine keys a stage on the versions of the tools it declares (tested in engine.test.ts).
    const { recipe } = loadRecipe('tiny-qwen3');
    const { arch, settings } = archSettings(recipe, 'v81');
    const compile = buildPipeline(recipe, arch, settings).nodes.find((n) => n.id === 'compile')!;
    expect(compile.tools).toEqual(expect.arrayContaining(['onnxruntime', 'onnxruntime-qnn', 'python-env']));
    for (const t of compile.tools) expect(toolVersions()[t], t).toBeTruthy();
  });

  it('keys a QAIRT compile on the SDK version, and has the quantize stage write W8 in QDQ form for it', () => {
    const { recipe } = loadRecipe('tiny-qwen3');
    const { arch, settings } = archSettings(recipe, 'v81');
    const nodes = (version: string) => buildPipeline(recipe, arch, settings, { toolchain: { kind: 'qairt', version } }).nodes;
    const compile = nodes('2.51.0').find((n) => n.id === 'compile')!;
    expect(compile.tools).toEqual(['qairt-sdk']);
    expect(compile.params).toMatchObject({ toolchain: { kind: 'qairt', version: '2.51.0' } });
    expect(JSON.stringify(nodes('2.52.0').find((n) => n.id === 'compile')!.params)).not.toBe(JSON.stringify(compile.params));
    expect(nodes('2.51.0').find((n) => n.id === 'quantize')!.params).toMatchObject({ scheme: 'w8', w8Form: 'qdq' });
    expect(buildPipeline(recipe, arch, settings, { toolchain: { kind: 'onnxruntime-qnn' } }).nodes.find((n) => n.id === 'quantize')!.params).not.toHaveProperty('w8Form');
  });

  it('has the quantize stage write w4 in QDQ form for the QAIRT toolchain (an lm-head alone in w4 too), and gates w4 at w4MinCosine', () => {
    const { recipe } = loadRecipe('tiny-qwen3');
    const w4 = { ...recipe, arch: { ...recipe.arch, v81: { quant: 'w4' as const } } };
    const { arch, settings } = archSettings(w4, 'v81');
    const quantize = (r: typeof recipe, s: typeof settings) => buildPipeline(r, arch, s, { toolchain: { kind: 'qairt', version: '2.51.0' } }).nodes.find((n) => n.id === 'quantize')!.params;
    expect(quantize(w4, settings)).toMatchObject({ scheme: 'w4', w8Form: 'qdq' });
    const head = { ...recipe, arch: { default: { ...recipe.arch.default, quant: 'fp16' as const, lmHead: { placement: 'separate' as const, quant: 'w4' as const } } } };
    expect(quantize(head, archSettings(head, 'v81').settings)).toMatchObject({ scheme: 'fp16', lmHeadScheme: 'w4', w8Form: 'qdq' });
    const nodes = buildPipeline(w4, arch, settings, { toolchain: { kind: 'onnxruntime-qnn' } }).nodes;
    expect(nodes.find((n) => n.id === 'quantize')!.params).toMatchObject({ scheme: 'w4' });
    const o = recipe.gates.oracle;
    expect(nodes.find((n) => n.id === 'oracle')!.params).toMatchObject({ variants: [{ input: 'export', minCosine: o.fp32MinCosine }, { input: 'quantize', minCosine: o.w4MinCosine }] });
    expect(nodes.find((n) => n.id === 'emulation')!.params).toMatchObject({ minCosine: o.w4MinCosine });
  });
});

describe('the simulator gate in the pipeline', () => {
  it('runs for a recipe that asks for it (gates.emulation), and otherwise is named as not run, with the reason', () => {
    const { recipe } = loadRecipe('tiny-qwen3');
    const { arch, settings } = archSettings(recipe, 'v81');
    const ort = { toolchain: { kind: 'onnxruntime-qnn' as const } };
    expect(recipe.gates.emulation).toBe(true);
    expect(buildPipeline(recipe, arch, settings, ort).nodes.map((n) => n.id)).toContain('emulation');
    const off = buildPipeline({ ...recipe, gates: { ...recipe.gates, emulation: false } }, arch, settings, ort);
    expect(off.nodes.map((n) => n.id)).not.toContain('emulation');
    expect(off.gatesNotRun?.emulation).toMatch(/gates\.emulation/);
    expect(loadRecipe('qwen3-4b').recipe.gates.emulation).toBe(false);
    // A QAIRT build's QDQ graphs do not compile for the simulator through onnxruntime-qnn.
    expect(buildPipeline(recipe, arch, settings, { toolchain: { kind: 'qairt', version: '2.51.0' } }).gatesNotRun?.emulation).toMatch(/QAIRT/);
  });
});

describe('compile memory (predicted from the plan)', () => {
  it('cuts the shards under --shard-ceiling when the user asks for it, and the plan says so', async () => {
    const r = await build({ recipe: 'tiny-qwen3', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-ceiling-')), progress: silentProgress, until: 'plan', shardCeilingBytes: 100_000 });
    expect(r.status).toBe('partial');
    expect(r.shardCeilingBytes).toBe(100_000); // the record says the plan is not the device-optimal one
    expect((r.summaries.plan as any).shards).toBeGreaterThan(1);
    const plan = JSON.parse(readFileSync(join(cacheRoot(), 'plan', r.stages.find((s) => s.name === 'plan')!.key!, 'plan.json'), 'utf8'));
    expect(plan.shardCeilingBytes).toBe(100_000);
    expect(plan.ceilingBytes).toBe(2e9); // the arch's own ceiling is still what the plan records as the device's
  }, 600_000);

  it('refuses a compile predicted over --memory-budget before compiling, naming the context, the prediction, the budget and the options', async () => {
    const out = mkdtempSync(join(tmpdir(), 'forge-refuse-'));
    const first = await build({ recipe: 'tiny-qwen3', arch: 'v81', out, progress: silentProgress });
    expect(first.ok).toBe(true);
    const compile = first.stages.find((s) => s.name === 'compile')!;
    // The prediction is realistic for a tiny twin's contexts: within 25% of what this run measured
    // when it compiled here (not when it came from the cache).
    const predicted = compile.predicted!;
    if (compile.status === 'ran') expect(compile.overPrediction).toBeUndefined();
    // Just under it: still room for a smaller shard ceiling to fit.
    const budget = predicted.privateBytes + predicted.mappedBytes - 200e3;
    const started: string[] = [];
    const progress = { ...silentProgress, start: (s: string) => void started.push(s) };
    // Everything else is in the cache (so not refused); the compile is asked to run again.
    const r = await build({ recipe: 'tiny-qwen3', arch: 'v81', out, progress, memoryBudgetBytes: budget, force: ['compile'] });
    expect(r.ok).toBe(false);
    expect(started).not.toContain('compile');
    const rec = r.stages.find((s) => s.name === 'compile')!;
    expect(rec).toMatchObject({ status: 'failed', seconds: 0, peakPrivateBytes: null });
    expect(r.error).toBe(`compile: ${rec.error}`);
    expect(rec.error).toContain(`refused before it started: compile is predicted to need ${formatBytes(predicted.privateBytes + predicted.mappedBytes)}`);
    expect(rec.error).toContain(`over the memory budget of ${formatBytes(budget)} (--memory-budget`);
    expect(rec.error).toMatch(/predicted from compile of shard0: .* \(context shard0's weights in plan\.json, the largest of 2\)/);
    expect(rec.error).toMatch(/; options: a smaller shard ceiling for this build \(--shard-ceiling [\d.]+ or less: more, smaller contexts than the device-optimal plan\), or a machine with at least \d+ GB of memory/);
  }, 900_000); // run alone it builds the twin from a cold cache first
});
