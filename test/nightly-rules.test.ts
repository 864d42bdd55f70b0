// The nightly's matrix validation and regression rules on crafted data (no build runs here; the
// builds are in nightly.test.ts).
import { describe, it, expect } from 'vitest';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { loadMatrix, ThresholdsSchema } from '../src/nightly/matrix.js';
import { compareNightlies } from '../src/nightly/compare.js';
import { readNightly, type BuildSummary, type Figure } from '../src/nightly/summary.js';
import { nightlyMarkdown, trendPlot } from '../src/nightly/report.js';

const dir = mkdtempSync(join(tmpdir(), 'forge-nightly-rules-'));
function matrixFile(name: string, body: unknown): string {
  const file = join(dir, name);
  writeFileSync(file, typeof body === 'string' ? body : JSON.stringify(body));
  return file;
}

const summary = (figures: Record<string, Figure>, over: Partial<BuildSummary> = {}): BuildSummary => ({
  id: 'tiny-qwen3/v81', recipe: 'tiny-qwen3', arch: 'v81', ok: true, status: 'ok', seconds: 3, bundle: '/b', runRecord: '/b/build/run.json',
  figures, stages: [{ name: 'fetch', status: 'cached', seconds: 0.01 }], tools: { 'onnxruntime-qnn': '2.7.0' }, ...over,
});
const thresholds = ThresholdsSchema.parse({});
const cos = (value: number, threshold = 0.999): Figure => ({ kind: 'cosine', value, threshold, note: 'w8' });
const base = {
  'oracle quantize/shard0.decode min cosine': cos(0.9995),
  'parity quantize matched': { kind: 'matched', value: 128, total: 128 } as Figure,
  'context shard0 bytes': { kind: 'bytes', value: 100_000 } as Figure,
  'build seconds': { kind: 'seconds', value: 3 } as Figure,
};
const flaggedFigures = (before: BuildSummary, after: BuildSummary, t = thresholds) =>
  compareNightlies({ builds: [after], thresholds: t }, { builds: [before] }).regressions.map((c) => c.figure);

