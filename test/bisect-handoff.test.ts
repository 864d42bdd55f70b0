// forge bisect, link hand-off (issue 17's "a different hand-off dtype between contexts"): a planted
// fault — the tiny-gemma4 twin with its residual after layer 2 scaled by 2^14 (test/helpers/
// handoff-hostile.ts: HF's logits unchanged, the residual handed from shard 0 to shard 1 past f16's
// 65504) in a recipe that requires f16 hand-offs — fails the oracle gate while every graph holds
// teacher-forced. Bisect names the link, the hand-off (h.3, after layer 2, shard0 → shard1), the
// first step and its value, and the fix `handoff: f32` for the arch, which --apply writes and a
// plain build then passes. Plus the pure parts: when the gate failed on the hand-off alone, the
// greedy-flip rule, the candidate's cost and its rank, and --apply's recipe edit.
import { describe, it, expect, beforeAll } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { pathToFileURL } from 'node:url';
import { forge, lastJson } from './helpers/forge-cli.js';
import { makeHandoffHostile } from './helpers/handoff-hostile.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import { Trace } from '../src/gates/trace.js';
import { dumpDom } from '../src/toolchain/chromium.js';
import { handoffCandidate, handoffOnly } from '../src/bisect/handoff-bisect.js';
import { firstFlip, pastF16, type Decision, type HandoffScan } from '../src/bisect/handoff.js';
import { rank, type Trial } from '../src/bisect/fixes.js';
import { applyHandoff } from '../src/bisect/apply.js';
import { archSettings, parseRecipe } from '../src/recipe/load.js';
import type { BisectResult } from '../src/bisect/run.js';
import type { HandoffChoice, OracleResult } from '../src/gates/oracle.js';
import { recipeSandbox, stageEntry } from './helpers/recipe-sandbox.js';

const LAYER = 2; // the last layer of tiny-gemma4's first shard ([0, 2], [3, 7])
const LOG2_SCALE = 14;

let work: string;
let recipes: string;
beforeAll(() => void ({ work, recipes } = recipeSandbox('forge-bisect-handoff-')));

const entry = stageEntry;

/** Every traced step's logits of two traces of the same prompts: the largest |difference|, and the largest |h.i| of the second. */
async function compareTraces(a: string, b: string, layer: number): Promise<{ logits: number; steps: number; minResidualMax: number }> {
  const [ta, tb] = [await Trace.open(a), await Trace.open(b)];
  try {
    let logits = 0, steps = 0, minResidualMax = Infinity;
    for (const [p, prompt] of tb.meta.prompts.entries()) {
      for (let s = 0; s < prompt.prompt_tokens.length + prompt.generated.length - 1; s++) {
        if (!tb.has(p, s, 'logits')) continue;
        const [x, y] = [await ta.get(p, s, 'logits'), await tb.get(p, s, 'logits')];
        for (let i = 0; i < x.length; i++) logits = Math.max(logits, Math.abs(x[i] - y[i]));
        const h = await tb.get(p, s, `h.${layer}`);
        minResidualMax = Math.min(minResidualMax, Math.max(...h.map(Math.abs)));
        steps++;
      }
    }
    return { logits, steps, minResidualMax };
  } finally {
    await ta.close();
    await tb.close();
  }
}

