import { access, open, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { DTYPES, DTYPE_BYTES, type DType } from '../../src/io/dtype.js';
import { MAX_HEADER_BYTES, openSafetensors } from '../../src/io/safetensors.js';
import { SafetensorsWriter, encodeHeader, writeSafetensors } from '../../src/io/safetensors-writer.js';
import { entry, expectCheckpointError, tempDir, writeRawSafetensors } from './helpers.js';

/** Deterministic bytes so every position is distinguishable. */
function patternBytes(length: number, seed: number): Uint8Array {
  const out = new Uint8Array(length);
  for (let i = 0; i < length; i++) out[i] = (i * 31 + seed * 7 + 1) & 0xff;
  return out;
}

describe('writing then reading a file', () => {
  it('round-trips every dtype: dtype, shape, offsets and bytes, plus metadata', async () => {
    const path = join(await tempDir(), 'all.safetensors');
    const shapes: number[][] = [[3], [2, 3], [1, 2, 2], [], [0, 4]];
    const tensors = DTYPES.map((dtype: DType, i) => {
      const shape = shapes[i % shapes.length];
      const bytes = patternBytes(shape.reduce((a, d) => a * d, 1) * DTYPE_BYTES[dtype], i);
      return { name: `t.${dtype}`, dtype, shape, data: bytes };
    });
    await writeSafetensors(path, tensors, { format: 'pt', note: 'round trip' });

    const file = await openSafetensors(path);
    try {
      expect(file.metadata).toEqual({ format: 'pt', note: 'round trip' });
      expect(file.dataOffset % 8).toBe(0); // header padded so data is 8-byte aligned
      expect([...file.tensors.keys()]).toEqual(tensors.map((t) => t.name));
      for (const t of tensors) {
        const info = file.info(t.name);
        expect(info).toMatchObject({ name: t.name, dtype: t.dtype, shape: t.shape, byteLength: t.data.byteLength });
        expect(new Uint8Array(await file.read(t.name))).toEqual(t.data);
      }
      const f32 = tensors.find((t) => t.dtype === 'F32')!;
      expect(f32.shape).toEqual([2, 3]);
      expect(new Uint8Array(await file.readRange('t.F32', 2, 4))).toEqual(f32.data.subarray(2, 6));
    } finally {
      await file.close();
    }
  });

  it('writes a tensor streamed in chunks, in declared order only, and reveals the file only on close', async () => {
    const path = join(await tempDir(), 'streamed.safetensors');
    const big = patternBytes(4 * 1000, 3);
    const writer = await SafetensorsWriter.create(path, [
      { name: 'a', dtype: 'F32', shape: [10, 100] },
      { name: 'empty', dtype: 'F16', shape: [0] },
      { name: 'b', dtype: 'U8', shape: [2] },
    ]);
    await expect(writer.write('b', new Uint8Array(2))).rejects.toThrow(/"a" is due/);
    for (let i = 0; i < big.length; i += 512) await writer.write('a', big.subarray(i, i + 512));
    await expect(writer.write('a', new Uint8Array(1))).rejects.toThrow(/overflows/);
    await expect(access(path)).rejects.toThrow(); // not yet under its final name
    await writer.write('b', new Uint8Array([7, 9])); // skips the zero-sized tensor
    await writer.close();

    const file = await openSafetensors(path);
    expect(new Uint8Array(await file.read('a'))).toEqual(big);
    expect((await file.read('empty')).byteLength).toBe(0);
    expect([...(await file.read('b'))]).toEqual([7, 9]);
    await file.close();
  });

  it('refuses to close with tensors unwritten, and leaves no file behind', async () => {
    const path = join(await tempDir(), 'short.safetensors');
    const writer = await SafetensorsWriter.create(path, [{ name: 'w', dtype: 'F32', shape: [4] }]);
    await writer.write('w', new Float32Array(3));
    await expect(writer.close()).rejects.toThrow(/"w" got 12 of 16 bytes/);
    await expect(access(path)).rejects.toThrow();
    await expect(access(`${path}.partial`)).rejects.toThrow();
  });

  it('reads a tensor deep in a 5 GB (sparse) file without reading the file', async () => {
    const path = join(await tempDir(), 'sparse.safetensors');
    const size = 5 * 2 ** 30;
    const header = encodeHeader({ head: entry('U8', [16], 0, 16), huge: entry('U8', [size - 16], 16, size) });
    const fh = await open(path, 'w');
    await fh.write(header, 0, header.length, 0);
    await fh.truncate(header.length + size); // sparse: no disk, no memory
    await fh.write(Buffer.from('tail'), 0, 4, header.length + size - 4);
    await fh.close();

    const file = await openSafetensors(path);
    expect(file.info('huge').byteLength).toBe(size - 16);
    expect((await file.readRange('huge', size - 20, 4)).toString()).toBe('tail');
    await expectCheckpointError(file.readRange('huge', size - 20, 5), { file: path, tensor: 'huge', pattern: /outside/ });
    await file.close();
  });
});

describe('rejecting corrupt files with one error naming the file and tensor', () => {
  async function corrupt(header: unknown, data: Uint8Array | number = 0): Promise<string> {
    return writeRawSafetensors(join(await tempDir(), 'bad.safetensors'), header, data);
  }

  it('file too short for the length prefix', async () => {
    const path = join(await tempDir(), 'tiny.safetensors');
    await writeFile(path, Buffer.from([1, 2, 3]));
    await expectCheckpointError(openSafetensors(path), { file: path, pattern: /too short/ });
  });

  it('header length running past end of file', async () => {
    const path = join(await tempDir(), 'trunc.safetensors');
    const full = encodeHeader({ w: entry('F32', [2], 0, 8) });
    await writeFile(path, full.subarray(0, full.length - 10));
    await expectCheckpointError(openSafetensors(path), { file: path, pattern: /past end of file/ });
  });

  it('absurd header length (> 100 MB), even as a full u64', async () => {
    const path = join(await tempDir(), 'absurd.safetensors');
    const prefix = Buffer.alloc(16);
    prefix.writeBigUInt64LE(BigInt(MAX_HEADER_BYTES) + 1n, 0);
    await writeFile(path, prefix);
    await expectCheckpointError(openSafetensors(path), { file: path, pattern: /exceeds the 100000000-byte limit/ });
    prefix.writeBigUInt64LE(2n ** 64n - 1n, 0);
    await writeFile(path, prefix);
    await expectCheckpointError(openSafetensors(path), { file: path, pattern: /exceeds/ });
  });

  it('header that is not JSON', async () => {
    const path = join(await tempDir(), 'notjson.safetensors');
    const text = Buffer.from('{"w": {"dtype": "F32",');
    const prefix = Buffer.alloc(8);
    prefix.writeBigUInt64LE(BigInt(text.length));
    await writeFile(path, Buffer.concat([prefix, text]));
    await expectCheckpointError(openSafetensors(path), { file: path, pattern: /not valid UTF-8 JSON/ });
  });

  it('header JSON that is not an object', async () => {
    const path = await corrupt([1, 2, 3]);
    await expectCheckpointError(openSafetensors(path), { file: path, pattern: /not a JSON object/ });
  });

  it('header entry that is not an object', async () => {
    const path = await corrupt({ w: 'F32' });
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'w', pattern: /not an object/ });
  });

  it('unknown dtype', async () => {
    const path = await corrupt({ ok: entry('F32', [1], 0, 4), w: entry('F128', [1], 4, 20) }, 20);
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'w', pattern: /unknown dtype "F128"/ });
  });

  it.each([
    ['not an array', 4],
    ['negative', [-1, 4]],
    ['fractional', [1.5]],
    ['strings', ['2']],
  ])('shape %s', async (_label, shape) => {
    const path = await corrupt({ w: entry('U8', shape, 0, 4) }, 4);
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'w', pattern: /not an array of non-negative integers/ });
  });

  it('malformed data_offsets', async () => {
    const path = await corrupt({ w: { dtype: 'U8', shape: [4], data_offsets: [0] } }, 4);
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'w', pattern: /data_offsets \[0\] is not a pair/ });
    const backwards = await corrupt({ w: entry('U8', [0], 4, 0) }, 4);
    await expectCheckpointError(openSafetensors(backwards), { file: backwards, tensor: 'w', pattern: /end before they begin/ });
  });

  it('data_offsets past end of file', async () => {
    const path = await corrupt({ a: entry('F32', [2], 0, 8), w: entry('F32', [2], 8, 16) }, 12);
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'w', pattern: /run past end of file \(data section is 12 bytes\)/ });
  });

  it('byte length not equal to product(shape) × dtype size', async () => {
    const path = await corrupt({ w: entry('BF16', [2, 3], 0, 8) }, 8);
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'w', pattern: /byte length 8 .* ≠ 12/ });
  });

  it('offsets overlapping another tensor', async () => {
    const path = await corrupt({ a: entry('F32', [2], 0, 8), w: entry('F32', [2], 4, 12) }, 12);
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'w', pattern: /overlap tensor "a"/ });
  });

  it('a hole between tensors (the data must be contiguous)', async () => {
    const path = await corrupt({ a: entry('F32', [1], 0, 4), w: entry('F32', [1], 8, 12) }, 12);
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'w', pattern: /hole of 4 bytes/ });
  });

  it('a hole before the first tensor', async () => {
    const path = await corrupt({ w: entry('F32', [1], 4, 8) }, 8);
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'w', pattern: /hole of 4 bytes/ });
  });

  /** A header given as raw JSON text, so it can say what an object cannot (a key twice). */
  async function rawHeader(text: string, dataBytes: number): Promise<string> {
    const path = join(await tempDir(), 'raw.safetensors');
    const header = Buffer.from(text, 'utf8');
    const prefix = Buffer.alloc(8);
    prefix.writeBigUInt64LE(BigInt(header.length));
    await writeFile(path, Buffer.concat([prefix, header, Buffer.alloc(dataBytes)]));
    return path;
  }
  const f32 = (begin: number) => `{"dtype":"F32","shape":[1],"data_offsets":[${begin},${begin + 4}]}`;

  it('a tensor named twice at different offsets is named as a duplicate, not as a hole in an innocent tensor', async () => {
    const path = await rawHeader(`{"a":${f32(0)},"b":${f32(4)},"a":${f32(8)}}`, 12);
    const err = await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'a', pattern: /names this tensor twice/ });
    expect(err.message).not.toMatch(/hole|"b"/);
  });

  it('a tensor named twice, once through a JSON escape', async () => {
    const path = await rawHeader(`{"a":${f32(0)},"\\u0061":${f32(4)}}`, 8);
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'a', pattern: /names this tensor twice/ });
  });

  it('a field given twice inside one tensor entry', async () => {
    const path = await rawHeader('{"w":{"dtype":"F16","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 4);
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'w', pattern: /the key "dtype" twice/ });
  });

  it('equal keys in different objects, and names that hold quotes, braces and colons, are not duplicates', async () => {
    const path = await rawHeader(`{"__metadata__":{"a":"{\\":\\"}"},"a":${f32(0)},"x\\":{":${f32(4)}}`, 8);
    const file = await openSafetensors(path);
    expect([...file.tensors.keys()]).toEqual(['a', 'x":{']);
    await file.close();
  });

  it('trailing bytes after the last tensor', async () => {
    const path = await corrupt({ a: entry('F32', [1], 0, 4), w: entry('F32', [1], 4, 8) }, 10);
    await expectCheckpointError(openSafetensors(path), { file: path, tensor: 'w', pattern: /2 trailing bytes belong to no tensor/ });
  });

  it('__metadata__ values that are not strings', async () => {
    const path = await corrupt({ __metadata__: { step: 5 } });
    await expectCheckpointError(openSafetensors(path), { file: path, pattern: /__metadata__ value for "step"/ });
  });

  it('a requested tensor that is not there', async () => {
    const path = await corrupt({ a: entry('F32', [1], 0, 4) }, 4);
    const file = await openSafetensors(path);
    await expectCheckpointError(file.read('missing.weight'), { file: path, tensor: 'missing.weight', pattern: /no such tensor/ });
    await expectCheckpointError(() => file.info('missing.weight'), { file: path, tensor: 'missing.weight' });
    await file.close();
  });

  it('accepts the valid edge cases the format allows', async () => {
    // Empty header, zero-sized tensors sharing an offset, header padded with spaces.
    const empty = await corrupt({});
    expect((await openSafetensors(empty)).tensors.size).toBe(0);
    const zeros = await corrupt({ z1: entry('F32', [0], 0, 0), a: entry('U8', [2], 0, 2), z2: entry('I64', [3, 0], 2, 2) }, 2);
    const file = await openSafetensors(zeros);
    expect([...file.tensors.keys()]).toEqual(['z1', 'a', 'z2']);
    await file.close();
  });
});
