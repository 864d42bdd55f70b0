// forge bisect (issue 17, step 1: host target, quantization faults) on twins: a planted fault — the
// tiny-qwen3 twin with layer 2 made W4-hostile (test/helpers/w4-hostile.ts: its function unchanged,
// one outlier per W4 block of o_proj and down_proj) built at w4 — is found, named (layer, link) and
// fixed by a single matrix at w8, which --apply writes into the recipe and a plain build then passes,
// and the op inside the layer where the cosine drops is that kind of matrix's matmul;
// several layers each failing alone (tiny-qwen3.5's) are all named and fixed together; a layer
// passing by a hair is "no fault" with that layer named as worth a look; a healthy twin is reported
// as such from the cache. Plus the pure parts: the first miss in model
// order and the candidate overrides with their bytes.
import { describe, it, expect, beforeAll } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { pathToFileURL } from 'node:url';
import { forge, lastJson } from './helpers/forge-cli.js';
import { makeW4Hostile } from './helpers/w4-hostile.js';
import { dumpDom } from '../src/toolchain/chromium.js';
import { firstFailedRow, locateMiss } from '../src/bisect/locate.js';
import { candidates, shortName, together } from '../src/bisect/fixes.js';
import { applyOverrides } from '../src/bisect/apply.js';
import { PrecisionChooser } from '../src/quant/precision.js';
import { storedBytes } from '../src/quant/bytes.js';
import type { BisectResult } from '../src/bisect/run.js';
import type { OracleResult, OracleRow } from '../src/gates/oracle.js';
import type { TensorSpec } from '../src/families/types.js';
import { recipeSandbox, writeRecipeVariant } from './helpers/recipe-sandbox.js';
import { twinDir } from './helpers/twin.js';

const HOSTILE_LAYER = 2;

let work: string;
let recipes: string;
beforeAll(() => void ({ work, recipes } = recipeSandbox('forge-bisect-')));

const lastBisect = (stdout: string) => lastJson(stdout) as BisectResult;

/** Recipe `base` as `id` with `checkpoint` at plain w4 (the recipe's own w4 threshold, gates.oracle.w4MinCosine, default 0.85), bisected into `out`. */
async function bisectAtW4(base: string, id: string, checkpoint: string, out: string, flags: string[] = []): Promise<{ recipeFile: string; b: BisectResult }> {
  const recipeFile = writeRecipeVariant(recipes, base, id, (r) => {
    r.source = { kind: 'local', path: checkpoint };
    r.arch.default.quant = 'w4';
  });
  const run = await forge(['bisect', id, '--arch', 'v81', ...flags, '--json', '--out', out], { FORGE_RECIPES: recipes });
  expect(run.code, run.stderr).toBe(0);
  expect(run.stderr).not.toMatch(/\n\s+at /);
  return { recipeFile, b: lastBisect(run.stdout) };
}

