// `forge nightly` end to end on the shipped twin matrix, through the CLI as CI would run it: green
// the first time, all cached and no regression the second, and a planted regression (a recipe copy
// moved from w8 to w4) flagged with its build, figure, before and after. The tests' stage cache is
// private to the run (global-setup); this file runs last (test/sequencer.ts), so the first nightly
// finds the stages other files built for the same twins, as a farm nightly on a warm cache does (a
// filtered run of this file alone builds them cold).
import { describe, it, expect, beforeAll } from 'vitest';
import { cpSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { pathToFileURL } from 'node:url';
import { forge, lastJson } from './helpers/forge-cli.js';
import { dumpDom } from '../src/toolchain/chromium.js';
import { formatFigure } from '../src/nightly/compare.js';
import type { Nightly } from '../src/nightly/summary.js';
import { W4_MIN_COSINE } from '../src/recipe/schema.js';

let work: string;
let out: string;
let first: Nightly;
beforeAll(() => {
  work = mkdtempSync(join(tmpdir(), 'forge-nightly-'));
  out = join(work, 'nightly');
});

const COSINE = 'oracle quantize/shard0.decode min cosine';

async function dom(html: string, profile: string): Promise<string> {
  return dumpDom(pathToFileURL(html).href, join(work, profile));
}

describe('forge nightly', () => {
  it('runs the twin matrix green; the second run is all cached and reports no regression', async () => {
    const a = await forge(['nightly', '--matrix', 'nightly/twins.json', '--out', out, '--json']);
    expect(a.code, a.stderr.slice(-3000)).toBe(0);
    first = lastJson(a.stdout);
    expect(first.builds.map((b) => b.id)).toEqual(['tiny-qwen3/v81', 'tiny-qwen3/v79', 'tiny-qwen3.5/v81']);
    expect(first.comparedWith).toBeNull();
    for (const b of first.builds) {
      expect(b.ok, `${b.id}: ${b.error}`).toBe(true);
      // The figures a nightly tracks, read from each build's own run record.
      const record = JSON.parse(readFileSync(b.runRecord!, 'utf8'));
      expect(b.figures[COSINE].value).toBe(record.gates.oracle.graphs[`quantize:w8/shard0.decode`].minCosine);
      const recipe = JSON.parse(readFileSync(join('recipes', b.recipe, 'recipe.json'), 'utf8'));
      expect(b.figures[COSINE]).toMatchObject({ kind: 'cosine', threshold: recipe.gates.oracle.w8MinCosine, note: 'w8' });
      expect(b.figures['parity quantize matched']).toMatchObject({ value: record.gates.parity.variants.quantize.total, total: record.gates.parity.variants.quantize.total });
      for (const c of record.summaries.compile.contexts) {
        expect(b.figures[`context ${c.name} bytes`].value).toBe(c.bytes);
        expect(b.figures[`context ${c.name} compile seconds`].value).toBe(c.compileSeconds);
      }
      expect(b.figures['bundle bytes'].value).toBe(record.summaries.bundle.bytes);
      if (record.gates.emulation?.ran) expect(b.figures['simulator parity matched'].value).toBe(record.gates.emulation.parity.matched);
      // The record's versions, and the QAIRT release inside the onnxruntime-qnn wheel that compiled.
      expect(b.tools).toEqual({ ...record.tools, qairt: record.summaries.compile.qairt });
      expect(b.tools.qairt).toMatch(/^2\.\d+/);
    }
    console.log(`[measured] first nightly: ${first.seconds.toFixed(1)} s; ${first.builds.map((b) => `${b.id} ${b.seconds.toFixed(1)} s`).join(', ')}`);

    const b = await forge(['nightly', '--matrix', 'nightly/twins.json', '--out', out, '--json']);
    expect(b.code, b.stderr.slice(-3000)).toBe(0);
    const second: Nightly = lastJson(b.stdout);
    expect(second.comparedWith).toBe(join(out, 'nightly.json'));
    for (const s of second.builds) expect(s.stages.filter((x) => x.status !== 'cached'), s.id).toEqual([]);
    expect(second.regressions).toBe(0);
    for (const s of second.builds) {
      for (const [name, f] of Object.entries(s.figures)) if (f.kind !== 'seconds' && f.kind !== 'ms') expect(f, `${s.id} ${name}`).toEqual(first.builds.find((x) => x.id === s.id)!.figures[name]);
    }
    console.log(`[measured] second nightly (all cached): ${second.seconds.toFixed(1)} s`);
    expect(readFileSync(join(out, 'report.md'), 'utf8')).toContain('**ok: 3 builds, no regression**');
    expect(readdirSync(join(out, 'history'))).toHaveLength(2);

    const html = await dom(join(out, 'report.html'), 'chromium-a');
    expect(/<p id="result" class="ok">([^<]*)<\/p>/.exec(html)?.[1]).toBe('ok: 3 builds, no regression');
    expect(html).toContain('<p id="regressions">None.</p>');
    // One trend plot per figure row, each with a point per stored nightly.
    const figures = /<table id="figures">([\s\S]*?)<\/table>/.exec(html)![1];
    const rows = figures.match(/<tr>[\s\S]*?<\/tr>/g)!.slice(1);
    expect(rows.length).toBeGreaterThan(3 * 5);
    for (const r of rows) expect(r.match(/<circle/g), r.slice(0, 200)).toHaveLength(2);
  }, 2_400_000); // up to three cold twin builds (native runtime, compiles, the simulator gate) on a shared 2-core machine when run alone, then a cached pass

  it('a planted regression (a recipe copy moved to w4) exits non-zero and names the build, the figure, before and after', async () => {
    expect(first, 'needs the first test').toBeDefined();
    const recipes = join(work, 'recipes-w4');
    cpSync('recipes', recipes, { recursive: true });
    const file = join(recipes, 'tiny-qwen3', 'recipe.json');
    const r = JSON.parse(readFileSync(file, 'utf8'));
    r.arch.default.quant = 'w4';
    r.arch.default.lmHead.quant = 'w4'; // the suite's one tiny-qwen3 build at W4, lm-head too, every gate run
    writeFileSync(file, JSON.stringify(r, null, 2));
    const matrix = join(work, 'one.json');
    writeFileSync(matrix, JSON.stringify({ builds: [{ recipe: 'tiny-qwen3', arch: 'v81' }] }));

    const run = await forge(['nightly', '--matrix', matrix, '--out', join(work, 'nightly-w4'), '--compare', join(out, 'nightly.json'), '--json'], { FORGE_RECIPES: recipes });
    expect(run.code, run.stderr.slice(-3000)).toBe(1);
    const n: Nightly = lastJson(run.stdout);
    const [after] = n.builds;
    // The build itself is green: W4 passes its own (lower) gate; the nightly is what sees the fall.
    expect(after.ok, after.error).toBe(true);
    const before = first.builds.find((b) => b.id === 'tiny-qwen3/v81')!.figures[COSINE];
    expect(after.figures[COSINE]).toMatchObject({ note: 'w4', threshold: r.gates.oracle.w4MinCosine ?? W4_MIN_COSINE });
    expect(before.value - after.figures[COSINE].value).toBeGreaterThan(n.thresholds.maxCosineDrop);
    console.log(`[measured] planted regression: tiny-qwen3/v81 ${COSINE} ${before.value} → ${after.figures[COSINE].value}; nightly ${n.seconds.toFixed(1)} s`);

    const md = readFileSync(join(work, 'nightly-w4', 'report.md'), 'utf8');
    const row = `| tiny-qwen3/v81 | ${COSINE} | ${formatFigure(before)} | ${formatFigure(after.figures[COSINE])} | REGRESSION: fell by`;
    expect(md).toContain(row);
    expect(md).toContain('w8 → w4');
    expect(md).toContain('Not in this matrix any more (not compared): tiny-qwen3/v79, tiny-qwen3.5/v81.');
    expect(run.stderr).toContain(`REGRESSION tiny-qwen3/v81 ${COSINE}: ${formatFigure(before)} → ${formatFigure(after.figures[COSINE])}`);

    const html = await dom(join(work, 'nightly-w4', 'report.html'), 'chromium-b');
    expect(/<p id="result" class="bad">([^<]*)<\/p>/.exec(html)?.[1]).toMatch(/^REGRESSION: \d+ regressed figures?$/);
    const regressions = /<table id="regressions">([\s\S]*?)<\/table>/.exec(html)![1];
    expect(regressions).toContain(`<tr class="regression"><td>tiny-qwen3/v81</td><td>${COSINE}</td><td>${formatFigure(before)}</td><td>${formatFigure(after.figures[COSINE])}</td>`);
  }, 900_000); // one rebuild from quantize on (oracle, compile, parity, simulator) in w4

  it('a cosine below the recipe threshold fails the build, and the nightly says so', async () => {
    expect(first, 'needs the first test').toBeDefined();
    const recipes = join(work, 'recipes-strict');
    cpSync('recipes', recipes, { recursive: true });
    const file = join(recipes, 'tiny-qwen3', 'recipe.json');
    const r = JSON.parse(readFileSync(file, 'utf8'));
    // Above every W8 cosine the twin measures (its figure is in the first nightly), so the gate fails.
    const cos = first.builds.find((b) => b.id === 'tiny-qwen3/v81')!.figures[COSINE].value;
    r.gates.oracle.w8MinCosine = Number(((1 + cos) / 2).toFixed(7));
    writeFileSync(file, JSON.stringify(r, null, 2));
    const matrix = join(work, 'one-strict.json');
    writeFileSync(matrix, JSON.stringify({ builds: [{ recipe: 'tiny-qwen3', arch: 'v81' }] }));

    const run = await forge(['nightly', '--matrix', matrix, '--out', join(work, 'nightly-strict'), '--compare', join(out, 'nightly.json'), '--json'], { FORGE_RECIPES: recipes });
    expect(run.code, run.stderr.slice(-3000)).toBe(1);
    const n: Nightly = lastJson(run.stdout);
    expect(n.builds[0]).toMatchObject({ ok: false, status: 'failed' });
    const md = readFileSync(join(work, 'nightly-strict', 'report.md'), 'utf8');
    expect(md).toMatch(/\| tiny-qwen3\/v81 \| build \| ok \| failed: oracle: [^|]* \| REGRESSION: the build failed \|/);
    expect(md).toContain(`| tiny-qwen3/v81 | ${COSINE} | ${formatFigure(first.builds[0].figures[COSINE])} | ${formatFigure(first.builds[0].figures[COSINE])} | REGRESSION: below the recipe threshold ${r.gates.oracle.w8MinCosine} |`);
  }, 600_000); // the oracle gate re-runs with the new threshold; nothing after it runs
});
