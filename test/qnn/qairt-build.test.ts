// `forge build` with QAIRT_SDK_ROOT set compiles through the SDK's command-line tools. No SDK exists
// where these tests run: a stand-in (test/fixtures/fake-qairt) does what the tools are documented to
// do with the files and fails the way they do on a missing flag, so these tests pin what forge runs,
// what it checks in the binary's description and the bundle it makes from it — not QNN itself.
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { readModel } from '../../src/onnx/reader.js';
import { cacheRoot } from '../../src/paths.js';
import { GRAPHS_JSON, type ExportManifest } from '../../src/export/graphs.js';
import { compileQairtContext } from '../../src/toolchain/qnn/qairt-compile.js';
import { QnnCompileError } from '../../src/toolchain/qnn/compile.js';
import { qairtSdk } from '../../src/toolchain/qnn/qairt-sdk.js';
import type { RunRecord } from '../../src/engine/record.js';
import { FAKE_QAIRT_VERSION, makeFakeQairt, type FakeQairt } from '../helpers/fake-qairt.js';
import { forge, lastJson } from '../helpers/forge-cli.js';

let fake: FakeQairt;
let work: string;
const runs: Record<string, { record: RunRecord; out: string }> = {};

beforeAll(async () => {
  fake = await makeFakeQairt();
  work = mkdtempSync(join(tmpdir(), 'forge-qairt-build-'));
  for (const arch of ['v81', 'v79']) {
    const out = join(work, arch);
    const r = await forge(['build', 'tiny-qwen3', '--arch', arch, '--json', '--out', out], { QAIRT_SDK_ROOT: fake.root });
    if (r.code !== 0) throw new Error(`forge build --arch ${arch} with the stand-in SDK failed:\n${r.stderr.slice(-3000)}`);
    runs[arch] = { record: lastJson(r.stdout), out };
  }
}, 600_000);

const entry = (arch: string, stage: string) => join(cacheRoot(), stage, runs[arch].record.stages.find((s) => s.name === stage)!.key!);

describe('forge build with QAIRT_SDK_ROOT set', () => {
  it('compiles every context with the SDK tools and ships one EPContext wrapper per graph, naming the binary and its graph', () => {
    const { record, out } = runs.v81;
    expect(record.ok).toBe(true);
    expect(record.summaries.compile).toMatchObject({ toolchain: 'qairt', qairt: FAKE_QAIRT_VERSION });
    const manifest = JSON.parse(readFileSync(join(out, 'manifest.json'), 'utf8'));
    for (const c of manifest.contexts) {
      for (const g of c.graphs) {
        const w = readModel(join(out, g.qnn.wrapper));
        expect(w.nodes().map((n) => n.opType)).toEqual(['EPContext']);
        const node = w.nodes()[0];
        expect(node.domain).toBe('com.microsoft');
        expect(node.attrs).toMatchObject({ ep_cache_context: `${c.name}.bin`, embed_mode: 0, main_context: 1, source: 'QNNExecutionProvider', ep_sdk_version: `v${FAKE_QAIRT_VERSION}` });
        // The graph inside the binary is the one the converter named after the graph file.
        expect(node.name).toBe(g.name.replace('.', '_'));
        // Inputs and outputs are the manifest's, in its order, with its types and shapes.
        expect(w.inputs().map((i) => [i.name, i.dtype, i.shape])).toEqual(g.inputs.map((i: any) => [i.name, i.dtype, i.shape]));
        expect(w.outputs().map((o) => o.name)).toEqual(g.outputs.map((o: any) => o.name));
      }
    }
    expect(readdirSync(out).filter((f) => f.endsWith('.bin')).sort()).toEqual(['embedding.f16.bin', 'lm_head.bin', 'shard0.bin']);
  });

  it('gives the converter QDQ W8 graphs with --float_fallback, fp16 floats and kept I/O types, and the generator the wrapped HTP config for the arch', () => {
    const calls = fake.calls();
    const converts = calls.filter((c) => c.tool === 'qnn-onnx-converter');
    const shard = converts.find((c) => c.argv[1].endsWith('shard0.decode.onnx'))!;
    expect(shard.argv).toEqual(expect.arrayContaining(['--preserve_io_datatype', '--float_bitwidth', '16', '--float_fallback']));
    // The fp16 lm-head has no int8 weights: no fallback flag.
    const lmHead = converts.find((c) => c.argv[1].endsWith('lm_head.onnx'))!;
    expect(lmHead.argv).not.toContain('--float_fallback');
    // The stand-in refuses MatMulNBits, as the converter does: the quantize stage wrote QDQ for this toolchain.
    const exp = JSON.parse(readFileSync(join(entry('v81', 'quantize'), GRAPHS_JSON), 'utf8')) as ExportManifest;
    expect(exp.w8Form).toBe('qdq');
    const htps = calls.filter((c) => c.tool === 'qnn-context-binary-generator').map((c) => c.htp);
    expect(htps).toContainEqual({
      graphs: [{ graph_names: ['shard0_prefill', 'shard0_decode'], O: 3, vtcm_mb: 8, fp16_relaxed_precision: 1 }],
      devices: [{ soc_model: 87, dsp_arch: 'v81' }], context: { weight_sharing_enabled: true },
    });
    expect(htps).toContainEqual(expect.objectContaining({ devices: [{ soc_model: 69, dsp_arch: 'v79' }] }));
  });

  it('records the SDK version in the run record and on the card, and says why the simulator gate did not run', () => {
    const { record, out } = runs.v81;
    expect(record.tools['qairt-sdk']).toBe(FAKE_QAIRT_VERSION);
    expect(record.gates.oracle.ok).toBe(true);
    expect(record.gates.parity.ok).toBe(true);
    expect(record.gatesNotRun?.emulation).toMatch(/QAIRT/);
    const card = readFileSync(join(out, 'README.md'), 'utf8');
    expect(card).toContain(`compiled with the QAIRT SDK ${FAKE_QAIRT_VERSION}`);
    expect(card).toMatch(/\*\*Emulation: not run\*\* — .*QAIRT/);
  });

  it('builds v79 and v81 binaries that differ and each report their own SoC', () => {
    expect(runs.v79.record.summaries.compile).toMatchObject({ contexts: [{ name: 'shard0', socModel: 69, dspArch: 'v79' }, { name: 'lm_head', socModel: 69, dspArch: 'v79' }] });
    expect(runs.v81.record.summaries.compile).toMatchObject({ contexts: [{ name: 'shard0', socModel: 87, dspArch: 'v81' }, { name: 'lm_head', socModel: 87, dspArch: 'v81' }] });
    expect(readFileSync(join(runs.v79.out, 'shard0.bin')).equals(readFileSync(join(runs.v81.out, 'shard0.bin')))).toBe(false);
  });

  it('stops with one line naming the missing tool when QAIRT_SDK_ROOT is not a complete SDK', async () => {
    const partial = await makeFakeQairt({ without: 'qnn-context-binary-generator' });
    const r = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--out', join(work, 'partial')], { QAIRT_SDK_ROOT: partial.root });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/is not a usable QAIRT SDK: missing \S+\/qnn-context-binary-generator.*unset it to use onnxruntime-qnn/);
    expect(r.stderr).not.toMatch(/\n\s+at /); // no stack trace
  });
});