describe('forge bisect', () => {
  it('finds the W4-hostile layer of a w4 twin, names the link, and the single-matrix W8 fix it applies makes the build pass', async () => {
    const hostile = join(work, 'hostile');
    await makeW4Hostile(await twinDir('qwen3'), hostile, HOSTILE_LAYER);
    const id = 'tiny-qwen3-hostile-w4';
    const out = join(work, 'bisect-hostile');
    const { recipeFile, b } = await bisectAtW4('tiny-qwen3', id, hostile, out, ['--apply']);
    expect(b.verdict).toBe('fixed');
    // fp32 holds, the shipped w4 graphs do not: the quantization link.
    expect(b.fault).toMatchObject({ link: 'quantization', variant: 'quantize:w4' });
    expect(b.fault!.cosine).toBeLessThan(b.thresholds.shipped);
    expect(b.layers.every((l) => l.fp32! >= b.thresholds.fp32)).toBe(true);
    // The first traced step under tolerance is one the gate saw (its worst case is at or after it).
    expect(b.steps!.first!.cosine).toBeLessThan(b.thresholds.shipped);
    expect(b.steps!.failing).toBeGreaterThan(0);
    // The layer that does the damage: the hostile one, whatever later layer first crosses the threshold.
    expect(b.layer).toBe(HOSTILE_LAYER);
    expect(b.fault!.layer).toBeGreaterThanOrEqual(HOSTILE_LAYER);
    const worstAlone = [...b.alone!].sort((x, y) => x.cosine - y.cosine)[0];
    expect(worstAlone.layer).toBe(HOSTILE_LAYER);
    // The fix: one of the two matrices the helper made hostile, at w8, alone; every restoring fix is one the gate passed, cheapest first.
    const chosen = b.chosen!;
    expect(chosen.tensors).toHaveLength(1);
    expect(['self_attn.o_proj', 'mlp.down_proj']).toContain(shortName(chosen.tensors[0].name, HOSTILE_LAYER));
    expect(chosen.tensors[0]).toMatchObject({ from: 'w4', to: 'w8' });
    expect(chosen.ok).toBe(true);
    expect(chosen.addedBytes).toBeGreaterThan(0);
    expect(b.fixes.map((f) => f.addedBytes)).toEqual([...b.fixes.map((f) => f.addedBytes)].sort((x, y) => x - y));
    for (const t of b.trials) expect(t.tensors.every((x) => x.name.startsWith(`model.layers.${HOSTILE_LAYER}.`))).toBe(true);
    // The op: layer 2 alone at fp32 and w4, op by op; where the cosine drops is the matmul of a
    // hostile matrix, its output well under its input's, and promoting that matrix alone is a fix.
    const q = b.quantOp!;
    expect(q, b.quantOpError).toBeDefined();
    expect(q).toMatchObject({ layer: HOSTILE_LAYER, scheme: 'w4', unpaired: 0 });
    expect(q.cases).toBeGreaterThan(0);
    const op = q.drop!;
    expect(op.layer).toBe(HOSTILE_LAYER);
    expect(['MatMulNBits', 'Gemm', 'MatMul']).toContain(op.op);
    expect(['self_attn.o_proj', 'mlp.down_proj']).toContain(shortName(op.matrix!, HOSTILE_LAYER));
    expect(op.cosine).toBeLessThan(op.inputsCosine - 0.1);
    // Every other op loses less of its own.
    for (const o of q.ops) if (o.value !== op.value) expect(o.inputsCosine - o.cosine).toBeLessThan(op.inputsCosine - op.cosine);
    expect(b.fixes.some((f) => f.tensors.length === 1 && f.tensors[0].name === op.matrix)).toBe(true);
    expect(b.message).toContain(`op ${op.node} (${shortName(op.matrix!, HOSTILE_LAYER)}, ${op.op}) cosine ${op.cosine.toFixed(5)} from inputs at ${op.inputsCosine.toFixed(5)}`);
    console.log(`[measured] bisect on the W4-hostile twin: first miss ${b.fault!.graph} layer ${b.fault!.layer} ${b.fault!.output} ${b.fault!.cosine.toFixed(5)} < ${b.thresholds.shipped}, first at prompt ${b.steps!.first!.prompt} step ${b.steps!.first!.step} (${b.steps!.failing}/${b.steps!.cases.length} steps under); layers alone ${b.alone!.map((a) => `${a.layer}:${a.cosine.toFixed(5)}`).join(' ')}; fixes ${b.trials.map((t) => `${t.label} ${t.ok ? 'ok' : 'no'} ${t.minCosine?.toFixed(5)} +${t.addedBytes} B`).join('; ')}; op ${op.node} (${op.matrix}) ${op.cosine.toFixed(5)} from ${op.inputsCosine.toFixed(5)}, first under ${q.firstUnder?.node ?? '-'}, ${q.ops.length} ops × ${q.cases} cases in ${q.seconds.toFixed(1)} s; ${b.seconds.toFixed(1)} s`);

    // --apply wrote the chosen override into the recipe, first in the list; the plain build now passes the gate.
    expect(b.applied!.file).toBe(recipeFile);
    const applied = JSON.parse(readFileSync(recipeFile, 'utf8'));
    expect(applied.arch.default.overrides[0]).toEqual(chosen.overrides[0]);
    const rebuilt = await forge(['build', id, '--arch', 'v81', '--until', 'oracle', '--json', '--out', join(work, 'rebuilt')], { FORGE_RECIPES: recipes });
    const rec = lastJson(rebuilt.stdout);
    expect(rec.gates.oracle.ok, rebuilt.stderr).toBe(true);
    // The line written is the one gated: the rebuild finds the trial's quantize export and gate in the cache.
    expect(rec.stages.find((s: { name: string }) => s.name === 'oracle').status).toBe('cached');
    // Bisect again: the fixed recipe passes, nothing left to find.
    const again = await forge(['bisect', id, '--arch', 'v81', '--apply', '--out', join(work, 'bisect-again')], { FORGE_RECIPES: recipes });
    expect(again.code, again.stderr).toBe(0);
    expect(again.stdout).toMatch(/no fault: every graph within tolerance/);

    // The report files, and the HTML as Chromium renders it.
    for (const f of ['bisect.json', 'bisect.html', 'summary.txt']) expect(existsSync(join(out, f)), f).toBe(true);
    const dom = await dumpDom(pathToFileURL(join(out, 'bisect.html')).href, join(work, 'chromium-profile'));
    expect(dom).toContain('link quantization');
    expect(dom).toMatch(/<svg[^>]*aria-label="cosine per traced step"/);
    expect(dom).toContain(chosen.label);
    expect(dom).toContain(`Op by op: layer ${HOSTILE_LAYER}, fp32 vs w4`);
    expect(dom).toContain(op.node);
  }, 900_000); // the twin (cold cache ~50 s), its w4 build through the oracle, 7 single-matrix trial builds (~10–15 s each here), the rebuild

  it('names every layer that fails alone, not only the first, and finds and verifies a fix of them together (Qwen3.5)', async () => {
    // tiny-qwen3.5's linear-attention layers 0 and 5, their MLPs made W4-hostile (×256): each fails the
    // w4 threshold alone, so no fix of one passes, and one rung up (w8) is not enough for either.
    const mid = join(work, 'hostile-0');
    const both = join(work, 'hostile-0-5');
    await makeW4Hostile(await twinDir('qwen3_5'), mid, 0, 256);
    await makeW4Hostile(mid, both, 5, 256);
    const { b } = await bisectAtW4('tiny-qwen3.5', 'tiny-qwen3.5-two-hostile', both, join(work, 'bisect-two'));
    expect(b.faulty).toEqual([0, 5]);
    for (const l of b.faulty!) expect(b.alone!.find((a) => a.layer === l)!.cosine).toBeLessThan(b.thresholds.shipped);
    expect(b.message).toMatch(/layers 0, 5 each fail alone \(0: 0\.\d+, 5: 0\.\d+ < 0\.85\)/);
    // Every trial moves matrices of both layers; one rung up fails, two rungs restore the gate.
    for (const t of b.trials) expect(new Set(t.tensors.map((x) => /layers\.(\d+)\./.exec(x.name)![1]))).toEqual(new Set(['0', '5']));
    expect(b.verdict).toBe('fixed');
    expect(b.chosen!.ok).toBe(true);
    expect(b.chosen!.tensors.every((x) => x.from === 'w4' && x.to === 'fp16')).toBe(true);
    expect(b.trials.filter((t) => !t.ok).length).toBeGreaterThan(0);
    // The op inside the layer named: its down_proj, whose W4 blocks the outliers wreck.
    expect(b.quantOp!.drop!.matrix).toMatch(/layers\.0\.mlp\.down_proj\.weight$/);
    console.log(`[measured] bisect on tiny-qwen3.5 with layers 0 and 5 W4-hostile: alone ${b.alone!.map((a) => `${a.layer}:${a.cosine.toFixed(5)}`).join(' ')}; ${b.trials.map((t) => `${t.label} ${t.ok ? 'ok' : 'no'} ${t.minCosine?.toFixed(5)} +${t.addedBytes} B`).join('; ')}; ${b.seconds.toFixed(1)} s`);
  }, 900_000);

  it('says "no fault" on a twin whose W4-hostile last layer still passes, and names that layer as worth a look', async () => {
    // tiny-qwen3's layer 3 made W4-hostile (×16): along the chain it keeps ~0.86 against the 0.85 gate.
    const weak = join(work, 'weak-3');
    await makeW4Hostile(await twinDir('qwen3'), weak, 3);
    const { b } = await bisectAtW4('tiny-qwen3', 'tiny-qwen3-weak-w4', weak, join(work, 'bisect-weak'));
    expect(b.verdict).toBe('no-fault');
    const weakest = [...b.layers].sort((x, y) => x.shipped! - y.shipped!)[0];
    expect(weakest.layer).toBe(3);
    expect(weakest.shipped!).toBeGreaterThanOrEqual(b.thresholds.shipped);
    const w = b.warnings!.find((x) => x.kind === 'weak-layer')!;
    expect(w.text).toMatch(/^layer 3 keeps 0\.\d{5}, 0\.\d{5} above the 0\.85 gate/);
    expect(b.message).toContain(`worth a look: ${w.text}`);
    console.log(`[measured] bisect on tiny-qwen3 with a weak-but-passing layer 3 at w4: ${b.warnings!.map((x) => x.text).join('; ')}; ${b.seconds.toFixed(1)} s`);
  }, 900_000);

  it('says "no fault" on a healthy twin, from the cache', async () => {
    const args = ['bisect', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', join(work, 'bisect-healthy')];
    const first = await forge(args, { FORGE_RECIPES: recipes }); // may build the twin through the oracle
    expect(first.code, first.stderr).toBe(0);
    const t = performance.now();
    const run = await forge(args, { FORGE_RECIPES: recipes });
    const seconds = (performance.now() - t) / 1000;
    expect(run.code, run.stderr).toBe(0);
    const b = lastBisect(run.stdout);
    expect(b.verdict).toBe('no-fault');
    expect(b.message).toMatch(/^no fault: every graph within tolerance/);
    expect(b.build.stages.every((s) => s.status === 'cached')).toBe(true);
    expect(b.trials).toEqual([]);
    const file = JSON.parse(readFileSync(join(work, 'bisect-healthy', 'bisect.json'), 'utf8')) as BisectResult;
    expect(file.verdict).toBe('no-fault');
    console.log(`[measured] bisect on healthy tiny-qwen3 (w8), everything cached: ${seconds.toFixed(1)} s for the command, ${b.seconds.toFixed(1)} s inside it`);
  }, 900_000); // the first run also builds through the parity gate (the native runtime, cold)

  it('refuses --target adb without the phone (test/bisect-runtime.test.ts runs it against a fake adb)', async () => {
    const r = await forge(['bisect', 'tiny-qwen3', '--arch', 'v81', '--target', 'adb'], { FORGE_RECIPES: recipes });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/--target adb needs --serial, --runner and --device-libs/);
  });
});

