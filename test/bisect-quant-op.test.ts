// forge bisect, quantization link, op by op (src/bisect/quant-op.ts, op-match.ts): the pure parts.
// Where the cosine drops (an op's cosine against its inputs', not the first op under a threshold),
// and the pairing of a layer's fp32 ops with its shipped ones, whose matmuls are other ops with
// other names. The planted fault end to end is in test/bisect.test.ts.
import { describe, it, expect } from 'vitest';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { onnx } from '../src/onnx/proto.js';
import { cosineDrops, figures, opText } from '../src/bisect/quant-op.js';
import { graphOps, matrixName, OpKeys, pairOps } from '../src/bisect/op-match.js';

const F = onnx.TensorProto.DataType.FLOAT;

describe('where the cosine drops', () => {
  // A layer's shape: q (a matmul off the graph input), attention, o_proj, the residual add, down_proj, the output add.
  const ops = [
    { value: 'q', inputs: ['h'], cosine: 0.995 },
    { value: 'attn', inputs: ['q'], cosine: 0.991 },
    { value: 'o', inputs: ['attn'], cosine: 0.746 }, // the hostile matrix: 0.991 → 0.746
    { value: 'res', inputs: ['h', 'o'], cosine: 0.98 }, // the residual carries it, diluted
    { value: 'norm', inputs: ['res'], cosine: 0.979 },
    { value: 'down', inputs: ['norm'], cosine: 0.80 }, // a second loss, smaller: 0.979 → 0.80
    { value: 'out', inputs: ['res', 'down'], cosine: 0.92 },
  ];

  it("takes each op's inputs' lowest cosine (a graph input is 1) and names the largest drop", () => {
    const r = cosineDrops(ops);
    expect(r.inputsCosine).toEqual([1, 0.995, 0.991, 0.746, 0.98, 0.979, 0.8]);
    expect(r.largest).toBe(2);
  });

  it('is not the first op under the threshold: an op fed a value already low is not named for carrying it', () => {
    // o is the first under 0.85 and res is under too, but res only carries o's loss (its own drop is
    // 0.01); down loses the most of its own.
    const carried = [
      { value: 'q', inputs: ['h'], cosine: 0.99 },
      { value: 'o', inputs: ['q'], cosine: 0.84 }, // drop 0.15, the first under 0.85
      { value: 'res', inputs: ['o'], cosine: 0.83 }, // under too, but drop 0.01
      { value: 'down', inputs: ['res'], cosine: 0.5 }, // drop 0.33: where the damage is
    ];
    const r = cosineDrops(carried);
    expect(r.largest).toBe(3);
    const firstUnder = carried.findIndex((o) => o.cosine < 0.85);
    expect(firstUnder).toBe(1);
  });

  it('names nothing when no op loses cosine, the first of equal drops otherwise, and counts a non-finite op (−1) as a drop', () => {
    expect(cosineDrops([{ value: 'a', inputs: ['x'], cosine: 1 }, { value: 'b', inputs: ['a'], cosine: 1 }]).largest).toBeUndefined();
    expect(cosineDrops([{ value: 'a', inputs: ['x'], cosine: 0.9 }, { value: 'b', inputs: ['x'], cosine: 0.9 }]).largest).toBe(0);
    expect(cosineDrops([{ value: 'a', inputs: ['x'], cosine: 0.5 }, { value: 'b', inputs: ['a'], cosine: -1 }]).largest).toBe(1);
  });
});

/** A tiny model file: `nodes` over graph input `h` [1, 1, 4] and float initializers. */
function model(dir: string, name: string, nodes: onnx.INodeProto[], inits: onnx.ITensorProto[]): string {
  const path = join(dir, `${name}.onnx`);
  const g: onnx.IGraphProto = {
    name, node: nodes, initializer: inits,
    input: [{ name: 'h', type: { tensorType: { elemType: F } } }],
    output: [{ name: 'h_out', type: { tensorType: { elemType: F } } }],
  };
  writeFileSync(path, onnx.ModelProto.encode({ irVersion: 8, opsetImport: [{ domain: '', version: 17 }], graph: g }).finish());
  return path;
}

