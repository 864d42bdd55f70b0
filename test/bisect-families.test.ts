// forge bisect beyond the decoders it was first written for: on every family's twin recipe a healthy
// build is "no fault" from the cache; on PhiMoE, whose experts run in one graph every layer shares
// (host-routed, fed from host tables), a W8-hostile expert is named by layer and expert and fixed by
// rebalancing its channels in the host tables (the same function), which --apply writes and a plain
// build then passes. Plus the pure parts: naming the expert from the cases that read it, and the
// rebalancing keeping the expert's function. Runs late (test/sequencer.ts): the family tests have
// built these twins by then, so the healthy runs read their stages from the run's cache.
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { forge, lastJson } from './helpers/forge-cli.js';
import { makeExpertW8Hostile } from './helpers/w4-hostile.js';
import { recipeSandbox, stageEntry, writeRecipeVariant } from './helpers/recipe-sandbox.js';
import type { ExportManifest } from '../src/export/graphs.js';
import type { OracleResult } from '../src/gates/oracle.js';
import { twinDir } from './helpers/twin.js';
import { pageLayout } from './helpers/page-layout.js';
import { blameExperts } from '../src/bisect/experts.js';
import { equalizeChannels } from '../src/families/expert-tables.js';
import type { BisectResult } from '../src/bisect/run.js';
import { routingFlip, topExperts } from '../src/families/phimoe-chain.js';
import { flipsBefore, routingCandidates } from '../src/bisect/routing.js';
import { noFaultWarnings } from '../src/bisect/warnings.js';
import { routingText } from '../src/gates/oracle.js';

let work: string;
let recipes: string;
beforeAll(() => void ({ work, recipes } = recipeSandbox('forge-bisect-families-')));

const lastBisect = (stdout: string) => lastJson(stdout) as BisectResult;

