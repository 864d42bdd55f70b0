import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ExternalDataWriter, readModel, writeModel } from '../../src/onnx/index.js';
import { buildGraph, makeInputs, makeWeights, maxAbsDiff, reference, runOrt } from './fixture.js';

const dir = mkdtempSync(join(tmpdir(), 'forge-onnx-graph-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const w = makeWeights();
const { x, ids } = makeInputs();
const ref = reference(w, x, ids);
const EXTERNAL_ALL = ['model.embed_tokens.weight', 'layers.0.q_proj.weight', 'layers.0.kv_proj.weight'];

describe('build → write → onnxruntime-node matches the TS reference', () => {
  const cases: { name: string; write: (path: string) => void; external: string[] }[] = [
    {
      name: 'all inline',
      write: (p) => void writeModel(buildGraph(w), p, { externalThreshold: Infinity }),
      external: [],
    },
    {
      name: 'default threshold at write time (only the 2 KiB float32 embedding goes external)',
      write: (p) => void writeModel(buildGraph(w), p),
      external: ['model.embed_tokens.weight'],
    },
    {
      name: 'streamed through an external sink (float32, float16 and int8 weights external)',
      write: (p) => {
        const sink = new ExternalDataWriter(p + '.data', { threshold: 256 });
        writeModel(buildGraph(w, { externalSink: sink }), p);
      },
      external: EXTERNAL_ALL,
    },
  ];

  for (const c of cases) {
    it(c.name, async () => {
      const path = join(dir, `${c.name.split(' ')[0]}-${c.external.length}.onnx`);
      c.write(path);
      const m = readModel(path);
      expect(m.initializers().filter((t) => t.external).map((t) => t.name)).toEqual(c.external);
      expect(existsSync(path + '.data')).toBe(c.external.length > 0);

      const got = await runOrt(path, x, ids);
      // float32 accumulation over ≤ 32 terms vs a float64 reference.
      expect(maxAbsDiff(got.out, ref.out)).toBeLessThan(2e-5);
      expect(maxAbsDiff(got.k, ref.k)).toBeLessThan(2e-5);
    });
  }

  it('the graph uses every op the spec lists, with per-axis DequantizeLinear', () => {
    const m = readModel(join(dir, 'streamed-3.onnx'));
    const ops = new Set(m.nodes().map((n) => n.opType));
    for (const op of ['MatMul', 'Add', 'Mul', 'Softmax', 'Reshape', 'Transpose', 'Gather', 'Split', 'DequantizeLinear', 'Cast']) {
      expect(ops).toContain(op);
    }
    const dq = m.nodes().find((n) => n.opType === 'DequantizeLinear')!;
    expect(dq.attrs).toEqual({ axis: 1 });
    expect(m.initializer('layers.0.kv_proj.scale')).toMatchObject({ dtype: 'float32', dims: [32] });
    expect(m.initializer('layers.0.kv_proj.weight')).toMatchObject({ dtype: 'int8', dims: [16, 32] });
    expect(m.initializer('layers.0.q_proj.weight')).toMatchObject({ dtype: 'float16', dims: [16, 16] });
    expect(m.opsets()).toEqual({ '': 17 });
    expect(m.irVersion).toBe(8);
    // No temporary files are left behind by the atomic writes.
    expect(readdirSync(dir).filter((f) => f.includes('.tmp-'))).toEqual([]);
  });
});
