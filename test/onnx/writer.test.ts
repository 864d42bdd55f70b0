import { cpSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  ExternalDataWriter,
  GraphBuilder,
  encodeModel,
  fromFloat16,
  overwriteInitializer,
  readModel,
  writeModel,
} from '../../src/onnx/index.js';
import { buildGraph, makeInputs, makeWeights, maxAbsDiff, reference, runOrt, H } from './fixture.js';

const root = mkdtempSync(join(tmpdir(), 'forge-onnx-writer-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const w = makeWeights();
const { x, ids } = makeInputs();

function fresh(name: string): string {
  const d = join(root, name);
  mkdirSync(d, { recursive: true });
  return d;
}

/** Write the fixture graph with all three big weights streamed to decode.onnx.data. */
function writeStreamed(dir: string, align?: number): string {
  const path = join(dir, 'decode.onnx');
  const sink = new ExternalDataWriter(path + '.data', { threshold: 256, align });
  writeModel(buildGraph(w, { externalSink: sink }), path);
  return path;
}

const bytesOf = (a: ArrayBufferView) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
const original: Record<string, ArrayBufferView> = {
  'model.embed_tokens.weight': w.embed,
  'layers.0.q_proj.weight': w.wq,
  'layers.0.kv_proj.weight': w.wkv,
  'layers.0.kv_proj.scale': w.wkvScale,
  'layers.0.kv_proj.zero_point': w.wkvZero,
  'layers.0.o_proj.bias': w.bias,
};

describe('writer', () => {
  it('is deterministic: the same graph gives byte-identical model and data files', () => {
    const a = writeStreamed(fresh('det-a'));
    const b = writeStreamed(fresh('det-b'));
    expect(readFileSync(a).equals(readFileSync(b))).toBe(true);
    expect(readFileSync(a + '.data').equals(readFileSync(b + '.data'))).toBe(true);
    const g = buildGraph(w);
    expect(Buffer.from(encodeModel(g)).equals(Buffer.from(encodeModel(buildGraph(w))))).toBe(true);
    // Writing one sink-less builder twice also gives the same bytes.
    const c = join(fresh('det-c'), 'm.onnx');
    writeModel(g, c);
    const first = readFileSync(c);
    writeModel(g, c);
    expect(readFileSync(c).equals(first)).toBe(true);
  });

  for (const align of [4096, 64]) {
    it(`aligns external offsets to ${align} and records exact lengths`, () => {
      const path = writeStreamed(fresh(`align-${align}`), align);
      const data = readFileSync(path + '.data');
      const ext = readModel(path).initializers().filter((t) => t.external);
      expect(ext).toHaveLength(3);
      let end = 0;
      for (const t of ext) {
        const e = t.external!;
        expect(e.location).toBe('decode.onnx.data');
        expect(e.offset % align).toBe(0);
        expect(e.offset).toBeGreaterThanOrEqual(end); // no overlap, insertion order
        expect(e.length).toBe(t.byteLength);
        expect(data.subarray(e.offset, e.offset + e.length).equals(bytesOf(original[t.name]))).toBe(true);
        expect(data.subarray(end, e.offset).every((b) => b === 0)).toBe(true); // padding is zeros
        end = e.offset + e.length;
      }
      expect(data.byteLength).toBe(end); // no trailing padding
    });
  }

  it('round-trips through the reader: values, types, nodes, attributes', () => {
    const m = readModel(writeStreamed(fresh('rt')));
    expect(m.inputs()).toEqual([
      { name: 'x', dtype: 'float32', shape: [1, 4, H] },
      { name: 'ids', dtype: 'int64', shape: [1, 4] },
    ]);
    expect(m.outputs()).toEqual([
      { name: 'out', dtype: 'float32', shape: [1, 4, H] },
      { name: 'k_out', dtype: 'float32', shape: [1, 4, H] },
    ]);
    for (const [name, arr] of Object.entries(original)) {
      expect(Buffer.from(m.initializerBytes(name)).equals(bytesOf(arr)), name).toBe(true);
    }
    expect(fromFloat16(m.initializerData('layers.0.q_proj.weight') as Uint16Array)).toEqual(fromFloat16(w.wq));
    expect(m.initializerData('const_i64')).toEqual(BigInt64Array.of(1n, 4n, 2n, 8n));
    const nodes = m.nodes();
    expect(new Set(nodes.map((n) => n.name)).size).toBe(nodes.length);
    expect(nodes.find((n) => n.opType === 'Softmax')!.attrs).toEqual({ axis: -1 });
    expect(nodes.find((n) => n.opType === 'Cast')!.attrs).toEqual({ to: 1 });
    expect(nodes.filter((n) => n.opType === 'Transpose').map((n) => n.attrs.perm)).toContainEqual([0, 2, 3, 1]);
    const split = nodes.find((n) => n.opType === 'Split')!;
    expect(split.outputs).toEqual(['k_out', 'Split_out1']); // k renamed in place by output()
    const c = nodes.find((n) => n.opType === 'Constant')!.attrs.value as { dtype: string; dims: number[]; data: Float32Array };
    expect(c.dtype).toBe('float32');
    expect(c.dims).toEqual([]);
    expect(c.data[0]).toBeCloseTo(1 / Math.sqrt(8), 7);
  });

  it('perturbs weights in a copy (external and inline) without touching the original', async () => {
    const src = writeStreamed(fresh('perturb-src'));
    const dst = join(fresh('perturb-dst'), 'decode.onnx');
    cpSync(src, dst);
    cpSync(src + '.data', dst + '.data');
    const wkv = Int8Array.from(w.wkv, (v, i) => (i % 5 === 0 ? -v : v));
    const bias = Float32Array.from(w.bias, (v) => v + 0.25);
    overwriteInitializer(dst, 'layers.0.kv_proj.weight', wkv); // external: patched in the .data file
    overwriteInitializer(dst, 'layers.0.o_proj.bias', bias); // inline: model re-encoded
    expect(readModel(dst).initializer('layers.0.kv_proj.weight').external).toBeDefined();
    expect(readModel(dst).initializer('layers.0.o_proj.bias').external).toBeUndefined();

    const want = reference({ ...w, wkv, bias }, x, ids);
    const got = await runOrt(dst, x, ids);
    expect(maxAbsDiff(got.out, want.out)).toBeLessThan(2e-5);
    expect(maxAbsDiff(got.k, want.k)).toBeLessThan(2e-5);
    const orig = await runOrt(src, x, ids);
    expect(maxAbsDiff(orig.out, reference(w, x, ids).out)).toBeLessThan(2e-5);
    expect(() => overwriteInitializer(dst, 'layers.0.o_proj.bias', new Float32Array(3))).toThrow(/elements/);
  });

  it('writes atomically: a failed write leaves neither partial nor temporary files', () => {
    const a = fresh('atomic-a');
    const b = fresh('atomic-b');
    const sink = new ExternalDataWriter(join(a, 'decode.onnx.data'), { threshold: 256 });
    const g = buildGraph(w, { externalSink: sink });
    expect(readdirSync(a)).toHaveLength(1); // the sink's temporary data file, streamed already
    // The data file must sit next to the model; this is refused, and the sink's temp data goes.
    expect(() => writeModel(g, join(b, 'decode.onnx'))).toThrow(/model's directory/);
    expect(readdirSync(a)).toEqual([]);
    expect(readdirSync(b)).toEqual([]);
    // A rewrite replaces a stale data file; a model with nothing external removes it.
    const p = writeStreamed(a);
    expect(existsSync(p + '.data')).toBe(true);
    writeModel(buildGraph(w), p, { externalThreshold: Infinity });
    expect(readdirSync(a)).toEqual(['decode.onnx']);
  });
});

describe('large models: the proto stays tiny and tensor bytes are not retained', () => {
  const N = 16;
  const D = 1024; // 16 × 4 MiB float32 = 64 MiB of weights
  const weight = (i: number) => {
    const a = new Float32Array(D * D);
    for (let k = 0; k < a.length; k++) a[k] = ((((k >> 10) * 31 + (k & 1023) * 17 + i * 7) % 29) - 14) / 448;
    return a;
  };

  it('streams 64 MiB of initializers to the data file as they are added', async () => {
    const { setFlagsFromString } = await import('node:v8');
    const { runInNewContext } = await import('node:vm');
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;

    const dir = fresh('big');
    const path = join(dir, 'big.onnx');
    const sink = new ExternalDataWriter(path + '.data');
    const g = new GraphBuilder('big', { externalSink: sink });
    let h = g.input('x', 'float32', [1, D]);
    const refs: WeakRef<Float32Array>[] = [];
    const addLayer = (i: number) => {
      const a = weight(i);
      refs.push(new WeakRef(a));
      h = g.op('MatMul', [h, g.initializer(`layers.${i}.weight`, a, [D, D])]);
      expect(sink.size).toBeGreaterThanOrEqual((i + 1) * D * D * 4); // on disk already
    };
    for (let i = 0; i < N; i++) addLayer(i);
    g.output(h, 'y', { shape: [1, D] });

    // The builder holds no tensor bytes: no reachable buffer beyond the 1 KiB inline threshold...
    expect(g.retainedBytes()).toBe(0);
    expect(largeBuffersReachableFrom(g, 1024)).toEqual([]);
    // ...and once the caller drops them, the arrays are collectable.
    const control = new Float32Array(D);
    const keep = new GraphBuilder('control');
    keep.initializer('w', control, [D]); // no sink: the builder must keep this one
    const controlRef = new WeakRef(control);
    await new Promise((r) => setImmediate(r));
    gc();
    expect(refs.filter((r) => r.deref() !== undefined)).toHaveLength(0);
    expect(controlRef.deref()).toBeDefined();
    expect(keep.retainedBytes()).toBe(D * 4);

    const res = writeModel(g, path);
    expect(res.modelBytes).toBeLessThan(4096); // 16 references, not 64 MiB
    expect(statSync(path).size).toBe(res.modelBytes);
    expect(statSync(path + '.data').size).toBe(N * D * D * 4); // 4 MiB tensors are already aligned

    // And ORT runs it.
    const xv = Float32Array.from({ length: D }, (_, k) => Math.sin(k));
    let want = Float64Array.from(xv);
    for (let i = 0; i < N; i++) {
      const wi = weight(i);
      const next = new Float64Array(D);
      for (let r = 0; r < D; r++) for (let c = 0; c < D; c++) next[c] += want[r] * wi[r * D + c];
      want = next;
    }
    const ort = await import('onnxruntime-node');
    const sess = await ort.InferenceSession.create(path);
    const y = (await sess.run({ x: new ort.Tensor('float32', xv, [1, D]) })).y.data as Float32Array;
    await sess.release();
    const scale = Math.max(...want.map(Math.abs));
    expect(maxAbsDiff(y, want) / scale).toBeLessThan(1e-4);
  });

  it('handles external offsets past 4 GiB (sparse data file) in the reader and ORT', async () => {
    const dir = fresh('far');
    const src = writeStreamed(fresh('far-src'));
    const { onnx } = await import('../../src/onnx/proto.js');
    const { openSync, writeSync, ftruncateSync, closeSync, writeFileSync } = await import('node:fs');
    const proto = onnx.ModelProto.decode(readFileSync(src));
    const srcData = readFileSync(src + '.data');
    const FAR = 5 * 2 ** 30; // beyond any 32-bit offset
    const fd = openSync(join(dir, 'decode.onnx.data'), 'w');
    for (const t of proto.graph!.initializer!) {
      const kv = Object.fromEntries(t.externalData!.map((e) => [e.key, e.value]));
      if (!kv.location) continue;
      const off = Number(kv.offset);
      writeSync(fd, srcData, off, Number(kv.length), FAR + off);
      t.externalData!.find((e) => e.key === 'offset')!.value = String(FAR + off);
    }
    ftruncateSync(fd, FAR + srcData.byteLength);
    closeSync(fd);
    writeFileSync(join(dir, 'decode.onnx'), onnx.ModelProto.encode(proto).finish());

    const m = readModel(join(dir, 'decode.onnx'));
    expect(m.initializer('model.embed_tokens.weight').external!.offset).toBe(FAR);
    expect(Buffer.from(m.initializerBytes('model.embed_tokens.weight')).equals(bytesOf(w.embed))).toBe(true);
    const got = await runOrt(join(dir, 'decode.onnx'), x, ids);
    expect(maxAbsDiff(got.out, reference(w, x, ids).out)).toBeLessThan(2e-5);
  });
});

/** Typed arrays / ArrayBuffers above `limit` bytes reachable through properties, Maps and Sets. */
function largeBuffersReachableFrom(rootObj: unknown, limit: number): string[] {
  const seen = new Set<unknown>();
  const found: string[] = [];
  const visit = (o: unknown, path: string): void => {
    if (o === null || typeof o !== 'object' || seen.has(o)) return;
    seen.add(o);
    if (ArrayBuffer.isView(o)) {
      if (o.buffer.byteLength > limit) found.push(`${path} (${o.buffer.byteLength} B)`);
      return;
    }
    if (o instanceof ArrayBuffer) {
      if (o.byteLength > limit) found.push(path);
      return;
    }
    if (o instanceof Map) for (const [k, v] of o) { visit(k, `${path}.key`); visit(v, `${path}[${String(k)}]`); }
    if (o instanceof Set) for (const v of o) visit(v, `${path}{}`);
    for (const k of Object.getOwnPropertyNames(o)) visit((o as Record<string, unknown>)[k], `${path}.${k}`);
  };
  visit(rootObj, 'builder');
  return found;
}