describe('the QAIRT compile of one context refuses a binary that does not match its graphs', () => {
  const compile = async (faults: Record<string, unknown>) => {
    fake.setFaults(faults);
    try {
      const exp = JSON.parse(readFileSync(join(entry('v81', 'quantize'), GRAPHS_JSON), 'utf8')) as ExportManifest;
      const ctx = exp.contexts[0];
      return await compileQairtContext({
        sdk: qairtSdk({ QAIRT_SDK_ROOT: fake.root })!, sdkVersion: FAKE_QAIRT_VERSION, graphs: ctx.graphs, srcDir: entry('v81', 'quantize'),
        outDir: mkdtempSync(join(work, 'ctx-')), contextName: ctx.name, arch: { socModel: 87, dspArch: 'v81', vtcmMb: 8 }, fp16: true, qdqWeights: true, timeoutSeconds: 120,
      });
    } finally {
      fake.setFaults({});
    }
  };

  it('built for another SoC than the arch asked for', async () => {
    await expect(compile({ socModel: 69 })).rejects.toThrow(/shard0\.bin targets soc_model 69, not 87: the HTP config was not applied/);
  });

  it('whose graph lost an input name in conversion', async () => {
    await expect(compile({ rename: { position: 'position_1' } })).rejects.toThrow(/graph shard0_prefill \(from shard0\.prefill\.onnx\) has no input 'position' .*renamed/);
  });

  it('whose graph I/O became fp16 (the converter did not keep I/O types)', async () => {
    await expect(compile({ ignorePreserveIo: true })).rejects.toThrow(/input 'hidden_in' is QNN_DATATYPE_FLOAT_16 in the binary, the graph has float32/);
  });

  it('and reports an HTP allocation failure as a memory failure (the build re-plans on it)', async () => {
    const err = await compile({ fail: { tool: 'qnn-context-binary-generator', message: 'QnnContext_createFromBinary failed: QNN_COMMON_ERROR_MEM_ALLOC' } }).catch((e) => e);
    expect(err).toBeInstanceOf(QnnCompileError);
    expect(err.kind).toBe('memory');
    expect(err.message).toMatch(/QAIRT context-binary ran out of memory \(htp-mem-alloc/);
  });

  it('and compiles when nothing is wrong, leaving only the binary, its wrappers and the logs', async () => {
    const r = await compile({});
    expect(r.wrappers.map((w) => [w.graph, w.qnnGraph])).toEqual([['shard0.prefill', 'shard0_prefill'], ['shard0.decode', 'shard0_decode']]);
    expect(readdirSync(join(r.bin, '..')).sort()).toEqual(['context_config.json', 'htp.json', 'qairt.log', 'shard0.bin', 'shard0.decode_ctx.onnx', 'shard0.info.json', 'shard0.prefill_ctx.onnx']);
  });
});