describe('forge bisect on every family', () => {
  it.each(['tiny-qwen3.5', 'tiny-phimoe', 'tiny-gemma4', 'tiny-qwen3-vl'])('says "no fault" on healthy %s, from the cache', async (id) => {
    const args = ['bisect', id, '--arch', 'v81', '--json', '--out', join(work, `healthy-${id}`)];
    const once = async () => {
      const t = performance.now();
      const r = await forge(args, { FORGE_RECIPES: recipes });
      return { r, seconds: (performance.now() - t) / 1000 };
    };
    // In the full suite the family's own tests have built it all; alone, the first run builds it and a second reads the cache.
    let { r: run, seconds } = await once();
    if (run.code === 0 && !lastBisect(run.stdout).build.stages.every((s) => s.status === 'cached')) ({ r: run, seconds } = await once());
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).not.toMatch(/\n\s+at /);
    const b = lastBisect(run.stdout);
    expect(b.verdict).toBe('no-fault');
    expect(b.message).toMatch(/^no fault: every graph within tolerance/);
    // …and the native runtime on this CPU, with its own caches, follows HF too.
    expect(b.runtime!.parity.holds).toBe(true);
    expect(b.build.stages.every((s) => s.status === 'cached')).toBe(true);
    expect(b.trials).toEqual([]);
    // PhiMoE routes on the host: bisect says how often the chained shipped router picks HF's experts (4 layers a traced step).
    if (id === 'tiny-phimoe') {
      expect(b.routing!.decisions % 4).toBe(0);
      expect(b.routing!.decisions).toBeGreaterThan(0);
      expect(b.drift!.notScanned).toContain(`the shipped router picks HF's experts at ${b.routing!.decisions - b.routing!.flips.length}/${b.routing!.decisions} decisions`);
    } else expect(b.routing).toBeUndefined();
    console.log(`[measured] bisect on healthy ${id} (v81), everything cached: ${seconds.toFixed(1)} s for the command, ${b.seconds.toFixed(1)} s inside it; drift ${b.drift?.notScanned ? 'not scanned' : `${b.drift?.steps.length} steps`}${b.routing ? `; routing flips ${b.routing.flips.length}/${b.routing.decisions}` : ''}`);
  }, 900_000);

  it('names the W8-hostile expert of a PhiMoE layer, and its channels equalized in the host tables, applied, make the build pass', async () => {
    const LAYER = 2, EXPERT = 1;
    const hostile = join(work, 'expert-hostile');
    await makeExpertW8Hostile(await twinDir('phimoe'), hostile, LAYER, EXPERT);
    const id = 'tiny-phimoe-hostile-expert';
    const recipeFile = writeRecipeVariant(recipes, 'tiny-phimoe', id, (r) => void (r.source = { kind: 'local', path: hostile }));
    const out = join(work, 'bisect-expert');
    const run = await forge(['bisect', id, '--arch', 'v81', '--apply', '--json', '--out', out], { FORGE_RECIPES: recipes });
    expect(run.code, run.stderr).toBe(0);
    const b = lastBisect(run.stdout);
    // The experts graph is left at the hostile expert's layer, not blamed on the lm-head.
    expect(b.fault).toMatchObject({ link: 'quantization', variant: 'quantize:w8', graph: 'experts', layer: LAYER });
    expect(b.layer).toBe(LAYER);
    // The expert: every case that reads it fails, alone included; no other expert's alone case does.
    const [worst, ...others] = b.experts!.figures;
    expect(worst).toMatchObject({ expert: EXPERT });
    expect(worst.failing).toBe(worst.cases);
    expect(worst.alone).toBeGreaterThan(0);
    for (const f of others) expect(f.aloneFailing, `expert ${f.expert}`).toBe(0);
    expect(b.message).toContain(`layer ${LAYER}'s experts; expert ${EXPERT}:`);
    // The fix: that expert's channels rebalanced, no bytes added, gated by the oracle.
    expect(b.verdict).toBe('fixed');
    expect(b.chosen).toMatchObject({ ok: true, addedBytes: 0, tensors: [], overrides: [] });
    expect(b.chosen!.equalize).toEqual([expect.objectContaining({ match: `layers\\.${LAYER}\\.experts\\.${EXPERT}` })]);
    expect(b.chosen!.minCosine).toBeGreaterThanOrEqual(b.thresholds.shipped);
    console.log(`[measured] bisect on tiny-phimoe with layer ${LAYER} expert ${EXPERT} W8-hostile: first miss ${b.fault!.graph} layer ${b.fault!.layer} ${b.fault!.cosine.toFixed(5)}; experts ${b.experts!.figures.map((f) => `${f.expert}: ${f.failing}/${f.cases} (alone ${f.aloneFailing}/${f.alone}) ${f.minCosine.toFixed(5)}`).join('; ')}; ${b.trials.map((t) => `${t.label} ${t.ok ? 'ok' : 'no'} ${t.minCosine?.toFixed(5)}`).join('; ')}; ${b.seconds.toFixed(1)} s`);

    // --apply wrote the line into the recipe; a plain build through the runtime's parity gate passes with it.
    expect(JSON.parse(readFileSync(recipeFile, 'utf8')).arch.default.equalize).toEqual(b.chosen!.equalize);
    const rebuilt = await forge(['build', id, '--arch', 'v81', '--until', 'parity', '--json', '--out', join(work, 'rebuilt-expert')], { FORGE_RECIPES: recipes });
    const rec = lastJson(rebuilt.stdout);
    expect(rec.gates.oracle.ok, rebuilt.stderr).toBe(true);
    expect(rec.gates.parity.ok, rebuilt.stderr).toBe(true);
    expect(rec.stages.find((s: { name: string }) => s.name === 'oracle').status).toBe('cached');

    // bisect.html at a laptop's 1280 px: the verdict box names the expert and the fix, no horizontal scroll.
    mkdirSync(join(work, 'page-expert'));
    const page = await pageLayout(readFileSync(join(out, 'bisect.html'), 'utf8'), join(work, 'page-expert'), '#verdict');
    expect(page.scrollWidth).toBeLessThanOrEqual(1280);
    expect(page.dom).toContain(`Layer ${LAYER}'s experts`);
    expect(page.dom).toContain(`layer ${LAYER}'s expert ${EXPERT}:`);
    expect(page.dom).toContain(`equalize layers.${LAYER}.experts.${EXPERT}'s channels`);
  }, 900_000);

  // The values pair on the families whose attention has biases (PhiMoE: v_proj's bias scales with it,
  // o_proj's does not) or mixes layer kinds (Qwen3.5: its full-attention layers): the shipped graphs
  // keep their numbers, and their graphs say which cache holds V scaled.
  it.each([['tiny-phimoe', 1], ['tiny-qwen3.5', 3]] as const)('keeps %s\'s numbers with layer %i\'s v_proj rescaled with o_proj', async (base, layer) => {
    const build = async (id: string) => {
      const r = await forge(['build', id, '--arch', 'v81', '--until', 'oracle', '--json', '--out', join(work, `values-${id}`)], { FORGE_RECIPES: recipes });
      return { rec: lastJson(r.stdout), stderr: r.stderr };
    };
    const id = `${base}-values`;
    writeRecipeVariant(recipes, base, id, (r) => void (r.arch.default.rescale = [{ match: `layers\\.${layer}/self_attn\\.v_proj`, scale: 2 ** -4 }]));
    const [plain, scaled] = [await build(base), await build(id)];
    expect(scaled.rec.gates.oracle.ok, scaled.stderr).toBe(true);
    const shipped = (x: typeof plain) => (JSON.parse(readFileSync(join(stageEntry(x.rec, 'oracle'), 'oracle.json'), 'utf8')) as OracleResult).graphs;
    for (const [graph, g] of Object.entries(shipped(plain))) expect(Math.abs(shipped(scaled)[graph].minCosine - g.minCosine), graph).toBeLessThan(2e-4);
    const graphs = JSON.parse(readFileSync(join(stageEntry(scaled.rec, 'quantize'), 'graphs.json'), 'utf8')) as ExportManifest;
    const holding = graphs.contexts.flatMap((c) => c.graphs).filter((g) => g.stateScales);
    expect(holding.length).toBeGreaterThan(0);
    for (const g of holding) expect(g.stateScales, g.name).toEqual({ [`past_v_${layer}`]: 2 ** -4, [`new_v_${layer}`]: 2 ** -4 });
  }, 600_000);

  it('refuses an equalize line that picks no expert, naming it, before any graph is written', async () => {
    const id = 'tiny-qwen3-equalize';
    writeRecipeVariant(recipes, 'tiny-qwen3', id, (r) => void (r.arch.default.equalize = [{ match: 'layers\\.1\\.experts\\.0' }]));
    const r = await forge(['build', id, '--arch', 'v81', '--until', 'quantize', '--out', join(work, 'equalize-refused')], { FORGE_RECIPES: recipes });
    expect(r.code).toBe(1);
    expect(r.stdout + r.stderr).toMatch(/equalize "layers\\\\\.1\\\\\.experts\\\\\.0" match no expert of this qwen3 model/);
  }, 300_000);
});

