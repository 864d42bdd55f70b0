// forge bisect --target emulation (issue 17, step 2): a planted fp16 overflow — the tiny-qwen3 twin
// with layer 2's q_proj ×1024 (test/helpers/fp16-overflow.ts: q_norm makes it the same function, but
// q_norm's square of q no longer fits fp16) — holds on the CPU and leaves tolerance on the x86 HTP
// simulator. bisect names the graph, the op (layers.2/self_attn.q_norm/Mul, found by a probe variant
// run on the simulator beside the CPU), the link compile/fp16 and an exact rescale that --apply writes
// and with which the plain build's simulator gate passes. The same for an MLP whose intermediate
// leaves fp16, planted in the Gemma-4 twin: down_proj named, the MLP rescaled exactly; and for
// attention's V past fp16 in the Qwen3 twin: v_proj named, v_proj rescaled with o_proj, the KV cache
// holding the values scaled (the gates feed HF's alike, the runtime carries its own). A healthy twin
// is "no fault" on the simulator, quickly from the cache.
// Plus the pure parts: the rewrite is the same function, the candidates and their scale.
import { describe, it, expect, beforeAll } from 'vitest';
import { existsSync, mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import * as ort from 'onnxruntime-node';
import { forge, lastJson } from './helpers/forge-cli.js';
import { makeFp16Hostile, makeMlpFp16Hostile, makeValuesFp16Hostile } from './helpers/fp16-overflow.js';
import { dumpDom } from '../src/toolchain/chromium.js';
import { GraphBuilder } from '../src/onnx/builder.js';
import { encodeModel } from '../src/onnx/writer.js';
import { gatedMlp, MLP_RESCALE, rmsNorm, silu, VALUES_RESCALE } from '../src/families/blocks.js';
import { opMatrix, pairRescaleCandidates, rescaleCandidates, scaleFor } from '../src/bisect/simulator.js';
import type { ExportManifest } from '../src/export/graphs.js';
import { runExport } from '../src/export/stage.js';
import type { OpFigure, ProbeResult } from '../src/bisect/probe.js';
import type { BisectResult } from '../src/bisect/run.js';
import { recipeSandbox, stageEntry, writeRecipeVariant } from './helpers/recipe-sandbox.js';
import { twinDir } from './helpers/twin.js';

let work: string;
let recipes: string;
beforeAll(() => void ({ work, recipes } = recipeSandbox('forge-bisect-fp16-')));

/**
 * A planted twin as recipe `id` (`base` with its checkpoint and `prompts` of the recipe's, 8 new
 * tokens: the simulator's time goes with the steps; `edit` for more), bisected on the simulator with --apply.
 */
async function bisectPlanted(base: string, id: string, checkpoint: string, prompts: (all: string[]) => string[], out: string, edit: (r: any) => void = () => {}) {
  const recipeFile = writeRecipeVariant(recipes, base, id, (r) => {
    r.source = { kind: 'local', path: checkpoint };
    r.gates.prompts = prompts(r.gates.prompts);
    r.gates.parity.tokens = 8;
    edit(r);
  });
  const run = await forge(['bisect', id, '--arch', 'v81', '--target', 'emulation', '--apply', '--json', '--out', out], { FORGE_RECIPES: recipes });
  expect(run.code, run.stderr).toBe(0);
  return { recipeFile, b: lastJson(run.stdout) as BisectResult };
}

describe('forge bisect --target emulation', () => {
  it('names the op that overflows fp16 on the simulator, the link compile/fp16, and the rescale that makes the simulator gate pass', async () => {
    const hostile = join(work, 'fp16-hostile');
    await makeFp16Hostile(await twinDir('qwen3'), hostile, 2, 1024);
    const id = 'tiny-qwen3-fp16-hostile';
    const out = join(work, 'bisect');
    // Two prompts: q_norm's square overflows at every step.
    const { recipeFile, b } = await bisectPlanted('tiny-qwen3', id, hostile, (all) => all.slice(0, 2), out);
    // The CPU chain holds (fp32 and the shipped w8 graphs within tolerance): not quantization's doing.
    expect(b.fault).toBeUndefined();
    expect(b.layers.every((l) => l.fp32! >= b.thresholds.fp32 && l.shipped! >= b.thresholds.shipped)).toBe(true);
    // The simulator does not.
    expect(b.simFault).toMatchObject({ link: 'compile/fp16' });
    expect(b.simFault!.cosine).toBeLessThan(b.simFault!.threshold);
    // The op: the square in layer 2's q_norm, whose inputs fit fp16 and whose result does not.
    expect(b.op).toMatchObject({ node: 'layers.2/self_attn.q_norm/Mul', scope: 'layers.2/self_attn.q_norm', layer: 2 });
    expect(b.probe!.why).toBe('overflow');
    expect(b.probe!.first!.cpuMaxAbs).toBeGreaterThan(65504);
    expect(b.probe!.first!.inputMaxAbs).toBeLessThan(65504);
    // Every op before it in the graph agrees with the CPU on the simulator (the attention mask's add
    // reaches 65508 on the CPU, a hair over fp16's range, and is right there all the same).
    const before = b.probe!.ops.slice(0, b.probe!.ops.findIndex((o) => o.node === b.op!.node));
    expect(before.length).toBeGreaterThan(0);
    expect(before.every((o) => o.simNonFinite === 0 && o.cosine >= b.simulator!.threshold)).toBe(true);
    expect(b.layer).toBe(2);
    // The fix: an exact rescale, which passes the simulator gate; --apply wrote it into the recipe.
    expect(b.verdict).toBe('fixed');
    const chosen = b.chosen!;
    expect(chosen.ok).toBe(true);
    expect(chosen.rescale!.length).toBeGreaterThan(0);
    expect(chosen.rescale![0].match).toBe('layers\\.2/self_attn\\.q_norm');
    expect(chosen.minCosine!).toBeGreaterThanOrEqual(b.simulator!.threshold);
    expect(b.applied!.rescale).toEqual(chosen.rescale);
    expect(JSON.parse(readFileSync(recipeFile, 'utf8')).arch.default.rescale).toEqual(chosen.rescale);
    console.log(`[measured] bisect --target emulation on the fp16-hostile twin: ${b.simFault!.graph} ${b.simFault!.output} ${b.simFault!.cosine.toFixed(5)} on the simulator; op ${b.op!.node}: ${b.op!.why}; fixes ${b.trials.map((t) => `${t.label} ${t.ok ? 'ok' : 'no'} ${t.minCosine?.toFixed(5)}`).join('; ')}; ${b.seconds.toFixed(1)} s`);

    // The plain build of the recipe now passes the simulator gate, from the trial's cache.
    const rebuilt = await forge(['build', id, '--arch', 'v81', '--until', 'emulation', '--json', '--out', join(work, 'rebuilt')], { FORGE_RECIPES: recipes });
    const rec = lastJson(rebuilt.stdout);
    expect(rec.gates.emulation.ok, rebuilt.stderr).toBe(true);
    expect(rec.stages.find((s: { name: string }) => s.name === 'emulation').status).toBe('cached');

    for (const f of ['bisect.json', 'bisect.html', 'summary.txt']) expect(existsSync(join(out, f)), f).toBe(true);
    const dom = await dumpDom(pathToFileURL(join(out, 'bisect.html')).href, join(work, 'chromium-profile'));
    expect(dom).toContain('link compile/fp16');
    expect(dom).toContain('On the x86 HTP simulator');
    expect(dom).toContain('Op by op: layers.2/self_attn.q_norm/Mul');
    expect(dom).toContain(chosen.label);
  }, 1_800_000); // the twin's trace and w8 export, the native runtime, the simulator gate (~4 min here), the probe, up to two trial builds through the simulator

  it('names a Gemma-4 MLP whose act(gate)·up leaves fp16 on the simulator, and rescales it exactly', async () => {
    // tiny-gemma4's layer 1: up_proj × 2^13, down_proj ÷ 2^13, the same function with an intermediate
    // past 65504 (the hand-made Gemma-4 audio path's drift, planted in the text decoder).
    const hostile = join(work, 'mlp-hostile');
    await makeMlpFp16Hostile(await twinDir('gemma4'), hostile, 1);
    const id = 'tiny-gemma4-mlp-hostile';
    // The recipe's long prompt alone: its steps take the intermediate past 65504 (a short prompt's do
    // not). The fault is in the text decoder: built without the vision encoder, whose compile and
    // simulation would double the time and prove nothing here.
    const textOnly = (r: any) => {
      r.modalities = ['text'];
      r.arch.default.image = null;
      r.gates.imagePrompts = [];
    };
    const { recipeFile, b } = await bisectPlanted('tiny-gemma4', id, hostile, (all) => all.filter((p) => p.startsWith('The lighthouse keeper')), join(work, 'bisect-mlp'), textOnly);
    expect(b.fault).toBeUndefined();
    expect(b.simFault).toMatchObject({ link: 'compile/fp16' });
    // The op: down_proj reading the product (or the product itself); either way its layer and module.
    expect(b.op!.scope).toMatch(/^layers\.1\/mlp(\.down_proj)?$/);
    expect(b.op!.layer).toBe(1);
    expect(b.layer).toBe(1);
    expect(b.op!.why).toMatch(/beyond fp16's 65504/);
    expect(b.verdict).toBe('fixed');
    const chosen = b.chosen!;
    expect(chosen.rescale).toEqual([expect.objectContaining({ match: 'layers\\.1/mlp' })]);
    expect(chosen.label).toMatch(/^rescale layers\.1\/mlp \(up_proj ÷ 2\^\d+, down_proj × 2\^\d+\)$/);
    expect(chosen.minCosine!).toBeGreaterThanOrEqual(b.simulator!.threshold);
    expect(JSON.parse(readFileSync(recipeFile, 'utf8')).arch.default.rescale).toEqual(chosen.rescale);
    console.log(`[measured] bisect --target emulation on the MLP-hostile Gemma-4 twin: ${b.simFault!.graph} ${b.simFault!.output} ${b.simFault!.cosine.toFixed(5)} on the simulator; op ${b.op!.node}: ${b.op!.why}; fixes ${b.trials.map((t) => `${t.label} ${t.ok ? 'ok' : 'no'} ${t.minCosine?.toFixed(5)}`).join('; ')}; ${b.seconds.toFixed(1)} s`);
    const rebuilt = await forge(['build', id, '--arch', 'v81', '--until', 'emulation', '--json', '--out', join(work, 'rebuilt-mlp')], { FORGE_RECIPES: recipes });
    expect(lastJson(rebuilt.stdout).gates.emulation.ok, rebuilt.stderr).toBe(true);
  }, 1_800_000);

  it("names a value past fp16 in a Qwen3 layer's attention, and rescales v_proj with o_proj, the KV cache holding the values scaled", async () => {
    // tiny-qwen3's layer 1: v_proj × 2^15, o_proj ÷ 2^15: attention is linear in V, so HF's numbers
    // do not move, but V (what the cache holds and o_proj reads through attention) passes 65504.
    const hostile = join(work, 'values-hostile');
    await makeValuesFp16Hostile(await twinDir('qwen3'), hostile, 1);
    const id = 'tiny-qwen3-values-hostile';
    const { recipeFile, b } = await bisectPlanted('tiny-qwen3', id, hostile, (all) => all.slice(0, 2), join(work, 'bisect-values'));
    expect(b.fault).toBeUndefined();
    expect(b.simFault).toMatchObject({ link: 'compile/fp16' });
    expect(b.op).toMatchObject({ scope: 'layers.1/self_attn.v_proj', layer: 1 });
    expect(b.op!.why).toMatch(/^overflows fp16: its inputs up to [\d.]+, its result up to [\d.e+]+ on the CPU > 65504/);
    expect(b.verdict).toBe('fixed');
    const chosen = b.chosen!;
    expect(chosen.rescale).toEqual([expect.objectContaining({ match: 'layers\\.1/self_attn\\.v_proj' })]);
    expect(chosen.label).toMatch(/^rescale layers\.1\/self_attn\.v_proj \(v_proj ÷ 2\^\d+, o_proj × 2\^\d+; the KV cache holds the values ÷ 2\^\d+\)$/);
    expect(chosen.minCosine!).toBeGreaterThanOrEqual(b.simulator!.threshold);
    expect(JSON.parse(readFileSync(recipeFile, 'utf8')).arch.default.rescale).toEqual(chosen.rescale);
    console.log(`[measured] bisect --target emulation on the values-hostile Qwen3 twin: ${b.simFault!.graph} ${b.simFault!.output} ${b.simFault!.cosine.toFixed(5)} on the simulator; op ${b.op!.node}: ${b.op!.why}; fixes ${b.trials.map((t) => `${t.label} ${t.ok ? 'ok' : 'no'} ${t.minCosine?.toFixed(5)}`).join('; ')}; ${b.seconds.toFixed(1)} s`);
    // Rebuilt with the line: layer 1's graphs say their cache holds V scaled (the gates feed HF's V
    // alike), and the runtime, which carries its own cache, follows HF on the simulator (the emulation
    // gate's parity runs it there, teacher-forced).
    const rebuilt = await forge(['build', id, '--arch', 'v81', '--until', 'emulation', '--json', '--out', join(work, 'rebuilt-values')], { FORGE_RECIPES: recipes });
    const rec = lastJson(rebuilt.stdout);
    for (const gate of ['oracle', 'emulation']) expect(rec.gates[gate].ok, `${gate}: ${rebuilt.stderr}`).toBe(true);
    expect(rec.gates.emulation.parity.matched).toBe(rec.gates.emulation.parity.total);
    const graphs = JSON.parse(readFileSync(join(stageEntry(rec, 'quantize'), 'graphs.json'), 'utf8')) as ExportManifest;
    const shards = graphs.contexts.flatMap((c) => c.graphs).filter((g) => g.component === 'shard0');
    const scale = chosen.rescale![0].scale;
    for (const g of shards) expect(g.stateScales, g.name).toEqual({ past_v_1: scale, new_v_1: scale });
  }, 1_800_000);

  it('says "no fault" on a healthy twin on the simulator, from the cache', async () => {
    const args = ['bisect', 'tiny-qwen3', '--arch', 'v81', '--target', 'emulation', '--json', '--out', join(work, 'bisect-healthy')];
    const first = await forge(args, { FORGE_RECIPES: recipes });
    expect(first.code, first.stderr).toBe(0);
    const t = performance.now();
    const run = await forge(args, { FORGE_RECIPES: recipes });
    const seconds = (performance.now() - t) / 1000;
    expect(run.code, run.stderr).toBe(0);
    const b = lastJson(run.stdout) as BisectResult;
    expect(b.verdict).toBe('no-fault');
    expect(b.message).toMatch(/^no fault: every graph within tolerance on the CPU and on the x86 HTP simulator/);
    expect(b.build.stages.every((s) => s.status === 'cached')).toBe(true);
    console.log(`[measured] bisect --target emulation on healthy tiny-qwen3, cached: ${seconds.toFixed(1)} s for the command`);
  }, 1_200_000);
});

describe('bisect on the simulator, the pure parts', () => {
  it('rescales an RMSNorm exactly: the same function, squares fp16 can hold', async () => {
    const x = Float32Array.from({ length: 2 * 8 }, (_, i) => (i % 3 === 0 ? 300 : -20) + i);
    const run = async (rescale: Array<{ match: string; scale: number }>) => {
      const g = new GraphBuilder('norm', { rescale });
      const input = g.input('x', 'float32', [2, 8]);
      const y = await g.scoped('layers.2', async () => rmsNorm(g, input, g.constFloat32(Array.from({ length: 8 }, (_, i) => 1 + i / 8), [8]), 1e-6, 'input_layernorm'));
      g.output(y, 'y', { shape: [2, 8] });
      expect(g.unusedRescales()).toEqual([]);
      const s = await ort.InferenceSession.create(encodeModel(g));
      return { y: (await s.run({ x: new ort.Tensor('float32', x, [2, 8]) })).y.data as Float32Array, nodes: g };
    };
    const plain = await run([]);
    const scaled = await run([{ match: 'layers\\.2/input_layernorm', scale: 2 ** -5 }]);
    for (let i = 0; i < x.length; i++) expect(scaled.y[i]).toBeCloseTo(plain.y[i], 5);
  });

  it('picks a power of two that brings the input under 16, and offers the op alone before every residual norm after it', () => {
    expect(scaleFor(380)).toBe(2 ** -5);
    expect(scaleFor(17)).toBe(2 ** -1);
    const op = (node: string, inputMaxAbs: number, cpuMaxAbs: number): OpFigure => ({ node, op: node.split('/').pop()!.replace(/_\d+$/, ''), scope: node.slice(0, node.lastIndexOf('/')), layer: /^layers\.(\d+)/.test(node) ? Number(/^layers\.(\d+)/.exec(node)![1]) : null, value: `${node}_out`, cosine: 1, cpuMaxAbs, inputMaxAbs, simMaxAbs: 0, simNonFinite: 0, simSaturated: 0 });
    const ops = [op('layers.1/input_layernorm/Mul', 13, 169), op('layers.2/input_layernorm/Mul', 380, 144400), op('layers.2/self_attn.q_norm/Mul', 4, 16), op('layers.2/post_attention_layernorm/Mul', 400, 160000), op('final_norm/Mul', 410, 168100)];
    const probe = { graph: 'shard0.decode', cases: [], ops, first: ops[1], why: 'overflow', graphSha256: '', cached: false, seconds: 0 } as ProbeResult;
    // The norms whose squares overflow in this probe, together (one left alone would still overflow).
    const [one, all] = rescaleCandidates(probe, 4);
    expect(one).toMatchObject({ addedOps: 3, scopes: ['layers.2/input_layernorm', 'layers.2/post_attention_layernorm', 'final_norm'], rescale: [{ match: 'layers\\.2/input_layernorm|layers\\.2/post_attention_layernorm|final_norm', scale: 2 ** -5 }] });
    // The named op alone, when it is the only one.
    const alone = rescaleCandidates({ ...probe, ops: ops.slice(0, 3) }, 4);
    expect(alone[0]).toMatchObject({ label: 'rescale layers.2/input_layernorm', addedOps: 1, rescale: [{ match: 'layers\\.2/input_layernorm', scale: 2 ** -5 }] });
    // Layer 3 is not in this probe's ops (another graph would hold it): named by pattern.
    expect(new Set(all.scopes)).toEqual(new Set(['layers.2/input_layernorm', 'layers.2/post_attention_layernorm', 'final_norm', 'layers.3/input_layernorm', 'layers.3/post_attention_layernorm']));
    expect(all.rescale[0].scale).toBe(2 ** -5); // 410 → 12.8
    // An op neither in a norm nor in a gated MLP has no rescale here.
    expect(rescaleCandidates({ ...probe, first: op('layers.2/self_attn.o_proj/Gemm', 10, 70000) }, 4)).toEqual([]);
  });

  it('names the checkpoint matrix an op multiplies, the candidate after the rescales on the fp16 link', () => {
    const m = (name: string) => ({ name, shape: [8, 8], role: 'matmul' as const });
    const tensors = [m('model.layers.1.self_attn.q_proj.weight'), m('model.layers.1.self_attn.v_proj.weight'), m('model.layers.1.mlp.down_proj.weight'), { name: 'model.layers.1.input_layernorm.weight', shape: [8], role: 'small' as const }];
    expect(opMatrix(tensors, 'layers.1/self_attn.v_proj', 1)?.name).toBe('model.layers.1.self_attn.v_proj.weight');
    expect(opMatrix(tensors, 'model/layers.1/mlp.down_proj', 1)?.name).toBe('model.layers.1.mlp.down_proj.weight');
    // A norm, or an op between the projections, multiplies no checkpoint matrix.
    expect(opMatrix(tensors, 'layers.1/input_layernorm', 1)).toBeUndefined();
    expect(opMatrix(tensors, 'layers.1/mlp', 1)).toBeUndefined();
  });

  it("refuses a rescale line no op of the model takes, naming the ones this family honours", async () => {
    const out = join(work, 'refused-rescale');
    mkdirSync(out);
    const plan = { shards: [{ first: 0, last: 3 }], lmHead: { placement: 'separate' as const } };
    const line = { match: 'layers\\.1/self_attn\\.q_proj', scale: 0.5 };
    await expect(runExport({ family: 'qwen3', scheme: 'fp32', lmHeadScheme: 'fp32', maxContext: 16, prefillLength: 0, hostTables: false, rescale: [line] }, await twinDir('qwen3'), plan, out, { log() {}, progress() {} }))
      .rejects.toThrow('rescale "layers\\\\.1/self_attn\\\\.q_proj" match no op this qwen3 model can rescale (patterns match an op scope: its RMSNorms, as "layers\\\\.2/input_layernorm", up_proj with down_proj as "layers\\\\.2/mlp", v_proj with o_proj as "layers\\\\.2/self_attn\\\\.v_proj")');
    // No manifest: the graphs written so far are in the stage's own directory, which the build discards.
    expect(readdirSync(out)).not.toContain('graphs.json');
  });

  it('rescales a gated MLP exactly, and offers it when its intermediate leaves fp16, smallest power of two first', async () => {
    const x = Float32Array.from({ length: 2 * 8 }, (_, i) => Math.sin(i) * 3);
    const weights = { gate_proj: [16, 8, 1], up_proj: [16, 8, 2], down_proj: [8, 16, 3] } as const;
    const run = async (rescale: Array<{ match: string; scale: number }>) => {
      const g = new GraphBuilder('mlp', { rescale });
      const input = g.input('x', 'float32', [1, 2, 8]);
      // The store's part: the weight as read, times the scale asked for.
      const project = async (v: string, m: keyof typeof weights, scale: number) => {
        const [rows, cols, k] = weights[m];
        const wt = g.constFloat32(Array.from({ length: rows * cols }, (_, i) => Math.cos(i * k) * 40 * scale), [rows, cols]);
        return g.op('MatMul', [v, g.op('Transpose', [wt])]);
      };
      const y = await g.scoped('layers.1', () => gatedMlp(g, input, silu, project));
      g.output(y, 'y', { shape: [1, 2, 8] });
      expect(g.unusedRescales()).toEqual([]);
      const names = (g.toModelProto().graph!.node ?? []).map((n) => n.name!);
      const s = await ort.InferenceSession.create(encodeModel(g));
      return { y: (await s.run({ x: new ort.Tensor('float32', x, [1, 2, 8]) })).y.data as Float32Array, names };
    };
    const plain = await run([]);
    const scaled = await run([{ match: 'layers\\.1/mlp', scale: 2 ** -4 }]);
    for (let i = 0; i < plain.y.length; i++) expect(scaled.y[i]).toBe(plain.y[i]); // powers of two: bit for bit
    expect(scaled.names).toEqual(plain.names); // no op added: the weights carry the scale
    for (const scope of ['layers.1/mlp.gate_proj/', 'layers.1/mlp.up_proj/', 'layers.1/mlp/', 'layers.1/mlp.down_proj/']) expect(plain.names.some((n) => n.startsWith(scope)), scope).toBe(true);

    const op = (node: string, inputMaxAbs: number, cpuMaxAbs: number): OpFigure => ({ node, op: 'Mul', scope: node.slice(0, node.lastIndexOf('/')), layer: 1, value: `${node}_out`, cosine: 0.5, cpuMaxAbs, inputMaxAbs, simMaxAbs: 0, simNonFinite: 0, simSaturated: 0 });
    const product = op('layers.1/mlp/Mul_3', 40, 72304);
    const down = op('layers.1/mlp.down_proj/MatMulNBits', 72304, 900);
    const probe = { graph: 'shard0.decode', cases: [], ops: [product, down], first: down, why: 'cosine', graphSha256: '', cached: false, seconds: 0 } as ProbeResult;
    // 72304 / 2^4 = 4519 ≤ 2^13; then 2^4 further.
    expect(rescaleCandidates(probe, 4, [MLP_RESCALE]).map((c) => [c.label, c.rescale[0].match, c.rescale[0].scale, c.addedOps])).toEqual([
      ['rescale layers.1/mlp (up_proj ÷ 2^4, down_proj × 2^4)', 'layers\\.1/mlp', 2 ** -4, 0],
      ['rescale layers.1/mlp (up_proj ÷ 2^8, down_proj × 2^8)', 'layers\\.1/mlp', 2 ** -8, 0],
    ]);
    // An MLP whose intermediate fits fp16 is not this fault: no MLP rescale.
    expect(pairRescaleCandidates({ ...probe, ops: [op('layers.1/mlp/Mul_3', 40, 3000), op('layers.1/mlp.down_proj/MatMulNBits', 3000, 900)] }, [MLP_RESCALE])).toEqual([]);
    // A family that does not declare the pair gets none.
    expect(rescaleCandidates(probe, 4, [VALUES_RESCALE])).toEqual([]);
  });
});