describe('pairing a layer\'s fp32 ops with its shipped ones', () => {
  const W = 'model.layers.0.mlp.down_proj.weight';
  const dir = mkdtempSync(join(tmpdir(), 'forge-quant-op-'));
  // fp32: h → norm Mul → Reshape → Gemm(·, Cast(W)) → Reshape → Add(h, ·)
  const fp32 = model(dir, 'fp32', [
    { name: 'layers.0/post_attention_layernorm/Mul', opType: 'Mul', input: ['h', 'h'], output: ['n'] },
    { name: 'layers.0/Cast', opType: 'Cast', input: [W], output: ['wf'], attribute: [{ name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: 1 }] },
    { name: 'layers.0/Reshape', opType: 'Reshape', input: ['n', 'shape2'], output: ['n2'] },
    { name: 'layers.0/Gemm', opType: 'Gemm', input: ['n2', 'wf'], output: ['y2'] },
    { name: 'layers.0/Reshape_1', opType: 'Reshape', input: ['y2', 'shape3'], output: ['y'] },
    { name: 'layers.0/Add', opType: 'Add', input: ['h', 'y'], output: ['h_out'] },
  ], [{ name: W, dataType: onnx.TensorProto.DataType.BFLOAT16, dims: [4, 4] }, { name: 'shape2', dataType: onnx.TensorProto.DataType.INT64, dims: [2] }, { name: 'shape3', dataType: onnx.TensorProto.DataType.INT64, dims: [3] }]);
  // w4: h → norm Mul → MatMulNBits(·, W codes, W.scale) → Add(h, ·), other node and value names.
  const w4 = model(dir, 'w4', [
    { name: 'layers.0/post_attention_layernorm/Mul', opType: 'Mul', input: ['h', 'h'], output: ['norm_out'] },
    { name: 'layers.0/MatMulNBits', opType: 'MatMulNBits', domain: 'com.microsoft', input: ['norm_out', W, `${W}.scale`], output: ['mm_out'] },
    { name: 'layers.0/Add', opType: 'Add', input: ['h', 'mm_out'], output: ['h_out'] },
  ], [{ name: W, dataType: onnx.TensorProto.DataType.UINT8, dims: [4, 1, 2] }, { name: `${W}.scale`, dataType: F, dims: [4] }]);

  it('pairs by what an op computes: a matmul by its matrix and input, through reshapes, weights left out', () => {
    const keys = new OpKeys();
    const s = graphOps(w4, keys), f = graphOps(fp32, keys);
    // The fp32 graph's Cast of a weight and its Reshapes are not ops; the Gemm reads the norm through them.
    expect(f.map((o) => o.node)).toEqual(['layers.0/post_attention_layernorm/Mul', 'layers.0/Gemm', 'layers.0/Add']);
    expect(f[1]).toMatchObject({ matrix: W, inputs: ['n'] });
    expect(f[2].inputs).toEqual(['h', 'y2']);
    const pairs = pairOps(s, f);
    expect(pairs.map((p) => [p.shipped.node, p.fp32.node])).toEqual([
      ['layers.0/post_attention_layernorm/Mul', 'layers.0/post_attention_layernorm/Mul'],
      ['layers.0/MatMulNBits', 'layers.0/Gemm'],
      ['layers.0/Add', 'layers.0/Add'],
    ]);
    // The figures: the shipped values' cosines, the drop at the matmul, named with its matrix.
    const r = figures(pairs, new Map([['norm_out', 1], ['mm_out', 0.7], ['h_out', 0.95]]), 0.85);
    expect(r.drop).toMatchObject({ node: 'layers.0/MatMulNBits', fp32Node: 'layers.0/Gemm', matrix: W, cosine: 0.7, inputsCosine: 1, layer: 0 });
    expect(r.ops.find((o) => o.node === 'layers.0/Add')!.inputsCosine).toBe(0.7);
    expect(opText(r.drop!)).toBe('layers.0/MatMulNBits (mlp.down_proj, MatMulNBits) cosine 0.70000 from inputs at 1.00000');
  });

  it("a weight's scale and row-range initializers name the matrix they store", () => {
    expect(matrixName(`${W}.scale`)).toBe(W);
    expect(matrixName(`${W}.rows_0_64`)).toBe(W);
    expect(matrixName(`${W}.rows_0_64.scale`)).toBe(W);
  });
});
