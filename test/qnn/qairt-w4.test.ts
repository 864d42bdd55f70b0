// `forge build` in w4 with QAIRT_SDK_ROOT set: the W4 weights reach the converter in QDQ form (int4
// → DequantizeLinear(axis 1, block_size 32), src/quant/w4-qdq.ts). No SDK exists where these tests
// run: the stand-in (test/fixtures/fake-qairt) reads each blocked DequantizeLinear as a per-block
// weight encoding and refuses one that is not 4-bit, block 32, symmetric and consistent with its
// int4 codes and scales. So these tests pin what forge hands the converter, and that the stand-in
// would catch it emitting something else — not what a real QAIRT release does with it.
import { describe, it, expect, beforeAll } from 'vitest';
import { execFileSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { cacheRoot } from '../../src/paths.js';
import { GRAPHS_JSON, type ExportManifest } from '../../src/export/graphs.js';
import { compileQairtContext } from '../../src/toolchain/qnn/qairt-compile.js';
import { qairtSdk } from '../../src/toolchain/qnn/qairt-sdk.js';
import { readModel } from '../../src/onnx/reader.js';
import { ensureVenv } from '../../src/toolchain/venv.js';
import type { RunRecord } from '../../src/engine/record.js';
import { FAKE_QAIRT_VERSION, makeFakeQairt, type FakeQairt } from '../helpers/fake-qairt.js';
import { forge, lastJson } from '../helpers/forge-cli.js';

let fake: FakeQairt;
let work: string;
let record: RunRecord;
let out: string;

beforeAll(async () => {
  fake = await makeFakeQairt();
  work = mkdtempSync(join(tmpdir(), 'forge-qairt-w4-'));
  const recipes = join(work, 'recipes');
  cpSync('recipes', recipes, { recursive: true });
  const file = join(recipes, 'tiny-qwen3', 'recipe.json');
  const r = JSON.parse(readFileSync(file, 'utf8'));
  r.arch.default.quant = 'w4';
  r.arch.default.lmHead.quant = 'w4';
  writeFileSync(file, JSON.stringify(r, null, 2));
  out = join(work, 'out');
  const run = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', out], { QAIRT_SDK_ROOT: fake.root, FORGE_RECIPES: recipes });
  if (run.code !== 0) throw new Error(`forge build in w4 with the stand-in SDK failed:\n${run.stderr.slice(-3000)}`);
  record = lastJson(run.stdout);
}, 600_000);

const quantizeDir = () => join(cacheRoot(), 'quantize', record.stages.find((s) => s.name === 'quantize')!.key!);
const manifest = () => JSON.parse(readFileSync(join(quantizeDir(), GRAPHS_JSON), 'utf8')) as ExportManifest;

describe('forge build in w4 with QAIRT_SDK_ROOT set (against the stand-in SDK)', () => {
  it('is green: every context compiled by the SDK tools, the CPU gates passed on the QDQ graphs', () => {
    expect(record.ok).toBe(true);
    expect(record.summaries.compile).toMatchObject({ toolchain: 'qairt', qairt: FAKE_QAIRT_VERSION });
    expect(record.gates.oracle.ok).toBe(true);
    expect(record.gates.parity.ok).toBe(true);
    const shipped = JSON.parse(readFileSync(join(out, 'manifest.json'), 'utf8'));
    expect(shipped.contexts.flatMap((c: any) => c.graphs.map((g: any) => g.quant.weights))).toEqual(['w4', 'w4', 'w4']);
    expect(readFileSync(join(out, 'README.md'), 'utf8')).toMatch(/layer weights w4 \(int4 blocks of 32, blocked DequantizeLinear for the QAIRT converter, checked against a stand-in SDK only, not a real one\)/);
  });

  it('hands the converter opset-21 graphs whose every W4 weight it reads as a 4-bit, block-32, symmetric per-block encoding, with --float_fallback', () => {
    const exp = manifest();
    expect(exp.w8Form).toBe('qdq');
    for (const c of exp.contexts) {
      for (const g of c.graphs) {
        const m = readModel(join(quantizeDir(), g.file));
        expect(m.opsets()['']).toBe(21);
        expect(m.nodes().some((n) => n.opType === 'MatMulNBits')).toBe(false);
      }
    }
    const converts = fake.calls().filter((c) => c.tool === 'qnn-onnx-converter').map((c) => ({ argv: c.argv, weights: c.weights ?? [] }));
    expect(converts).toHaveLength(3); // shard0 prefill and decode, lm_head
    for (const c of converts) {
      expect(c.argv).toEqual(expect.arrayContaining(['--float_fallback', '--float_bitwidth', '16', '--preserve_io_datatype']));
      expect(c.weights.length).toBeGreaterThan(0);
      for (const w of c.weights) expect(w).toMatchObject({ bitwidth: 4, axis: 1, blockSize: 32, symmetric: true });
    }
    // Each matrix the quantize stage recorded as w4 is one the converter read as 4-bit (the lm-head is the tied embedding).
    const w4 = new Set(exp.contexts.flatMap((c) => (c.matrices ?? []).filter((x) => x.scheme === 'w4').map((x) => x.tensor)));
    expect(new Set(converts.flatMap((c) => c.weights.map((w) => w.name)))).toEqual(w4);
  });
});

describe('the stand-in converter refuses a W4 weight that is not what forge\'s scheme promises', () => {
  /** The quantize stage's first context, one graph edited by `edit` (python, onnx), compiled through the stand-in. */
  const compileEdited = async (edit: string) => {
    const src = mkdtempSync(join(work, 'edited-'));
    for (const f of readdirSync(quantizeDir())) cpSync(join(quantizeDir(), f), join(src, f));
    const ctx = manifest().contexts[0];
    const graph = join(src, ctx.graphs[1].file); // the decode graph
    const script = ['import sys, onnx', 'm = onnx.load(sys.argv[1], load_external_data=False)', 'dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear")',
      'w = next(t for t in m.graph.initializer if t.name == dq.input[0])', edit, 'onnx.save(m, sys.argv[1])'].join('\n');
    execFileSync(await ensureVenv(), ['-c', script, graph]);
    return compileQairtContext({
      sdk: qairtSdk({ QAIRT_SDK_ROOT: fake.root })!, sdkVersion: FAKE_QAIRT_VERSION, graphs: ctx.graphs, srcDir: src,
      outDir: mkdtempSync(join(work, 'ctx-')), contextName: ctx.name, arch: { socModel: 87, dspArch: 'v81', vtcmMb: 8 }, fp16: true, qdqWeights: true, timeoutSeconds: 120,
    });
  };

  it('a blocked weight of bitwidth 8 (int8 codes under block_size 32)', async () => {
    await expect(compileEdited('w.data_type = onnx.TensorProto.INT8')).rejects.toThrow(/weight model\.layers\.0\.\S+: per-block encoding with bitwidth 8 .*per-block weights are 4-bit/);
  });

  it('blocks of 64', async () => {
    await expect(compileEdited('next(a for a in dq.attribute if a.name == "block_size").i = 64')).rejects.toThrow(/weight \S+: block_size 64, forge's W4 blocks are 32/);
  });

  it('blocks along the out-features', async () => {
    await expect(compileEdited('next(a for a in dq.attribute if a.name == "axis").i = 0')).rejects.toThrow(/weight \S+: blocks along axis 0; per-block weights block the input channels/);
  });

  it('a code of -8 (not symmetric)', async () => {
    const edit = [
      'import os', 'kv = {e.key: e.value for e in w.external_data}',
      'f = open(os.path.join(os.path.dirname(sys.argv[1]), kv["location"]), "r+b"); f.seek(int(kv["offset"])); f.write(bytes([0x08])); f.close()',
    ].join('\n');
    await expect(compileEdited(edit)).rejects.toThrow(/weight \S+: int4 codes use -8: not a symmetric encoding/);
  });

  it('a graph stamped below opset 21', async () => {
    await expect(compileEdited('for o in m.opset_import:\n    o.version = 17 if o.domain == "" else o.version')).rejects.toThrow(/needs opset 21 and IR 10; the model has opset 17/);
  });
});
