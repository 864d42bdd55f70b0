// Specification of the NaN/Inf weight scan fetch runs on every checkpoint.
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { checkFinite, firstNonFinite } from '../../src/io/finite.js';
import { f32ToBf16Bits, f32ToF16Bits, type DType } from '../../src/io/dtype.js';
import { writeSafetensors } from '../../src/io/safetensors-writer.js';
import { expectCheckpointError, tempDir } from './helpers.js';

const bytesOf = (v: ArrayBufferView) => new Uint8Array(v.buffer, v.byteOffset, v.byteLength);

function encode(dtype: DType, values: number[]): Uint8Array {
  if (dtype === 'BF16') return bytesOf(Uint16Array.from(values, f32ToBf16Bits));
  if (dtype === 'F16') return bytesOf(Uint16Array.from(values, f32ToF16Bits));
  if (dtype === 'F32') return bytesOf(Float32Array.from(values));
  return bytesOf(Float64Array.from(values));
}

describe('firstNonFinite', () => {
  for (const dtype of ['BF16', 'F16', 'F32', 'F64'] as const) {
    it(`finds the first NaN or ±Inf in ${dtype} data at any position, odd lengths included`, () => {
      // The largest finite values, subnormals and negative zero are finite; an all-ones exponent is not.
      const max = dtype === 'F16' ? 65504 : dtype === 'BF16' ? 3.3895313892515355e38 : dtype === 'F32' ? 3.4028234663852886e38 : Number.MAX_VALUE;
      const finite = [0, -0, 1, -1, max, -max, 1e-40, 5.96e-8, 123.5];
      expect(firstNonFinite(dtype, encode(dtype, finite))).toBe(-1);
      for (const bad of [NaN, Infinity, -Infinity]) {
        for (const length of [1, 2, 7, 8, 33]) {
          for (const at of [0, length - 1, length >> 1]) {
            const values = Array.from({ length }, (_, i) => finite[i % finite.length]);
            values[at] = bad;
            expect(firstNonFinite(dtype, encode(dtype, values)), `${bad} at ${at} of ${length}`).toBe(at);
          }
        }
      }
    });
  }

  it('reports the first of several bad values, and ignores integer tensors', () => {
    expect(firstNonFinite('BF16', encode('BF16', [1, 2, NaN, 3, Infinity]))).toBe(2);
    expect(firstNonFinite('I32', bytesOf(Int32Array.from([-1, 0x7f800000])))).toBe(-1);
  });

  it('finds F8 E5M2 Inf/NaN and the E4M3 NaN pattern', () => {
    expect(firstNonFinite('F8_E5M2', Uint8Array.from([0x3c, 0x7b, 0x7c]))).toBe(2);
    expect(firstNonFinite('F8_E4M3', Uint8Array.from([0x7e, 0xfe, 0xff]))).toBe(2);
  });
});

describe('checkFinite', () => {
  it('passes a finite checkpoint and counts the floating tensors and bytes it read', async () => {
    const path = join(await tempDir(), 'model.safetensors');
    await writeSafetensors(path, [
      { name: 'a', dtype: 'BF16', shape: [3, 5], data: Uint16Array.from({ length: 15 }, (_, i) => f32ToBf16Bits(i)) },
      { name: 'ids', dtype: 'I64', shape: [2], data: BigInt64Array.from([1n, -1n]) },
      { name: 'b', dtype: 'F32', shape: [4], data: Float32Array.from([1, 2, 3, 4]) },
    ]);
    expect(await checkFinite([path])).toEqual({ tensors: 2, bytes: 30 + 16 });
  });

  it('refuses a tensor holding NaN, naming the file, the tensor, the flat index and what is there', async () => {
    const path = join(await tempDir(), 'model.safetensors');
    const values = new Float32Array(12).fill(0.5);
    values[7] = NaN;
    values[9] = Infinity;
    await writeSafetensors(path, [
      { name: 'fine', dtype: 'F16', shape: [2], data: Uint16Array.from([f32ToF16Bits(1), f32ToF16Bits(2)]) },
      { name: 'model.layers.0.mlp.up_proj.weight', dtype: 'BF16', shape: [3, 4], data: Uint16Array.from(values, f32ToBf16Bits) },
    ]);
    const e = await expectCheckpointError(checkFinite([path]), { file: path, tensor: 'model.layers.0.mlp.up_proj.weight', pattern: /NaN at flat index 7 of 12 \(BF16\)/ });
    expect(e.message).toContain('source.allowNonFinite');
    expect(e.message.split('\n')).toHaveLength(1);
  });

  it('finds Inf in the SIMD-scanned part and in the scalar tail of half-precision tensors', async () => {
    const path = join(await tempDir(), 'model.safetensors');
    for (const [dtype, conv] of [['F16', f32ToF16Bits], ['BF16', f32ToBf16Bits]] as const) {
      for (const at of [0, 7, 8, 16, 20]) {
        const values = Uint16Array.from({ length: 21 }, (_, i) => conv(i / 10));
        values[at] = conv(Infinity);
        await writeSafetensors(path, [{ name: 't', dtype, shape: [21], data: values }]);
        await expectCheckpointError(checkFinite([path]), { file: path, tensor: 't', pattern: new RegExp(`^.*: \\+Inf at flat index ${at} of 21 \\(${dtype}\\)`) });
      }
    }
  });

  it('names -Inf in the second shard, past the first 16 MiB chunk of a large tensor', async () => {
    const dir = await tempDir();
    const first = join(dir, 'a.safetensors');
    const second = join(dir, 'b.safetensors');
    await writeSafetensors(first, [{ name: 'x', dtype: 'F32', shape: [2], data: Float32Array.from([1, 2]) }]);
    const big = new Uint16Array(9 << 20).fill(f32ToBf16Bits(0.25)); // 18 MiB: two chunks
    big[(8 << 20) + 3] = f32ToBf16Bits(-Infinity);
    await writeSafetensors(second, [{ name: 'embed', dtype: 'BF16', shape: [9 << 10, 1024], data: big }]);
    await expectCheckpointError(checkFinite([first, second]), { file: second, tensor: 'embed', pattern: new RegExp(`-Inf at flat index ${(8 << 20) + 3} of ${9 << 20}`) });
  });
});