describe('forge bisect: link hand-off', () => {
  it('names the f16 hand-off of a twin whose residual exceeds f16 at a shard boundary, and the handoff f32 fix it applies makes the build pass', async () => {
    const twin = await forge(['build', 'tiny-gemma4', '--arch', 'v81', '--until', 'trace', '--json', '--out', join(work, 'twin')], { FORGE_RECIPES: recipes });
    expect(twin.code, twin.stderr).toBe(0);
    const twinRec = lastJson(twin.stdout);
    const hostile = join(work, 'hostile');
    await makeHandoffHostile(readCheckpointRef(entry(twinRec, 'fetch')).absDir, hostile, LAYER, LOG2_SCALE);
    const r = JSON.parse(readFileSync(join(recipes, 'tiny-gemma4', 'recipe.json'), 'utf8'));
    r.id = 'tiny-gemma4-handoff-f16';
    r.source = { kind: 'local', path: hostile };
    r.arch.default.handoff = 'f16';
    // The plant is checked on the text prompts (the trace's first four; the image path is gemma4.test.ts's).
    r.modalities = ['text'];
    delete r.gates.imagePrompts;
    delete r.arch.default.image;
    mkdirSync(join(recipes, r.id));
    const recipeFile = join(recipes, r.id, 'recipe.json');
    writeFileSync(recipeFile, JSON.stringify(r, null, 2));

    // The plant keeps HF's function (its logits at every traced step, to float rounding) and puts the
    // residual shard 0 hands shard 1 (h.3) past 65504 at every traced step.
    const traced = await forge(['build', r.id, '--arch', 'v81', '--until', 'trace', '--json', '--out', join(work, 'hostile-trace')], { FORGE_RECIPES: recipes });
    expect(traced.code, traced.stderr).toBe(0);
    const cmp = await compareTraces(entry(twinRec, 'trace'), entry(lastJson(traced.stdout), 'trace'), LAYER + 1);
    expect(cmp.steps).toBeGreaterThan(100);
    expect(cmp.logits).toBeLessThan(1e-4);
    expect(cmp.minResidualMax).toBeGreaterThan(65504);

    const out = join(work, 'bisect');
    const run = await forge(['bisect', r.id, '--arch', 'v81', '--apply', '--json', '--out', out], { FORGE_RECIPES: recipes });
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).not.toMatch(/\n\s+at /);
    const b = lastJson(run.stdout) as BisectResult;
    expect(b.verdict).toBe('fixed');
    expect(b.link).toBe('hand-off');
    expect(b.fault).toBeUndefined(); // no graph left tolerance teacher-forced
    expect(b.layers.every((l) => l.fp32! >= b.thresholds.fp32 && l.shipped! >= b.thresholds.shipped)).toBe(true);
    const h = b.handoff!;
    expect(h.link).toBe('hand-off');
    expect(h.choice.dtype).toBe('float32');
    // The hand-off: the residual after layer 2, from the first shard's decode graph to the second's.
    expect(h.boundary).toMatchObject({ value: `h.${LAYER + 1}`, afterLayer: LAYER, from: 'shard0.decode', to: 'shard1.decode' });
    expect(h.boundary!.overflowSteps).toBe(h.boundary!.steps);
    expect(h.boundary!.maxAbs).toBeGreaterThan(65504);
    // The other hand-off (the last shard's final-normed output to the lm-head) stays in range: not named.
    const rest = h.boundaries.filter((x) => x.value !== h.boundary!.value);
    expect(rest.length).toBe(1);
    expect(rest.every((x) => x.overflowSteps === 0 && x.maxAbs < 65504)).toBe(true);
    expect(h.first).toMatchObject({ kind: 'non-finite', prompt: 0, step: 0, boundary: `h.${LAYER + 1}` });
    expect(h.first!.maxAbs).toBeGreaterThan(65504);
    expect(b.layer).toBe(LAYER);
    // The fix: handoff f32 for this arch, no weight bytes, 2 bytes × hidden (64) × 2 hand-offs per token.
    expect(b.trials).toHaveLength(1);
    expect(b.chosen).toMatchObject({ handoff: 'f32', ok: true, addedBytes: 0, handoffBytesPerToken: 2 * 64 * 2, overrides: [] });
    expect(b.message).toMatch(/^link hand-off: .*h\.3, after layer 2 \(shard0\.decode → shard1\.decode\).*fix: handoff: f32/);
    console.log(`[measured] bisect on the hand-off-hostile twin: ${b.message}; boundaries ${h.boundaries.map((x) => `${x.value} max ${x.maxAbs.toExponential(3)} (${x.overflowSteps}/${x.steps} past)`).join(', ')}; ${b.seconds.toFixed(1)} s; HF logits vs the twin's ${cmp.logits.toExponential(2)} over ${cmp.steps} steps`);

    // --apply set handoff f32 in the arch's own block; the recipe's default still says f16, and the plain build passes.
    expect(b.applied).toMatchObject({ file: recipeFile, handoff: 'f32' });
    const applied = JSON.parse(readFileSync(recipeFile, 'utf8'));
    expect(applied.arch.v81.handoff).toBe('f32');
    expect(applied.arch.default.handoff).toBe('f16');
    const rebuilt = await forge(['build', r.id, '--arch', 'v81', '--until', 'oracle', '--json', '--out', join(work, 'rebuilt')], { FORGE_RECIPES: recipes });
    const rec = lastJson(rebuilt.stdout);
    expect(rec.gates.oracle.ok, rebuilt.stderr).toBe(true);
    // What --apply wrote is what the trial gated: the rebuild's oracle comes from the cache.
    expect(rec.stages.find((s: { name: string }) => s.name === 'oracle').status).toBe('cached');

    for (const f of ['bisect.json', 'bisect.html', 'summary.txt']) expect(existsSync(join(out, f)), f).toBe(true);
    const dom = await dumpDom(pathToFileURL(join(out, 'bisect.html')).href, join(work, 'chromium-profile'));
    expect(dom).toContain('Residual hand-offs between contexts');
    expect(dom).toContain('h.3, after layer 2 (shard0.decode → shard1.decode)');
  }, 900_000);
});

const row = (ok: boolean) => ({ variant: 'quantize:w8', graph: 'g', layer: '0', output: 'h.1', what: 'residual', minCosine: ok ? 1 : 0.5, maxAbs: 0, worst: '', ok });
const refused: HandoffChoice = { dtype: 'float32', why: 'non-finite', f32: {}, f16: {} };
const oracle = (o: Partial<OracleResult>): OracleResult => ({ ok: false, rows: [row(true)], graphs: { 'quantize:w8/g': { minCosine: 1, ok: true } }, logitError: {}, logitChain: {}, handoff: { quantize: refused }, ...o });