describe('bisect, the pure parts', () => {
  const row = (variant: string, layer: string, output: string, minCosine: number, ok: boolean): OracleRow => ({ variant, graph: 'shard0.decode', layer, output, what: '', minCosine, maxAbs: 0, worst: 'w', ok });

  it('takes the first failed row in model order, fp32 before the shipped graphs', () => {
    const rows = [row('quantize:w4', '-', 'logits', 0.5, false), row('quantize:w4', '3', 'new_k_3', 0.8, false), row('quantize:w4', '10', 'h.11', 0.7, false), row('export:fp32', '5', 'h.6', 0.99, true)];
    expect(firstFailedRow(rows, 'quantize')!.layer).toBe('3');
    const result = { ok: false, rows, graphs: {}, logitError: {}, logitChain: {} } as OracleResult;
    expect(locateMiss(result, { fp32: 0.99999, shipped: 0.85 })).toMatchObject({ link: 'quantization', layer: 3, output: 'new_k_3' });
    const fp32Bad = { ...result, rows: [...rows, row('export:fp32', '7', 'h.8', 0.9, false)] };
    expect(locateMiss(fp32Bad, { fp32: 0.99999, shipped: 0.85 })).toMatchObject({ link: 'export', layer: 7 });
    expect(locateMiss({ ...result, ok: true }, { fp32: 0.99999, shipped: 0.85 })).toBeUndefined();
  });

  it('makes one candidate per matrix one rung up, with the bytes it adds, as override lines that match it alone', () => {
    const t = (n: string): TensorSpec => ({ name: `model.layers.4.${n}.weight`, shape: [64, 64], role: 'matmul' });
    const ts: TensorSpec[] = [t('self_attn.q_proj'), t('mlp.down_proj'), { name: 'model.layers.4.input_layernorm.weight', shape: [64], role: 'small' }];
    // down_proj already pinned at w8 by the recipe: its next rung is fp16.
    const pins = [{ match: 'model\\.layers\\.4\\.mlp\\.down_proj\\.weight', quant: 'w8' as const }];
    const { single, whole } = candidates(4, ts, 'w4', pins);
    expect(single.map((c) => c.label)).toEqual(['layer 4 self_attn.q_proj w4→w8', 'layer 4 mlp.down_proj w8→fp16']);
    expect(single[0].addedBytes).toBe(storedBytes(ts[0], 'w8') - storedBytes(ts[0], 'w4'));
    expect(single[1].addedBytes).toBe(storedBytes(ts[1], 'fp16') - storedBytes(ts[1], 'w8'));
    // Put first, each line pins its matrices and nothing else.
    const chooser = new PrecisionChooser([...whole!.overrides, ...pins]);
    expect(chooser.choose(ts[0].name, 'w4').scheme).toBe('w8');
    expect(chooser.choose(ts[1].name, 'w4').scheme).toBe('fp16');
    expect(chooser.choose('model.layers.14.self_attn.q_proj.weight', 'w4').scheme).toBe('w4');
    expect(whole!.addedBytes).toBe(single[0].addedBytes + single[1].addedBytes);
  });

  it('puts several layers\' whole matrices together, one rung up or more, each matrix from where it ships', () => {
    const t = (l: number, n: string): TensorSpec => ({ name: `model.layers.${l}.${n}.weight`, shape: [64, 64], role: 'matmul' });
    const layers = [0, 3].map((l) => ({ layer: l, tensors: [t(l, 'self_attn.o_proj'), t(l, 'mlp.down_proj')] }));
    const pins = [{ match: 'model\\.layers\\.3\\.mlp\\.down_proj\\.weight', quant: 'fp16' as const }];
    const one = together(layers, 'w4', pins)!;
    expect(one.label).toBe('layers 0 and 3 whole (4 matrices)');
    expect(one.layer).toBeUndefined();
    expect(one.tensors.map((x) => `${x.name.replace(/^model\.layers\./, '')} ${x.from}→${x.to}`)).toEqual(['0.self_attn.o_proj.weight w4→w8', '0.mlp.down_proj.weight w4→w8', '3.self_attn.o_proj.weight w4→w8', '3.mlp.down_proj.weight fp16→fp32']);
    const two = together(layers, 'w4', pins, undefined, '', 2)!;
    expect(two.label).toBe('layers 0 and 3 whole (4 matrices), 2 rungs up');
    expect(two.tensors.map((x) => x.to)).toEqual(['fp16', 'fp16', 'fp16', 'fp32']); // fp32 is the top: no rung past it
    const chooser = new PrecisionChooser([...two.overrides, ...pins]);
    expect(layers.flatMap((l) => l.tensors).map((x) => chooser.choose(x.name, 'w4').scheme)).toEqual(['fp16', 'fp16', 'fp16', 'fp32']);
    // One layer is not "together".
    expect(together(layers.slice(0, 1), 'w4', [])).toBeUndefined();
  });

  it('--apply puts the lines first in the list the arch reads, and refuses them a second time naming the file', () => {
    const file = join(mkdtempSync(join(tmpdir(), 'forge-apply-')), 'recipe.json');
    const r = JSON.parse(readFileSync(join('recipes', 'tiny-qwen3', 'recipe.json'), 'utf8'));
    r.arch.default.overrides = [{ match: 'lm_head\\.weight', quant: 'w8' }];
    r.arch.v79 = { overrides: [] };
    writeFileSync(file, JSON.stringify(r));
    const line = { match: 'model\\.layers\\.2\\.mlp\\.down_proj\\.weight', quant: 'w8' as const, why: 'test' };
    applyOverrides(file, 'v81', [line]);
    expect(JSON.parse(readFileSync(file, 'utf8')).arch.default.overrides).toEqual([line, r.arch.default.overrides[0]]);
    // v79 has its own list, which replaces the default's for that arch: the line goes there.
    applyOverrides(file, 'v79', [line]);
    expect(JSON.parse(readFileSync(file, 'utf8')).arch.v79.overrides).toEqual([line]);
    expect(() => applyOverrides(file, 'v81', [line])).toThrow(new RegExp(`${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: arch.default.overrides already has`));
  });
});
