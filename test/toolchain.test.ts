// The toolchain matrix (issue 18, part 5) on crafted data: pinned toolchains resolve from
// toolchains/<name>.txt or are refused with one error; each has its own venv key; a toolchain build
// shares every stage before the compile with the default build and none from the compile on; and
// the report shows two toolchains of one recipe × arch side by side. No build runs here (the
// measured 2.6.0 vs 2.7.0 build is in docs/nightly.md).
import { describe, it, expect } from 'vitest';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { loadMatrix, ThresholdsSchema } from '../src/nightly/matrix.js';
import { compareNightlies } from '../src/nightly/compare.js';
import type { BuildSummary, Figure, Nightly } from '../src/nightly/summary.js';
import { nightlyHtml, nightlyMarkdown } from '../src/nightly/report.js';
import { BUILD_SUMMARY, listBuilds, nightlyFromResults } from '../src/nightly/ci.js';
import { listToolchains, resolveToolchain, toolchainVersions } from '../src/toolchain/toolchains.js';
import { toolVersions, requirementsFile } from '../src/toolchain/versions.js';
import { venvDir } from '../src/toolchain/venv.js';
import { doctor } from '../src/toolchain/doctor.js';
import { archSettings, loadRecipe, pinnedRecipe } from '../src/recipe/load.js';
import { buildPipeline } from '../pipelines/build.js';
import type { CompileToolchain } from '../src/toolchain/qnn/compile-stage.js';
import { cacheKey } from '../src/engine/run.js';

const dir = mkdtempSync(join(tmpdir(), 'forge-toolchain-'));
const file = (name: string, body: unknown) => {
  const f = join(dir, name);
  mkdirSync(join(f, '..'), { recursive: true });
  writeFileSync(f, typeof body === 'string' ? body : JSON.stringify(body));
  return f;
};