describe('the hand-off link, pure parts', () => {
  it('is the link only when the gate failed on a required f16 hand-off and on nothing else', () => {
    expect(handoffOnly(oracle({}), 'f16')).toBe(refused);
    expect(handoffOnly(oracle({}), 'auto')).toBeUndefined(); // auto falls back to float32 and passes
    expect(handoffOnly(oracle({ ok: true }), 'f16')).toBeUndefined();
    expect(handoffOnly(oracle({ rows: [row(false)] }), 'f16')).toBeUndefined(); // a graph's own miss goes first
    expect(handoffOnly(oracle({ graphs: { 'quantize:w8/g': { minCosine: 1, ok: false, top1: '1/2' } } }), 'f16')).toBeUndefined();
    expect(handoffOnly(oracle({ handoff: { quantize: { ...refused, dtype: 'float16' } } }), 'f16')).toBeUndefined();
  });

  it('counts a value as past f16 where roundToF16 makes it Inf: 65504 and its rounding edge hold, beyond does not', () => {
    expect(pastF16(65504)).toBe(false);
    expect(pastF16(65519)).toBe(false); // rounds down to 65504
    expect(pastF16(65520)).toBe(true);
    expect(pastF16(1.5e5)).toBe(true);
    expect(pastF16(NaN)).toBe(false); // a carried non-finite value is not this hand-off's overflow
  });

  it('finds the first greedy step f16 hand-offs lose and float32 ones keep, in prompt then step order', () => {
    const d = (hfToken: number, token: number, margin = 1): Decision => ({ hfToken, hfMargin: 1, margin, token });
    const f32 = { decisions: new Map([['1:4', d(5, 5)], ['0:9', d(5, 5)], ['0:10', d(5, 6)], ['0:12', d(5, 5)]]) };
    // 0:10 is lost by float32 too (not the hand-off's doing); 0:12 is the first f16 alone loses; 1:4 comes after it.
    const f16 = { decisions: new Map([['1:4', d(5, 7)], ['0:9', d(5, 5)], ['0:10', d(5, 7)], ['0:12', d(5, 7, -0.5)]]) };
    expect(firstFlip(f32, f16)).toBe('0:12');
    expect(firstFlip(f32, { decisions: new Map([['0:9', d(5, 5, NaN)]]) })).toBe('0:9'); // a non-finite f16 margin, or no f16 logits at all, loses it
    expect(firstFlip(f32, f32)).toBeUndefined();
  });

  it('costs the f32 fix 2 bytes × hidden per hand-off per token, no weight bytes, and ranks it after a fix of equal weight bytes and fewer hand-off bytes', () => {
    const scan: HandoffScan = { boundaries: [{ value: 'h.3', from: 'a', to: 'b', afterLayer: 2, maxAbs: 1e5, maxAt: '', overflowSteps: 1, steps: 1 }, { value: 'final', from: 'b', to: 'c', afterLayer: 7, maxAbs: 5, maxAt: '', overflowSteps: 0, steps: 1 }], hidden: 2560 };
    scan.boundary = scan.boundaries[0];
    const c = handoffCandidate(scan, 'v81');
    expect(c).toMatchObject({ label: 'handoff: f32 (arch v81)', layer: 2, handoff: 'f32', addedBytes: 0, handoffBytesPerToken: 2 * 2560 * 2, overrides: [] });
    // No hand-off named (only all of them together flip a decision): no layer either.
    expect(handoffCandidate({ ...scan, boundary: undefined }, 'v81').layer).toBeUndefined();
    const trial = (x: Partial<Trial>): Trial => ({ ...c, ok: true, seconds: 1, minCosine: 0.999, ...x });
    const w8 = trial({ label: 'layer 2 mlp.down_proj w4→w8', handoff: undefined, handoffBytesPerToken: undefined, addedBytes: 4096 });
    const hand = trial({});
    const failed = trial({ label: 'x', ok: false });
    expect(rank([w8, failed, hand]).map((t) => t.label)).toEqual([hand.label, w8.label]);
  });

  it('--apply writes handoff f32 into the arch block, leaves the default, and refuses a second time', () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-handoff-apply-'));
    const file = join(dir, 'recipe.json');
    const r = JSON.parse(readFileSync('recipes/tiny-gemma4/recipe.json', 'utf8'));
    r.arch.default.handoff = 'f16';
    writeFileSync(file, JSON.stringify(r, null, 2));
    expect(applyHandoff(file, 'v81', 'f32')).toEqual({ file, overrides: [], handoff: 'f32' });
    const recipe = parseRecipe(JSON.parse(readFileSync(file, 'utf8')), file);
    expect(archSettings(recipe, 'v81').settings.handoff).toBe('f32');
    expect(archSettings(recipe, 'v79').settings.handoff).toBe('f16');
    expect(() => applyHandoff(file, 'v81', 'f32')).toThrow(/arch\.v81\.handoff is already "f32"/);
  });
});