describe('bisect on experts, the pure parts', () => {
  it('names the expert whose cases fail, by its cases alone where it ran alone, not the partners that share some of its failures', () => {
    const c = (experts: number[], cosine: number) => ({ prompt: 0, step: 0, output: 'hidden_out', cosine, experts });
    const f = blameExperts([c([3, 0], 0.9), c([3, 1], 0.91), c([0, 1], 0.9999), c([2, 3], 0.8), c([3], 0.7), c([0], 0.99995), c([0, 2], 0.9999)], 0.999);
    // Expert 0 ran alone and held, so it ranks under expert 1, which never ran alone.
    expect(f.map((x) => x.expert)).toEqual([3, 2, 1, 0]);
    expect(f[0]).toMatchObject({ cases: 4, failing: 4, alone: 1, aloneFailing: 1, minCosine: 0.7 });
    // Expert 2 ran with 3 once (a failure) and with 0 once: half its cases fail, none alone.
    expect(f[1]).toMatchObject({ cases: 2, failing: 1, alone: 0 });
  });

  it("rebalances an expert's outlier channel by a power of two and keeps its function", () => {
    const [ch, upCols, downRows] = [8, 4, 6];
    const rnd = (n: number, seed: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(seed * 97 + i * 13.7) * 0.5);
    const up = rnd(ch * upCols, 1), down = rnd(downRows * ch, 2);
    // Channel 5: the up row ÷ 256, the down column × 256 (the planted hostility).
    for (let k = 0; k < upCols; k++) up[5 * upCols + k] /= 256;
    for (let r = 0; r < downRows; r++) down[r * ch + 5] *= 256;
    const x = rnd(upCols, 3), gate = rnd(ch, 4);
    const expert = (u: Float32Array, d: Float32Array) => Array.from({ length: downRows }, (_, r) => {
      let y = 0;
      for (let j = 0; j < ch; j++) {
        let h = 0;
        for (let k = 0; k < upCols; k++) h += u[j * upCols + k] * x[k];
        y += d[r * ch + j] * gate[j] * h;
      }
      return y;
    });
    const before = expert(up, down);
    const [u, d] = [up.slice(), down.slice()];
    expect(equalizeChannels(u, upCols, d, ch)).toBeGreaterThanOrEqual(1);
    const colMax = (m: Float32Array, j: number) => Math.max(...Array.from({ length: downRows }, (_, r) => Math.abs(m[r * ch + j])));
    expect(colMax(d, 5)).toBeLessThan(colMax(down, 5) / 64);
    expect(colMax(d, 5)).toBeLessThan(4 * Math.max(...[0, 1, 2, 3, 4, 6, 7].map((j) => colMax(d, j))));
    const after = expert(u, d);
    for (let r = 0; r < downRows; r++) expect(after[r]).toBeCloseTo(before[r], 6);
    // An expert without outliers is left as it is.
    const [u2, d2] = [rnd(ch * upCols, 5), rnd(downRows * ch, 6)];
    const copy = d2.slice();
    equalizeChannels(u2, upCols, d2, ch);
    expect(Math.max(...Array.from(d2, (v, i) => Math.abs(v / copy[i])))).toBeLessThanOrEqual(2);
  });
});

