import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { afterAll, describe, expect, it } from 'vitest';
import { GraphBuilder, attr, f16ToF32, f32ToF16, readModel, writeModel } from '../../src/onnx/index.js';

const dir = mkdtempSync(join(tmpdir(), 'forge-onnx-builder-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('float16 conversion', () => {
  it('matches IEEE half bit patterns, rounding to nearest even', () => {
    const cases: [number, number][] = [
      [1, 0x3c00], [-2, 0xc000], [65504, 0x7bff], [65520, 0x7c00], [2 ** -24, 0x0001],
      [2 ** -14, 0x0400], [0.1, 0x2e66], [1 + 2 ** -11, 0x3c00], [1 + 3 * 2 ** -11, 0x3c02],
      [2 ** -25, 0x0000], [-0, 0x8000], [Infinity, 0x7c00],
    ];
    for (const [v, bits] of cases) expect(f32ToF16(v), String(v)).toBe(bits);
    for (let h = 0; h < 0x7c00; h += 7) expect(f32ToF16(f16ToF32(h))).toBe(h);
    expect(Number.isNaN(f16ToF32(f32ToF16(NaN)))).toBe(true);
  });
});

describe('GraphBuilder', () => {
  it('makes node and value names unique and returns one or many outputs', () => {
    const g = new GraphBuilder('g');
    const x = g.input('x', 'float32', [2, 4]);
    const a = g.op('Relu', [x]);
    const b = g.op('Relu', [a]);
    expect([a, b]).toEqual(['Relu_out', 'Relu_1_out']);
    const parts = g.op('Split', [b], { axis: 1 }, 2);
    expect(parts).toEqual(['Split_out0', 'Split_out1']);
    const named = g.op('Add', parts, {}, 1, { name: 'sum', outputs: ['s'] });
    expect(named).toBe('s');
    expect(() => g.input('x', 'float32', [1])).toThrow(/already used/);
    expect(() => g.op('Relu', ['nope'])).toThrow(/unknown input/);
    expect(() => g.op('Foo', [x], {}, 1, { domain: 'ai.example' })).toThrow(/not imported/);
  });

  it('types attributes: inferred ints/floats/strings and explicit wrappers', () => {
    const g = new GraphBuilder('attrs');
    const x = g.input('x', 'float32', [1, 3]);
    const y = g.op('LeakyRelu', [x], { alpha: attr.float(1) });
    const z = g.op('Custom', [y], {
      i: 3, f: 0.5, s: 'hello', is: [1, -2], fs: [0.5, 1], fs2: attr.floats([1, 2]), ss: ['a', 'b'],
      t: attr.tensor(Int8Array.of(1, -1), [2]), skipped: undefined,
    }, 1, { domain: 'com.microsoft' });
    g.output(z, 'z', { dtype: 'float32', shape: null });
    const p = join(dir, 'attrs.onnx');
    writeModel(g, p);
    const m = readModel(p);
    const [leaky, custom] = m.nodes();
    expect(leaky.attrs).toEqual({ alpha: 1 });
    expect(m.proto.graph!.node![0].attribute![0].type).toBe(1); // FLOAT, not INT
    expect(custom.domain).toBe('com.microsoft');
    expect(custom.attrs).toEqual({
      i: 3, f: 0.5, s: 'hello', is: [1, -2], fs: [0.5, 1], fs2: [1, 2], ss: ['a', 'b'],
      t: { dtype: 'int8', dims: [2], data: Int8Array.of(1, -1) },
    });
    expect(m.opsets()).toEqual({ '': 17, 'com.microsoft': 1 }); // imported on first use
    expect(() => g.op('Relu', [x], { e: [] })).toThrow(/ambiguous/);
  });

  it('propagates output dtypes and records output shapes (static and symbolic)', () => {
    const g = new GraphBuilder('types');
    const x = g.input('x', 'float16', ['batch', 8]);
    const s = g.op('Shape', [x]);
    const c = g.op('Cast', [x], { to: 1 });
    const q = g.op('QuantizeLinear', [c, g.constFloat32([0.1], []), g.initializer('zp', Int8Array.of(0), [])]);
    const d = g.op('DequantizeLinear', [q, g.constFloat32([0.1], [])]);
    const e = g.op('Equal', [c, d]);
    expect([g.typeOf(x), g.typeOf(s), g.typeOf(c), g.typeOf(q), g.typeOf(d), g.typeOf(e)]).toEqual([
      'float16', 'int64', 'float32', 'int8', 'float32', 'bool',
    ]);
    g.output(e, 'eq', { shape: ['batch', 8] });
    g.output(x, 'x_copy', { shape: null }); // an input under another name goes through an Identity
    const p = join(dir, 'types.onnx');
    writeModel(g, p);
    const m = readModel(p);
    expect(m.inputs()).toEqual([{ name: 'x', dtype: 'float16', shape: ['batch', 8] }]);
    expect(m.outputs()).toEqual([
      { name: 'eq', dtype: 'bool', shape: ['batch', 8] },
      { name: 'x_copy', dtype: 'float16' },
    ]);
    expect(m.nodes().at(-1)!.opType).toBe('Identity');
  });

  it('checks initializer data against dtype and dims', () => {
    const g = new GraphBuilder('init');
    expect(() => g.initializer('a', new Float32Array(5), [2, 3])).toThrow(/need 6 elements/);
    expect(() => g.initializer('b', new Float32Array(6), [2, 3], 'float16')).toThrow(/Uint16Array/);
    expect(() => g.initializer('c', new Int8Array(2), [2], 'uint8')).toThrow(/Uint8Array/);
    g.initializer('flags', Uint8Array.of(1, 0), [2], 'bool');
    g.initializer('u16', Uint16Array.of(7), [1], 'uint16');
    expect(g.initializers().map((i) => [i.name, i.dtype, i.byteLength])).toEqual([
      ['flags', 'bool', 2],
      ['u16', 'uint16', 2],
    ]);
  });

  it('runs a bool/int32 graph and a shape-constant Reshape in onnxruntime', async () => {
    const g = new GraphBuilder('misc');
    const x = g.input('x', 'int32', [2, 3]);
    const mask = g.initializer('mask', Uint8Array.of(1, 0, 1, 0, 1, 0), [2, 3], 'bool');
    const zero = g.initializer('zero', Int32Array.of(0), []);
    const y = g.op('Reshape', [g.op('Where', [mask, x, zero]), g.constInt64([3, 2])]);
    g.output(y, 'y', { shape: [3, 2] });
    const p = join(dir, 'misc.onnx');
    writeModel(g, p);
    const sess = await ort.InferenceSession.create(p);
    const r = await sess.run({ x: new ort.Tensor('int32', Int32Array.of(1, 2, 3, 4, 5, 6), [2, 3]) });
    await sess.release();
    expect(r.y.dims).toEqual([3, 2]);
    expect(Array.from(r.y.data as Int32Array)).toEqual([1, 0, 3, 0, 5, 0]);
  });
});
