// The reference export's weights in place: an fp32 linear layer reads the checkpoint tensor itself
// (a hard link to its safetensors file in the export directory, at the tensor's offset, in its stored
// dtype, Cast to float), and computes exactly what the converted fp32 copy computed.
import { existsSync, mkdirSync, readFileSync, rmSync, statSync, symlinkSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as ort from 'onnxruntime-node';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { f32ToBf16Array, f32ToF16Array } from '../../src/io/dtype.js';
import { writeSafetensors } from '../../src/io/safetensors-writer.js';
import { GraphBuilder } from '../../src/onnx/builder.js';
import { writeModel } from '../../src/onnx/writer.js';
import { ExternalDataWriter } from '../../src/onnx/external.js';
import { CheckpointLinks, type LinkFile } from '../../src/onnx/linked-data.js';
import { overwriteInitializer, readModel } from '../../src/onnx/reader.js';
import { WeightStore } from '../../src/quant/weights.js';
import { sha256OfFile } from '../../src/engine/hash.js';
import { tempDir } from '../io/helpers.js';

const IN = 24;
// Every offset a multiple of its element size ('odd', 15 elements, last so it shifts nothing).
const TENSORS = [
  { name: 'bf', dtype: 'BF16', out: 16 },
  { name: 'f32', dtype: 'F32', out: 8 },
  { name: 'half', dtype: 'F16', out: 12 },
  { name: 'odd', dtype: 'BF16', shape: [3, 5] },
] as const;

function values(n: number, seed: number): Float32Array {
  const f = new Float32Array(n);
  let x = seed;
  for (let i = 0; i < f.length; i++) {
    x = (x * 1664525 + 1013904223) >>> 0;
    f[i] = (x / 2 ** 32 - 0.5) * 0.5;
  }
  return f;
}

async function writeCheckpoint(dir: string): Promise<string> {
  mkdirSync(dir, { recursive: true });
  const file = join(dir, 'model.safetensors');
  await writeSafetensors(file, TENSORS.map((t, i) => {
    const shape = 'shape' in t ? [...t.shape] : [t.out, IN];
    const f = values(shape[0] * shape[1], i + 1);
    return { name: t.name, dtype: t.dtype, shape, data: t.dtype === 'BF16' ? f32ToBf16Array(f) : t.dtype === 'F16' ? f32ToF16Array(f) : f };
  }));
  return file;
}

/** One graph: y_t = x · W_tᵀ for each linear tensor, its weights stored by `store`. */
async function exportGraph(ckptDir: string, out: string, links?: CheckpointLinks): Promise<string> {
  mkdirSync(out, { recursive: true });
  const ckpt = await openCheckpoint(ckptDir);
  const sink = new ExternalDataWriter(join(out, 'w.data'));
  const store = new WeightStore(ckpt, sink, { inPlace: links });
  const g = new GraphBuilder('t');
  const x = g.input('x', 'float32', [1, 2, IN]);
  for (const t of TENSORS) if ('out' in t) g.output(await store.linear(g, x, t.name, [t.out, IN], 'fp32', 2), `y_${t.name}`, { shape: [1, 2, t.out] });
  // The misaligned tensor as a [3, 5] linear on its own input.
  const x5 = g.input('x5', 'float32', [1, 1, 5]);
  g.output(await store.linear(g, x5, 'odd', [3, 5], 'fp32', 1), 'y_odd', { shape: [1, 1, 3] });
  await sink.commitAsync();
  await ckpt.close();
  writeModel(g, join(out, 't.onnx'), { externalThreshold: Infinity });
  return join(out, 't.onnx');
}

async function run(model: string): Promise<Record<string, Float32Array>> {
  const s = await ort.InferenceSession.create(model, { graphOptimizationLevel: 'basic' });
  try {
    const r = await s.run({ x: new ort.Tensor('float32', values(2 * IN, 99), [1, 2, IN]), x5: new ort.Tensor('float32', values(5, 7), [1, 1, 5]) });
    return Object.fromEntries(Object.entries(r).map(([k, v]) => [k, v.data as Float32Array]));
  } finally {
    await s.release();
  }
}

describe('fp32 weights read in place from the checkpoint', () => {
  it('points each weight at its tensor in a hard link to the checkpoint file, in the stored dtype, and writes no weight bytes', async () => {
    const dir = await tempDir();
    const file = await writeCheckpoint(join(dir, 'ckpt'));
    const links = new CheckpointLinks(join(dir, 'ref'));
    const model = await exportGraph(join(dir, 'ckpt'), join(dir, 'ref'), links);
    const m = readModel(model);
    const ckpt = await openCheckpoint(join(dir, 'ckpt'));
    const want = { bf: 'bfloat16', f32: 'float32', half: 'float16' } as const;
    for (const [name, dtype] of Object.entries(want)) {
      const t = m.initializer(name);
      expect(t.dtype, name).toBe(dtype);
      expect(t.external, name).toEqual({ location: 'model.safetensors', offset: ckpt.info(name).fileOffset, length: ckpt.info(name).byteLength });
      // Cast only where the stored dtype is not already float.
      expect(m.nodes().some((n) => n.opType === 'Cast' && n.inputs[0] === name), name).toBe(dtype !== 'float32');
    }
    expect(existsSync(join(dir, 'ref', 'w.data'))).toBe(false);
    expect(statSync(join(dir, 'ref', 'model.safetensors')).ino).toBe(statSync(file).ino);
    expect(links.files()).toEqual([{ file: 'model.safetensors', bytes: statSync(file).size, how: 'hardlink' }]);
    await ckpt.close();
  });

  it('copies a tensor whose offset in its file is not a multiple of its element size, unconverted, into the data file', async () => {
    const dir = await tempDir();
    // A 1-byte tensor first pushes every tensor after it off 2-byte alignment.
    const ckptDir = join(dir, 'ckpt');
    mkdirSync(ckptDir);
    const f = values(8 * IN, 5);
    await writeSafetensors(join(ckptDir, 'model.safetensors'), [
      { name: 'flag', dtype: 'U8', shape: [1], data: new Uint8Array([1]) },
      { name: 'w', dtype: 'BF16', shape: [8, IN], data: f32ToBf16Array(f) },
    ]);
    const ckpt = await openCheckpoint(ckptDir);
    expect(ckpt.info('w').fileOffset % 2).toBe(1);
    const out = join(dir, 'ref');
    mkdirSync(out);
    const sink = new ExternalDataWriter(join(out, 'w.data'));
    const store = new WeightStore(ckpt, sink, { inPlace: new CheckpointLinks(out) });
    const g = new GraphBuilder('t');
    const x = g.input('x', 'float32', [1, 1, IN]);
    g.output(await store.linear(g, x, 'w', [8, IN], 'fp32', 1), 'y', { shape: [1, 1, 8] });
    await sink.commitAsync();
    writeModel(g, join(out, 't.onnx'), { externalThreshold: Infinity });
    const t = readModel(join(out, 't.onnx')).initializer('w');
    expect(t).toMatchObject({ dtype: 'bfloat16', external: { location: 'w.data', offset: 0, length: 8 * IN * 2 } });
    expect(readFileSync(join(out, 'w.data')).equals(await ckpt.readRaw('w'))).toBe(true);
    expect(existsSync(join(out, 'model.safetensors'))).toBe(false);
    await ckpt.close();
  });

  it('computes bit for bit what the fp32 copy computes (ORT, basic optimization)', async () => {
    const dir = await tempDir();
    await writeCheckpoint(join(dir, 'ckpt'));
    const inPlace = await run(await exportGraph(join(dir, 'ckpt'), join(dir, 'ref'), new CheckpointLinks(join(dir, 'ref'))));
    const copy = await run(await exportGraph(join(dir, 'ckpt'), join(dir, 'copy')));
    expect(readModel(join(dir, 'copy', 't.onnx')).initializer('bf').dtype).toBe('float32');
    for (const k of Object.keys(copy)) expect(new Uint32Array(inPlace[k].buffer), k).toEqual(new Uint32Array(copy[k].buffer));
  });

  it('copies the checkpoint file when it cannot be hard-linked (another filesystem), and says so', async () => {
    const dir = await tempDir();
    const file = await writeCheckpoint(join(dir, 'ckpt'));
    const logged: string[] = [];
    const refuse: LinkFile = () => {
      throw Object.assign(new Error('cross-device link'), { code: 'EXDEV' });
    };
    const links = new CheckpointLinks(join(dir, 'ref'), (m) => logged.push(m), refuse);
    const model = await exportGraph(join(dir, 'ckpt'), join(dir, 'ref'), links);
    expect(links.files()).toEqual([{ file: 'model.safetensors', bytes: statSync(file).size, how: 'copy' }]);
    expect(statSync(join(dir, 'ref', 'model.safetensors')).ino).not.toBe(statSync(file).ino);
    expect(logged.join('\n')).toMatch(/could not hard-link .*model\.safetensors into the export \(EXDEV\): copied it/);
    const copy = await run(await exportGraph(join(dir, 'ckpt'), join(dir, 'copy')));
    const got = await run(model);
    for (const k of Object.keys(copy)) expect(got[k], k).toEqual(copy[k]);
  });

  it('links the blob behind a symlinked checkpoint file (a hub snapshot), which ONNX Runtime accepts', async () => {
    const dir = await tempDir();
    const real = await writeCheckpoint(join(dir, 'ckpt'));
    mkdirSync(join(dir, 'blobs'));
    renameSync(real, join(dir, 'blobs', 'abc123'));
    symlinkSync(join(dir, 'blobs', 'abc123'), real);
    const model = await exportGraph(join(dir, 'ckpt'), join(dir, 'ref'), new CheckpointLinks(join(dir, 'ref')));
    expect(statSync(join(dir, 'ref', 'model.safetensors')).ino).toBe(statSync(join(dir, 'blobs', 'abc123')).ino);
    expect(Object.keys(await run(model))).toContain('y_bf');
  });

  it('leaves the checkpoint untouched when the export is removed, and refuses to patch a weight in a linked file', async () => {
    const dir = await tempDir();
    const file = await writeCheckpoint(join(dir, 'ckpt'));
    const before = await sha256OfFile(file);
    const model = await exportGraph(join(dir, 'ckpt'), join(dir, 'ref'), new CheckpointLinks(join(dir, 'ref')));
    expect(() => overwriteInitializer(model, 'bf', new Uint16Array(16 * IN))).toThrow(/ref\/model\.safetensors: the data of initializer bf is also reachable under 1 other name/);
    rmSync(join(dir, 'ref'), { recursive: true });
    expect(await sha256OfFile(file)).toBe(before);
    expect(statSync(file).nlink).toBe(1);
  });
});
