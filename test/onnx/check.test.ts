import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ExternalDataWriter, GraphBuilder, checkModel, writeModel } from '../../src/onnx/index.js';
import { buildGraph, makeWeights } from './fixture.js';
import { venvPython } from '../../src/toolchain/venv.js';

// The reference checker runs in forge's Python environment, which the test setup always creates.
const python = venvPython();
const dir = mkdtempSync(join(tmpdir(), 'forge-onnx-check-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('onnx.checker (full_check)', () => {
  it('accepts the fixture graph, inline and with external data', async () => {
    const w = makeWeights();
    const inline = join(dir, 'inline.onnx');
    writeModel(buildGraph(w), inline, { externalThreshold: Infinity });
    await checkModel(inline, python);
    const ext = join(dir, 'ext.onnx');
    writeModel(buildGraph(w, { externalSink: new ExternalDataWriter(ext + '.data', { threshold: 256 }) }), ext);
    await checkModel(ext, python);
  });

  it('rejects a graph with incompatible MatMul shapes, with the checker message', async () => {
    const g = new GraphBuilder('bad');
    const x = g.input('x', 'float32', [2, 3]);
    const y = g.op('MatMul', [x, g.initializer('w', new Float32Array(20), [4, 5])]);
    g.output(y, 'y', { shape: [2, 5] });
    const p = join(dir, 'bad.onnx');
    writeModel(g, p);
    await expect(checkModel(p, python)).rejects.toThrow(/onnx checker rejected .*bad\.onnx: .*(MatMul|Incompatible)/s);
  });

  it('rejects outputs without a shape, which is why output() asks for one', async () => {
    const g = new GraphBuilder('noshape');
    g.output(g.op('Relu', [g.input('x', 'float32', [1])]), 'y', { shape: null });
    const p = join(dir, 'noshape.onnx');
    writeModel(g, p);
    await expect(checkModel(p, python)).rejects.toThrow(/'shape' of 'type' is required/);
  });

  it('reports a missing python clearly', async () => {
    const g = new GraphBuilder('ok');
    g.output(g.op('Relu', [g.input('x', 'float32', [1])]), 'y', { shape: [1] });
    const p = join(dir, 'ok.onnx');
    writeModel(g, p);
    await expect(checkModel(p, join(dir, 'no-such-python'))).rejects.toThrow(/cannot run .*no-such-python/);
  });
});