describe('pinned toolchains', () => {
  it('ships qnn-2.6.0: onnxruntime-qnn 2.6.0 with the main environment onnxruntime', () => {
    expect(listToolchains()).toContain('qnn-2.6.0');
    const t = resolveToolchain('qnn-2.6.0');
    expect(t.pins).toMatchObject({ 'onnxruntime-qnn': '2.6.0', onnxruntime: toolVersions().onnxruntime });
    // Small: no torch or transformers in a compile toolchain's venv.
    expect(Object.keys(t.pins).sort()).toEqual(['numpy', 'onnx', 'onnxruntime', 'onnxruntime-qnn', 'safetensors']);
  });

  it('refuses a toolchain that is missing, unpinned or lacks onnxruntime-qnn, naming the file', () => {
    expect(() => resolveToolchain('qnn-9.9.9')).toThrow(/no toolchain 'qnn-9\.9\.9' \(no .*toolchains\/qnn-9\.9\.9\.txt; known: .*qnn-2\.6\.0/);
    expect(() => resolveToolchain(file('loose.txt', 'onnxruntime-qnn>=2.6\nonnxruntime==1.29.0\n'))).toThrow(/invalid toolchain .*loose\.txt: 'onnxruntime-qnn>=2\.6' is not pinned/);
    expect(() => resolveToolchain(file('no-qnn.txt', 'onnxruntime==1.29.0\n'))).toThrow(/invalid toolchain .*no-qnn\.txt: it must pin onnxruntime-qnn/);
    expect(() => resolveToolchain(join(dir, 'absent.txt'))).toThrow(/no toolchain requirements file at .*absent\.txt/);
  });

  it('is listed by forge doctor with its pins and its venv', async () => {
    const t = resolveToolchain('qnn-2.6.0');
    expect((await doctor()).pinned).toContainEqual({ name: 'qnn-2.6.0', pins: t.pins, venv: venvDir(t.file), ready: expect.any(Boolean) });
  });

  it('gets a venv of its own, keyed by its requirements file', () => {
    const t = resolveToolchain('qnn-2.6.0');
    expect(venvDir(t.file)).not.toBe(venvDir());
    expect(venvDir(t.file)).toMatch(new RegExp(`venv-${t.hash}$`));
    // The same content elsewhere is the same venv: the key is the file's bytes, not its path.
    expect(venvDir(file('copy/qnn-2.6.0.txt', readFileSync(t.file, 'utf8')))).toBe(venvDir(t.file));
    expect(venvDir()).toBe(venvDir(requirementsFile()));
  });
});

/** Every node's cache key given equal inputs upstream (the engine keys on their content hashes; equal content, equal hash). */
function nodeKeys(toolchain?: { name: string; file?: string }): Map<string, string> {
  const loaded = loadRecipe('tiny-qwen3');
  const { arch, settings } = archSettings(pinnedRecipe(loaded), 'v81');
  const t = toolchain ? resolveToolchain(toolchain.file ?? toolchain.name) : null;
  const compile: CompileToolchain = t ? { kind: 'onnxruntime-qnn', env: { name: t.name, hash: t.hash } } : { kind: 'onnxruntime-qnn' };
  const versions = { ...toolVersions(), ...(t ? toolchainVersions(t) : {}) };
  const p = buildPipeline(loaded.recipe as any, arch, settings, { toolchain: compile, localDigest: undefined });
  const keys = new Map<string, string>();
  for (const n of p.nodes) {
    const tools = Object.fromEntries(n.tools.map((x) => [x, versions[x]]));
    expect(Object.values(tools), `${n.id} declares a tool without a version`).not.toContain(undefined);
    const inputs = Object.fromEntries(Object.entries(n.inputs).map(([name, id]) => [name, keys.get(id)!]));
    keys.set(n.id, cacheKey({ stage: n.id, version: '', code: n.module, params: n.params, inputs, tools }));
  }
  return keys;
}

describe('a toolchain build in the stage cache', () => {
  it('shares the stages before the compile with the default build, and none from the compile on', () => {
    const def = nodeKeys();
    const pinned = nodeKeys({ name: 'qnn-2.6.0' });
    for (const id of ['fetch', 'plan', 'trace', 'export', 'quantize', 'oracle', 'native', 'parity']) expect(pinned.get(id), id).toBe(def.get(id));
    for (const id of ['compile', 'emulation', 'bundle']) expect(pinned.get(id), id).not.toBe(def.get(id));
  });

  it('keys two toolchains apart, even when only the file differs', () => {
    const a = nodeKeys({ name: 'qnn-2.6.0' });
    const other = file('qnn-2.6.0-b.txt', `${readFileSync(resolveToolchain('qnn-2.6.0').file, 'utf8')}\n# another build of the same pins\n`);
    const b = nodeKeys({ name: 'x', file: other });
    expect(b.get('compile')).not.toBe(a.get('compile'));
    expect(b.get('quantize')).toBe(a.get('quantize'));
  });
});

describe('toolchain pins in the nightly matrix', () => {
  it('accepts a pin and names the build recipe/arch/toolchain', () => {
    const { matrix } = loadMatrix(file('ok.json', { builds: [{ recipe: 'tiny-qwen3', arch: 'v81' }, { recipe: 'tiny-qwen3', arch: 'v81', toolchain: 'qnn-2.6.0' }] }));
    expect(matrix.builds[1].toolchain).toBe('qnn-2.6.0');
    expect(listBuilds(join(dir, 'ok.json')).map((b) => [b.id, b.slug])).toEqual([['tiny-qwen3/v81', 'tiny-qwen3_v81'], ['tiny-qwen3/v81/qnn-2.6.0', 'tiny-qwen3_v81_qnn-2.6.0']]);
  });

  it('refuses an unknown toolchain with one error naming the field and the known ones', () => {
    const f = file('unknown.json', { builds: [{ recipe: 'tiny-qwen3', arch: 'v81' }, { recipe: 'tiny-qwen3', arch: 'v81', toolchain: 'qnn-1.0' }] });
    expect(() => loadMatrix(f)).toThrow(/invalid nightly matrix .*unknown\.json: builds\[1\]\.toolchain: no toolchain 'qnn-1\.0' in .*toolchains \(known: .*qnn-2\.6\.0/);
    expect(() => loadMatrix(file('path.json', { builds: [{ recipe: 'tiny-qwen3', arch: 'v81', toolchain: '../x' }] }))).toThrow(/path\.json: builds\[0\]\.toolchain: a toolchain name/);
    expect(() => loadMatrix(file('twice.json', { builds: [{ recipe: 'tiny-qwen3', arch: 'v81', toolchain: 'qnn-2.6.0' }, { recipe: 'tiny-qwen3', arch: 'v81', toolchain: 'qnn-2.6.0' }] })))
      .toThrow(/builds\[1\]: tiny-qwen3\/v81\/qnn-2\.6\.0 is already builds\[0\]/);
  });

  it('ships nightly/toolchains.json: tiny-qwen3 v81 on the default toolchain and on qnn-2.6.0', () => {
    expect(listBuilds('nightly/toolchains.json').map((b) => b.id)).toEqual(['tiny-qwen3/v81', 'tiny-qwen3/v81/qnn-2.6.0']);
  });
});

const fig = (kind: Figure['kind'], value: number, extra: Partial<Figure> = {}): Figure => ({ kind, value, ...extra });
const summary = (toolchain: string | undefined, figures: Record<string, Figure>, over: Partial<BuildSummary> = {}): BuildSummary => ({
  id: `tiny-qwen3/v81${toolchain ? `/${toolchain}` : ''}`, recipe: 'tiny-qwen3', arch: 'v81', ...(toolchain ? { toolchain } : {}), ok: true, status: 'ok', seconds: 60,
  bundle: '/b', runRecord: '/b/build/run.json', figures, stages: [{ name: 'compile', status: 'ran', seconds: 20 }],
  tools: { 'onnxruntime-qnn': toolchain ? '2.6.0' : '2.7.0', qairt: toolchain ? '2.50.40' : '2.51.0', onnxruntime: '1.29.0', transformers: '5.23.0', ...(toolchain ? { toolchain: `${toolchain}@abc` } : {}) },
  ...over,
});
const figures = {
  'simulator shard0.decode min cosine': fig('cosine', 0.99991, { threshold: 0.999 }),
  'context shard0 bytes': fig('bytes', 1_000_000),
  'context shard0 compile seconds': fig('seconds', 10),
  'bundle bytes': fig('bytes', 5_000_000),
};
const nightlyOf = (builds: BuildSummary[], t = {}): Nightly => ({
  format: 'forge-nightly/1', startedAt: '2026-11-26T02:00:00.000Z', seconds: 1, matrix: 'nightly/toolchains.json', thresholds: ThresholdsSchema.parse(t), builds, comparedWith: null, regressions: 0,
});

describe('the toolchain comparison in the report', () => {
  const newer = summary(undefined, figures);
  const older = summary('qnn-2.6.0', { ...figures, 'simulator shard0.decode min cosine': fig('cosine', 0.99970, { threshold: 0.999 }), 'context shard0 bytes': fig('bytes', 1_100_000), 'context shard0 compile seconds': fig('seconds', 12.5) });

  it('shows each figure of the two toolchains side by side, what changed, and flags what is beyond the thresholds', () => {
    const n = nightlyOf([newer, older]);
    const cmp = compareNightlies(n, null);
    expect(cmp.toolchains).toHaveLength(1);
    const c = cmp.toolchains[0];
    expect([c.base.id, c.other.id]).toEqual(['tiny-qwen3/v81', 'tiny-qwen3/v81/qnn-2.6.0']);
    expect(c.tools).toEqual(expect.arrayContaining([{ tool: 'onnxruntime-qnn', base: '2.7.0', other: '2.6.0' }, { tool: 'qairt', base: '2.51.0', other: '2.50.40' }]));
    const row = (f: string) => c.rows.find((r) => r.figure === f)!;
    expect(row('simulator shard0.decode min cosine')).toMatchObject({ base: '0.9999100', other: '0.9997000', change: '-2.10e-4', flagged: true });
    expect(row('context shard0 bytes')).toMatchObject({ change: '+10.00%', flagged: true });
    expect(row('context shard0 compile seconds')).toMatchObject({ base: '10.0 s', other: '12.5 s', change: '1.25×', flagged: false });
    expect(row('bundle bytes')).toMatchObject({ change: '', flagged: false });
    // Flagged in the section, not a regression of the nightly unless the matrix says so.
    expect(cmp.regressions).toEqual([]);
    const md = nightlyMarkdown(n, null, cmp);
    expect(md).toContain('## Toolchain comparison');
    expect(md).toContain('### tiny-qwen3/v81: default (onnxruntime-qnn 2.7.0) vs qnn-2.6.0');
    expect(md).toContain('Tools that differ: onnxruntime-qnn 2.7.0 → 2.6.0, qairt 2.51.0 → 2.50.40');
    expect(md).toMatch(/\| context shard0 bytes \| 1,000,000 \| 1,100,000 \| \+10\.00% \| BEYOND THRESHOLD: grew by 10\.0%/);
    expect(md).toMatch(/do not fail the nightly/);
    // Tool versions per build, the toolchain build's own.
    expect(md).toMatch(/\| build \| toolchain \| onnxruntime-qnn \| qairt \| onnxruntime \| transformers \|/);
    expect(md).toContain('| tiny-qwen3/v81/qnn-2.6.0 | qnn-2.6.0@abc | 2.6.0 | 2.50.40 | 1.29.0 | 5.23.0 |');
    expect(nightlyHtml(n, null, cmp, [n])).toMatch(/<h2>Toolchain comparison<\/h2>[\s\S]*<table id="toolchain-0">[\s\S]*<tr class="regression"><td>context shard0 bytes<\/td>/);
  });

  it('counts those differences as regressions when the matrix asks (failOnToolchainDifference)', () => {
    const cmp = compareNightlies(nightlyOf([newer, older], { failOnToolchainDifference: true }), null);
    expect(cmp.regressions.map((r) => r.figure)).toEqual(['simulator shard0.decode min cosine (vs default (onnxruntime-qnn 2.7.0))', 'context shard0 bytes (vs default (onnxruntime-qnn 2.7.0))']);
  });

  it('reports a toolchain whose build failed as a failed build, with its error, in the comparison', () => {
    const failed = summary('qnn-2.6.0', {}, { ok: false, status: 'failed', error: 'compile: QNN compile of shard0 failed: op X unsupported', bundle: null });
    const n = nightlyOf([newer, failed]);
    const cmp = compareNightlies(n, null);
    expect(cmp.toolchains[0].rows[0]).toMatchObject({ figure: 'build', base: 'ok', other: 'failed: compile: QNN compile of shard0 failed: op X unsupported', change: 'fails', flagged: true });
    expect(cmp.regressions.map((r) => `${r.build} ${r.figure}`)).toEqual(['tiny-qwen3/v81/qnn-2.6.0 build']);
    expect(nightlyMarkdown(n, null, cmp)).toMatch(/\| build \| ok \| failed: compile: QNN compile of shard0 failed: op X unsupported \| fails \| BEYOND THRESHOLD: the build failed \|/);
  });
});

describe('forge nightly --from-results (the CI report job)', () => {
  const matrix = file('ci/toolchains.json', { builds: [{ recipe: 'tiny-qwen3', arch: 'v81' }, { recipe: 'tiny-qwen3', arch: 'v81', toolchain: 'qnn-2.6.0' }, { recipe: 'tiny-qwen3', arch: 'v79' }] });
  const newer = summary(undefined, figures);
  const older = summary('qnn-2.6.0', figures);

  it('gathers the uploaded summaries in matrix order; a build without one is a failed build', () => {
    const results = join(dir, 'results');
    file(`results/summary-tiny-qwen3_v81_qnn-2.6.0/${BUILD_SUMMARY}`, older);
    file(`results/summary-tiny-qwen3_v81/${BUILD_SUMMARY}`, newer);
    const out = join(dir, 'report');
    const r = nightlyFromResults({ results, matrix, out, log: () => {} });
    expect(r.nightly.builds.map((b) => [b.id, b.ok])).toEqual([['tiny-qwen3/v81', true], ['tiny-qwen3/v81/qnn-2.6.0', true], ['tiny-qwen3/v79', false]]);
    expect(r.nightly.builds[2].error).toMatch(/no result: its job left no build-summary\.json/);
    expect(r.comparison.toolchains).toHaveLength(1);
    expect(readFileSync(join(out, 'report.md'), 'utf8')).toContain('## Toolchain comparison');
    expect(JSON.parse(readFileSync(join(out, 'nightly.json'), 'utf8')).builds[1].toolchain).toBe('qnn-2.6.0');
  });

  it('refuses results that are not of this matrix, or a build twice, naming the file', () => {
    file(`foreign/a/${BUILD_SUMMARY}`, summary(undefined, figures, { id: 'tiny-qwen3.5/v81', recipe: 'tiny-qwen3.5' }));
    expect(() => nightlyFromResults({ results: join(dir, 'foreign'), matrix, out: join(dir, 'o1'), log: () => {} })).toThrow(/foreign\/a\/build-summary\.json: build 'tiny-qwen3\.5\/v81' is not in the nightly matrix/);
    file(`twice/a/${BUILD_SUMMARY}`, newer);
    file(`twice/b/${BUILD_SUMMARY}`, newer);
    expect(() => nightlyFromResults({ results: join(dir, 'twice'), matrix, out: join(dir, 'o2'), log: () => {} })).toThrow(/twice\/b\/build-summary\.json: a second summary of tiny-qwen3\/v81 \(the first is .*twice\/a/);
    file(`bad/a/${BUILD_SUMMARY}`, { id: 'tiny-qwen3/v81' });
    expect(() => nightlyFromResults({ results: join(dir, 'bad'), matrix, out: join(dir, 'o3'), log: () => {} })).toThrow(/invalid build summary .*bad\/a\/build-summary\.json: recipe: /);
  });
});