describe('nightly matrix', () => {
  it('loads the shipped twin matrix', () => {
    const { matrix } = loadMatrix();
    expect(matrix.builds.length).toBeGreaterThanOrEqual(3);
    expect(new Set(matrix.builds.map((b) => b.arch))).toEqual(new Set(['v79', 'v81']));
  });

  it('refuses a bad matrix naming the file and the field', () => {
    const bad = (name: string, body: unknown) => () => loadMatrix(matrixFile(name, body));
    expect(bad('arch.json', { builds: [{ recipe: 'tiny-qwen3', arch: 'v99' }] })).toThrow(/invalid nightly matrix .*arch\.json: builds\[0\]\.arch: not an arch \(valid: .*v81/);
    expect(bad('recipe.json', { builds: [{ recipe: 'tiny-qwen3', arch: 'v81' }, { recipe: 'no-such', arch: 'v81' }] })).toThrow(/recipe\.json: builds\[1\]\.recipe: no recipe 'no-such'/);
    expect(bad('extra.json', { builds: [{ recipe: 'tiny-qwen3', arch: 'v81' }], thresholds: { cosineDrop: 1 } })).toThrow(/extra\.json: thresholds: .*cosineDrop/);
    expect(bad('twice.json', { builds: [{ recipe: 'tiny-qwen3', arch: 'v81' }, { recipe: 'tiny-qwen3', arch: 'v81' }] })).toThrow(/twice\.json: builds\[1\]: tiny-qwen3\/v81 is already builds\[0\]/);
    expect(bad('empty.json', { builds: [] })).toThrow(/empty\.json: builds: /);
    expect(bad('broken.json', '{"builds": [')).toThrow(/broken\.json: not valid JSON/);
  });

  it('refuses a previous nightly.json that is not one, naming the file and field', () => {
    const file = matrixFile('old.json', { format: 'forge-nightly/1', startedAt: 'x', seconds: 1, matrix: 'm', thresholds, builds: [{ id: 'a' }], comparedWith: null, regressions: 0 });
    expect(() => readNightly(file)).toThrow(/invalid nightly result .*old\.json: builds\[0\]\.recipe: /);
  });
});

describe('nightly regression rules', () => {
  it('flags nothing when nothing changed, and says so', () => {
    const cmp = compareNightlies({ builds: [summary(base)], thresholds }, { builds: [summary(base)] });
    expect(cmp.regressions).toEqual([]);
    expect(cmp.changes.find((c) => c.figure === 'oracle quantize/shard0.decode min cosine')).toMatchObject({ before: '0.9995000', after: '0.9995000', flagged: false });
  });

  it('a cosine down by more than the tolerance, or below its threshold', () => {
    expect(flaggedFigures(summary(base), summary({ ...base, 'oracle quantize/shard0.decode min cosine': cos(0.99945) }))).toEqual([]);
    expect(flaggedFigures(summary(base), summary({ ...base, 'oracle quantize/shard0.decode min cosine': cos(0.9993) }))).toEqual(['oracle quantize/shard0.decode min cosine']);
    // Below the bound with no fall at all (the recipe's threshold was raised): still flagged.
    const c = compareNightlies({ builds: [summary({ ...base, 'oracle quantize/shard0.decode min cosine': cos(0.9995, 0.9999) })], thresholds }, { builds: [summary(base)] });
    expect(c.regressions[0].why).toBe('below the recipe threshold 0.9999');
  });

  it('parity matched falling, a context growing past its tolerance; a smaller context is not a regression', () => {
    expect(flaggedFigures(summary(base), summary({ ...base, 'parity quantize matched': { kind: 'matched', value: 127, total: 128 } }))).toEqual(['parity quantize matched']);
    expect(flaggedFigures(summary(base), summary({ ...base, 'context shard0 bytes': { kind: 'bytes', value: 104_000 } }))).toEqual([]);
    const grown = compareNightlies({ builds: [summary({ ...base, 'context shard0 bytes': { kind: 'bytes', value: 110_000 } })], thresholds }, { builds: [summary(base)] });
    expect(grown.regressions).toMatchObject([{ figure: 'context shard0 bytes', before: '100,000', after: '110,000', why: 'grew by 10.0% (tolerance 5.0%)' }]);
    expect(flaggedFigures(summary(base), summary({ ...base, 'context shard0 bytes': { kind: 'bytes', value: 50_000 } }))).toEqual([]);
  });

  it('timings are shown but flagged only under maxSlowdown', () => {
    const slow = summary({ ...base, 'build seconds': { kind: 'seconds', value: 30 } });
    expect(flaggedFigures(summary(base), slow)).toEqual([]);
    expect(flaggedFigures(summary(base), slow, { ...thresholds, maxSlowdown: 2 })).toEqual(['build seconds']);
  });

  it('a failed build is a regression; a changed tool version is shown, not flagged', () => {
    const cmp = compareNightlies({ builds: [summary({}, { ok: false, status: 'failed', error: 'oracle: gate oracle failed', tools: { 'onnxruntime-qnn': '2.8.0' } })], thresholds }, { builds: [summary(base)] });
    expect(cmp.regressions).toMatchObject([{ figure: 'build', before: 'ok', after: 'failed: oracle: gate oracle failed', why: 'the build failed' }]);
    expect(cmp.tools).toEqual([{ build: 'tiny-qwen3/v81', tool: 'onnxruntime-qnn', before: '2.7.0', after: '2.8.0' }]);
  });

  it('the markdown names the build, the figure, before and after', () => {
    const after = summary({ ...base, 'oracle quantize/shard0.decode min cosine': { ...cos(0.88, 0.85), note: 'w4' } });
    const n = { format: 'forge-nightly/1' as const, startedAt: '2026-01-02T00:00:00Z', seconds: 5, matrix: 'm.json', thresholds, builds: [after], comparedWith: 'prev.json', regressions: 1 };
    const md = nightlyMarkdown(n, null, compareNightlies(n, { builds: [summary(base)] }));
    expect(md).toContain('**REGRESSION: 1 regressed figure**');
    expect(md).toMatch(/\| tiny-qwen3\/v81 \| oracle quantize\/shard0\.decode min cosine \| 0\.9995000 \| 0\.8800000 \| REGRESSION: fell by 0\.120 \(tolerance 0\.0001\); w8 → w4 \|/);
  });

  it('a queued nightly\'s build table names the worker of each build, and its retries', () => {
    const a = summary(base, { queue: { worker: 'farm-1:4242', attempts: 1, stalled: 0 } });
    const b = summary(base, { id: 'tiny-qwen3/v79', arch: 'v79', queue: { worker: 'farm-2:77', attempts: 2, stalled: 1 } });
    const n = { format: 'forge-nightly/1' as const, startedAt: '2026-01-02T00:00:00Z', seconds: 5, matrix: 'm.json', thresholds, builds: [a, b], comparedWith: null, regressions: 0 };
    const md = nightlyMarkdown(n, null, compareNightlies(n, null));
    expect(md).toContain('| build | result | stages cached | seconds | bundle bytes | worker | run record |');
    expect(md).toContain('| tiny-qwen3/v81 | ok | 1/1 | 3.0 | — | farm-1:4242 | /b/build/run.json |');
    expect(md).toContain('| farm-2:77 (attempt 2) (stalled 1) |');
    // Built on this machine: no worker column.
    const local = nightlyMarkdown({ ...n, builds: [summary(base)] }, null, compareNightlies({ ...n, builds: [summary(base)] }, null));
    expect(local).not.toContain('| worker |');
  });

  it('plots one point per stored nightly, the threshold dashed', () => {
    const svg = trendPlot('x', [{ at: 'a', value: 0.9995 }, { at: 'b', value: 0.9994 }, { at: 'c', value: 0.88 }], { cosine: true, threshold: 0.85, flagged: true });
    expect(svg.match(/<circle/g)).toHaveLength(3);
    expect(svg).toContain('stroke-dasharray');
    expect(svg).toContain('fill="#b00"');
  });
});