describe('routing flips, the pure parts', () => {
  const at = { prompt: 0, step: 7, layer: 2 };
  it("ranks the experts as the host's sparsemixer does: the best, then the best of the rest, a tie to the lower index", () => {
    expect(topExperts(Float32Array.of(0.5, 2, -1, 2, 1.5), 2)).toEqual([1, 3]);
    expect(topExperts(Float32Array.of(3, 1, 2, 0), 2)).toEqual([0, 2]);
  });

  it("calls a step a flip when the shipped router's top-2 or their order differs from HF's, with HF's own gap there", () => {
    const hf = Float32Array.of(1.0, 3.0, 0.2, 2.5);
    expect(routingFlip(at, hf, Float32Array.of(1.1, 3.1, 0.1, 2.4), 2)).toBeUndefined();
    // Expert 0 overtakes expert 3 for the second place: HF kept 3 by 1.5 over 0.
    expect(routingFlip(at, hf, Float32Array.of(2.6, 3.0, 0.2, 2.5), 2)).toEqual({ ...at, hf: [1, 3], shipped: [1, 0], hfGap: 1.5 });
    // The same two experts in the other order weigh them differently: a flip too, HF's gap that of its first two.
    expect(routingFlip(at, hf, Float32Array.of(1.0, 2.4, 0.2, 2.5), 2)).toEqual({ ...at, hf: [1, 3], shipped: [3, 1], hfGap: 0.5 });
  });

  it("leads with the flip at the runtime's divergent step, then the earlier ones of that prompt, latest first", () => {
    const flip = (prompt: number, step: number, layer: number) => ({ prompt, step, layer, hf: [0, 1], shipped: [0, 2], hfGap: 0.01 });
    const tally = { decisions: 64, flips: [flip(0, 3, 1), flip(0, 9, 0), flip(0, 12, 3), flip(1, 5, 2), flip(0, 9, 2)] };
    expect(flipsBefore(tally, { prompt: 0, position: 9 }).map((f) => [f.step, f.layer])).toEqual([[9, 0], [9, 2], [3, 1]]);
    expect(flipsBefore(tally, { prompt: 1, position: 4 })).toEqual([]);
    expect(flipsBefore(undefined, { prompt: 0, position: 9 })).toEqual([]);
    expect(routingText(tally, 2)).toBe("the shipped router picks HF's experts at 59/64 decisions; routing flips at prompt 0 step 3 layer 1 (HF's experts 0,1, the shipped router's 0,2; HF's own gap 0.0100), prompt 0 step 9 layer 0 (HF's experts 0,1, the shipped router's 0,2; HF's own gap 0.0100) and 3 more");
    expect(routingText(tally, 0)).toBe("the shipped router picks HF's experts at 59/64 decisions");
  });

  it("tries the flipped layer's router one rung up first, then the whole layer", () => {
    const m = (name: string, shape: number[]) => ({ name, shape, role: 'matmul' as const });
    const tensors = [m('model.layers.2.self_attn.q_proj.weight', [64, 64]), m('model.layers.2.block_sparse_moe.gate.weight', [4, 64]), m('model.layers.2.self_attn.o_proj.weight', [64, 64])];
    const c = routingCandidates(2, tensors, { scheme: 'w4', overrides: [] }, { ...at, hf: [1, 3], shipped: [1, 0], hfGap: 0.02 });
    expect(c.map((x) => x.label)).toEqual(['layer 2 block_sparse_moe.gate w4→w8', 'layer 2 whole (3 matrices)']);
    expect(c[0].overrides[0].why).toMatch(/router flips at step 7 layer 2 \(HF's experts 1,3, the shipped router's 1,0; HF's own gap 0\.0200\)/);
  });

  it('warns under "no fault" where the chained router flipped while the tokens held', () => {
    const w = noFaultWarnings([], 0.999, undefined, [], { decisions: 32, flips: [{ prompt: 1, step: 4, layer: 3, hf: [2, 0], shipped: [2, 1], hfGap: 0.004 }] });
    expect(w).toEqual([{ kind: 'routing', text: "the shipped router picks other experts than HF at 1 of 32 decisions, e.g. prompt 1 step 4 layer 3 (HF's experts 2,0, the shipped router's 2,1; HF's own gap 0.00400): the tokens held, and it is where routing would flip one" }]);
    expect(noFaultWarnings([], 0.999, undefined, [], { decisions: 32, flips: [] })).toEqual([]);
  });
});
