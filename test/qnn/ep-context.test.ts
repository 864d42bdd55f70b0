// EPContext wrappers written by forge (for binaries the QAIRT tools build): what a
// qnn-context-binary-utility report is read as, what is refused, and — on this machine's HTP
// simulator — that a wrapper forge writes for a real context binary loads and computes exactly what
// ONNX Runtime's own wrapper of the same binary computes.
import { describe, it, expect } from 'vitest';
import { mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import { checkGraphIo, describeContextBinary, writeEpContextWrapper, type QnnGraph } from '../../src/toolchain/qnn/ep-context.js';
import { compileContext } from '../../src/toolchain/qnn/compile.js';
import { venvPython } from '../../src/toolchain/venv.js';
import { openSafetensors } from '../../src/io/safetensors.js';
import { toFloat32 } from '../../src/io/dtype.js';
import { qnnSimulateScript, simulateBatch } from '../../src/gates/emulation.js';
import type { TensorIO } from '../../src/families/types.js';

const t = (name: string, dataType: string, dimensions: number[]) => ({ info: { name, dataType, dimensions, quantizeParams: {} }, version: 'QNN_TENSOR_VERSION_1' });
const REPORT = {
  info: {
    buildId: 'v2.51.0.260929181845',
    graphs: [{ info: { graphName: 'lm_head', graphInputs: [t('hidden', 'QNN_DATATYPE_FLOAT_32', [1, 1, 64])], graphOutputs: [t('logits', 'QNN_DATATYPE_FLOAT_32', [1, 1, 512])] } }],
  },
};
const LM_HEAD: { file: string; inputs: TensorIO[]; outputs: TensorIO[] } = {
  file: 'lm_head.onnx', inputs: [{ name: 'hidden', dtype: 'float32', shape: [1, 1, 64] }], outputs: [{ name: 'logits', dtype: 'float32', shape: [1, 1, 512] }],
};
const graph = (g: Partial<QnnGraph>): QnnGraph => ({ ...describeContextBinary(REPORT, 'r.json').graphs[0], ...g });

describe('reading a qnn-context-binary-utility report', () => {
  it('gives each graph with its inputs and outputs, and the build id', () => {
    expect(describeContextBinary(REPORT, 'r.json')).toEqual({
      buildId: 'v2.51.0.260929181845',
      graphs: [{ name: 'lm_head', inputs: [{ name: 'hidden', dataType: 'QNN_DATATYPE_FLOAT_32', dims: [1, 1, 64] }], outputs: [{ name: 'logits', dataType: 'QNN_DATATYPE_FLOAT_32', dims: [1, 1, 512] }] }],
    });
  });

  it('names the file and the missing field of a report it cannot read', () => {
    expect(() => describeContextBinary({ version: 1 }, 'x.info.json')).toThrow('x.info.json: no info.graphs: not a qnn-context-binary-utility report');
    expect(() => describeContextBinary({ info: { graphs: [{ info: { graphName: 'g', graphInputs: [{ info: { name: 'a' } }], graphOutputs: [] } }] } }, 'x.info.json'))
      .toThrow('x.info.json: graph g: graphInputs[0] lacks name, dataType or dimensions');
  });
});

describe('matching a compiled graph to its source graph', () => {
  it('accepts the same names, types and shapes', () => {
    expect(() => checkGraphIo(LM_HEAD, graph({}), 'lm_head.bin')).not.toThrow();
  });

  it('refuses a renamed, retyped, reshaped, missing or extra tensor, naming it', () => {
    const src = LM_HEAD;
    const h = (dataType: string, dims = [1, 1, 64], name = 'hidden') => ({ name, dataType, dims });
    expect(() => checkGraphIo(src, graph({ inputs: [h('QNN_DATATYPE_FLOAT_32', [1, 1, 64], 'hidden_0')] }), 'lm_head.bin')).toThrow(/graph lm_head \(from lm_head\.onnx\) has no input 'hidden' \(its inputs: hidden_0\)/);
    expect(() => checkGraphIo(src, graph({ inputs: [h('QNN_DATATYPE_UFIXED_POINT_16')] }), 'lm_head.bin')).toThrow(/input 'hidden' is QNN_DATATYPE_UFIXED_POINT_16 in the binary, the graph has float32/);
    expect(() => checkGraphIo(src, graph({ inputs: [h('QNN_DATATYPE_FLOAT_32', [1, 64])] }), 'lm_head.bin')).toThrow(/input 'hidden' has shape \[1, 64\] in the binary, \[1, 1, 64\] in the graph/);
    expect(() => checkGraphIo(src, graph({ outputs: [] }), 'lm_head.bin')).toThrow(/has no output 'logits'/);
    expect(() => checkGraphIo(src, graph({ inputs: [h('QNN_DATATYPE_FLOAT_32'), h('QNN_DATATYPE_INT_32', [1], 'pos')] }), 'lm_head.bin')).toThrow(/has inputs the graph does not: pos/);
  });
});

const V81 = { id: 'v81' as const, socModel: 87, dspArch: 'v81' as const, vtcmMb: 8 };

// Two inputs of different types, so a wrapper that bound them by position in the wrong order, or
// with the wrong type, would not give ORT's result.
const MAKE_GRAPH = `
import sys, numpy as np, onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T
w = (np.random.default_rng(0).standard_normal((48, 64)) * 0.1).astype(np.float32)
g = h.make_graph([h.make_node("Gemm", ["x", "w"], ["y0"], transB=1), h.make_node("Cast", ["k"], ["kf"], to=1),
                  h.make_node("Mul", ["y0", "kf"], ["y"])], "two_inputs",
                 [h.make_tensor_value_info("x", T.FLOAT, [1, 64]), h.make_tensor_value_info("k", T.INT32, [1, 48])],
                 [h.make_tensor_value_info("y", T.FLOAT, [1, 48])], [nh.from_array(w, "w")])
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]); m.ir_version = 8
onnx.save(m, sys.argv[1])
from safetensors.numpy import save_file
rng = np.random.default_rng(1)
save_file({"0/x": rng.standard_normal((1, 64)).astype(np.float32), "0/k": rng.integers(-3, 4, (1, 48)).astype(np.int32)}, sys.argv[2], metadata={"cases": "1"})
`;

describe('a wrapper forge writes for a real context binary', () => {
  it('loads on the HTP simulator and gives exactly the outputs of ONNX Runtime\'s own wrapper', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-epctx-'));
    const python = venvPython();
    await $({ quiet: true })`${python} -c ${MAKE_GRAPH} ${join(dir, 'g.onnx')} ${join(dir, 'feeds.safetensors')}`;
    const r = await compileContext({ graphs: [join(dir, 'g.onnx')], outDir: join(dir, 'out'), contextName: 'g', arch: V81, fp16: false, timeoutSeconds: 300 });
    // What forge knows after a QAIRT compile: the graph's name inside the binary, and the source graph's I/O.
    writeEpContextWrapper(join(dir, 'out', 'forge_ctx.onnx'), {
      qnnGraph: r.bins[0].graphs![0], bin: 'g.bin', sdkVersion: r.epSdkVersion,
      inputs: [{ name: 'x', dtype: 'float32', shape: [1, 64] }, { name: 'k', dtype: 'int32', shape: [1, 48] }], outputs: [{ name: 'y', dtype: 'float32', shape: [1, 48] }],
    });
    const run = async (wrapper: string) => {
      const out = join(dir, `${wrapper}.out.safetensors`);
      const r = await simulateBatch(python, qnnSimulateScript(), join(dir, 'out', wrapper), V81, false, join(dir, 'feeds.safetensors'), out, 300, `simulating ${wrapper}`);
      expect(r.providers[0]).toBe('QNNExecutionProvider');
      const file = await openSafetensors(out);
      try {
        const y = file.tensors.get('0/y')!;
        return toFloat32(y.dtype, await file.read(y.name));
      } finally {
        await file.close();
      }
    };
    const ours = await run('forge_ctx.onnx');
    const theirs = await run('g_ctx.onnx');
    expect(ours.length).toBe(48);
    expect(Array.from(ours)).toEqual(Array.from(theirs));
    expect(ours.some((v) => v !== 0)).toBe(true);
  }, 300_000);
});
