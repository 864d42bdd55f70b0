// bisect.html from a bisect result made here (nothing is built): the verdict box first, tables that
// fit 1280 px, fixes by tensor names, and the page as a person sees it in headless Chromium.
import { describe, expect, it } from 'vitest';
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { bisectHtml, summaryText } from '../src/bisect/report.js';
import { patternText, verdictBox } from '../src/bisect/verdict-box.js';
import { failingBisect, LONG_NODE } from './fixtures/bisect-result.js';
import { jsonCells, pageLayout } from './helpers/page-layout.js';

const tmp = () => mkdtempSync(join(tmpdir(), 'forge-bisect-report-'));
const boxOf = (dom: string) => /<section id="verdict"[^>]*>([\s\S]*?)<\/section>/.exec(dom)?.[1] ?? '';
const row = (box: string, name: string) => new RegExp(`<tr><th>${name}</th><td>([^<]*)</td></tr>`).exec(box)?.[1];

describe('bisect.html', () => {
  it('opens with the verdict box, above the fold, and fits 1280 px with a long op name (in Chromium)', async () => {
    const page = await pageLayout(bisectHtml(failingBisect()), tmp(), '#verdict');
    expect(page.dom).toMatch(/<\/h1>\s*<section id="verdict" class="card fixed">/);
    expect(page.bottom).toBeGreaterThan(0);
    expect(page.bottom).toBeLessThanOrEqual(900);
    expect(page.scrollWidth).toBeLessThanOrEqual(1280);
    const box = boxOf(page.dom);
    expect(box).toContain('<span class="verdict">FIX FOUND</span> tiny-qwen3-hostile-w4 for v81 on host: link quantization, layer 2');
    expect(row(box, 'link')).toBe('quantization: the shipped precision of the weights');
    expect(row(box, 'first left at')).toBe('quantize:w4 shard0.decode layer 3 new_k_3 (k cache row): cosine 0.84078 &lt; 0.85, first at prompt 1 step 31');
    expect(row(box, 'layer')).toBe('2 (where the damage is done; the gate is first left at layer 3, which carries it)');
    expect(row(box, 'op')).toBe(`${LONG_NODE} (MatMulNBits, multiplying self_attn.o_proj): cosine 0.74595 from inputs at 0.99061`);
    expect(row(box, 'proposed fix')).toBe('model.layers.2.self_attn.o_proj.weight: w4 → w8 (3.3 kB of weights added)');
    expect(row(box, 'verified')).toBe('yes, rebuilt with the fix, the oracle gate holds: min cosine 0.86032 ≥ 0.85 (2 of 3 candidates pass)');
    expect(row(box, 'recipe')).toBe('not changed: forge bisect --apply writes the fix into it');
    // The op tables still name every op in full (they wrap, they are not cut).
    expect(page.cells).toContain(LONG_NODE);
    expect(jsonCells(page.cells)).toEqual([]);
  });

  it('shows fixes by the tensors they change, never by the recipe\'s escaped patterns', () => {
    const html = bisectHtml(failingBisect());
    expect(html).not.toContain('model\\.layers');
    expect(html).not.toMatch(/\{"match"/);
    const fix = /<h2 id="override">[\s\S]*?<\/table>/.exec(html)?.[0] ?? '';
    expect(fix).toContain('<td class="name">model.layers.2.self_attn.o_proj.weight</td><td>w4</td><td class="name">w8</td>');
    const fixes = /<h2 id="fixes">[\s\S]*?<\/table>/.exec(html)?.[0] ?? '';
    // Ranked among those that pass; the one that fails has no rank and says where it still fails.
    expect(fixes).toContain('<td>1</td><td class="name">layer 2 self_attn.o_proj w4→w8</td><td class="name">model.layers.2.self_attn.o_proj.weight: w4 → w8</td>');
    expect(fixes).toContain('<td>2</td><td class="name">layer 2 mlp.down_proj w4→w8</td>');
    expect(fixes).toContain('<td>-</td><td class="name">layer 2 self_attn.q_proj w4→w8</td>');
    expect(patternText('layers\\.2/self_attn\\.q_norm')).toBe('layers.2/self_attn.q_norm');
    // The terminal's summary names the fix the same way.
    const summary = summaryText(failingBisect());
    expect(summary).toContain('the fix:     model.layers.2.self_attn.o_proj.weight: w4 → w8 (--apply writes it into the recipe)');
    expect(summary).not.toMatch(/\{"match"/);
  });

  it('sums up a fix of whole layers in the box by its label and rungs, each matrix named in the fix table below', () => {
    const names = [0, 5].flatMap((l) => ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'up_proj'].map((m) => `model.layers.${l}.${m}.weight`));
    const whole = { ...failingBisect().trials[0], label: 'layers 0 and 5 whole (10 matrices), 2 rungs up', layer: undefined, tensors: names.map((name) => ({ name, from: 'w4' as const, to: 'fp16' as const })), addedBytes: 147840, ok: true };
    const r = { ...failingBisect(), trials: [whole], fixes: [whole], chosen: whole };
    expect(verdictBox(r).rows).toContainEqual(['proposed fix', 'layers 0 and 5 whole (10 matrices), 2 rungs up: 10 matrices w4 → fp16, each named under "The fix for the recipe" (147.8 kB of weights added)']);
    const fix = /<h2 id="override">[\s\S]*?<\/table>/.exec(bisectHtml(r))?.[0] ?? '';
    for (const name of names) expect(fix).toContain(`<td class="name">${name}</td>`);
  });

  it('keeps the long finding below the box and escapes what it did not write', () => {
    const r = failingBisect();
    r.recipe = 'x<script>alert(1)</script>';
    const html = bisectHtml(r);
    expect(html).not.toContain('<script>alert');
    expect(html).toContain('x&lt;script&gt;alert(1)&lt;/script&gt; for v81');
    expect(html).toContain('Grüße aus München! &lt;b&gt;not bold&lt;/b&gt;');
    expect(html).toMatch(/<\/section>\s*<p id="finding"><b>The finding in full<\/b> \(37\.3 s\): link quantization: /);
  });

  it('says what is not known: no fix found, nothing to fix', () => {
    const unfixed = { ...failingBisect(), verdict: 'unfixed' as const, trials: [failingBisect().trials[0]], fixes: [], chosen: undefined };
    const box = verdictBox(unfixed);
    expect(box).toMatchObject({ word: 'NOT FIXED', tone: 'fail' });
    expect(box.rows).toContainEqual(['proposed fix', 'none found']);
    expect(box.rows).toContainEqual(['verified', 'no: none of 1 candidates passes']);
    expect(box.rows.map(([k]) => k)).not.toContain('recipe');
    const healthy = { ...failingBisect(), verdict: 'no-fault' as const, message: 'no fault: every graph within tolerance (w4 ≥ 0.85)', link: undefined, fault: undefined, steps: undefined, layer: undefined, quantOp: undefined, trials: [], fixes: [], chosen: undefined };
    expect(verdictBox(healthy)).toEqual({ word: 'NO FAULT', tone: 'pass', headline: 'tiny-qwen3-hostile-w4 for v81 on host: every link tested follows HF', rows: [['checked', 'every graph within tolerance (w4 ≥ 0.85)']] });
    // A runtime run given with --from can leave HF where every link rebuilt follows it: the box says so.
    const run = { runTokens: 8, hfTokens: 32, compared: 8, first: { index: 4, step: 9, run: 368, hf: { token: 311, margin: 6.1517, runnerUp: 368 } } };
    const fromRun = verdictBox({ ...healthy, run } as typeof healthy);
    expect(fromRun).toMatchObject({ word: 'NO FAULT', tone: 'fixed', headline: 'tiny-qwen3-hostile-w4 for v81 on host: every link tested follows HF, the run given does not' });
    expect(fromRun.rows[0]).toEqual(['the run', "the run leaves HF's greedy continuation at generated token 4 (step 9): HF picks 311 by 6.1517 over 368, the run picked 368"]);
    // What still deserves a look: a row each, not a run-on verdict.
    const warnings = [{ kind: 'weak-layer' as const, text: 'layer 3 keeps 0.85795, 0.00795 above the 0.85 gate: it passes by a hair' }, { kind: 'routing' as const, text: 'the shipped router picks other experts than HF at 8 of 1080 decisions' }];
    const watched = verdictBox({ ...healthy, warnings, message: `${healthy.message}; worth a look: ${warnings.map((w) => w.text).join('; ')}` });
    expect(watched.rows).toEqual([['checked', 'every graph within tolerance (w4 ≥ 0.85)'], ...warnings.map((w) => ['worth a look', w.text])]);
  });
});
