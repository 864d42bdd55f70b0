// Checks against torch itself, through a small committed fixture written by
// safetensors.torch.save_file (fixtures/make_torch_fixture.py): reading a file we
// did not write, and converting f32 → f16 / bf16 exactly as torch rounds.

import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { openCheckpoint } from '../../src/io/checkpoint.js';
import { f32ToBf16Array, f32ToF16Array } from '../../src/io/dtype.js';
import { openSafetensors } from '../../src/io/safetensors.js';

const FIXTURE = fileURLToPath(new URL('./fixtures/torch-written.safetensors', import.meta.url));

const isF16NaN = (h: number) => (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0;
const isBf16NaN = (h: number) => (h & 0x7f80) === 0x7f80 && (h & 0x7f) !== 0;

/** Indices where bit patterns differ, NaNs of either sign/payload counting as equal. */
function mismatches(got: Uint16Array, want: Uint16Array, isNaN: (h: number) => boolean): number[] {
  const bad: number[] = [];
  for (let i = 0; i < want.length; i++) {
    if (isNaN(want[i]) ? !isNaN(got[i]) : got[i] !== want[i]) bad.push(i);
  }
  return bad;
}

describe('a file written by torch (safetensors.torch.save_file)', () => {
  it('opens with torch’s metadata and dtypes', async () => {
    const file = await openSafetensors(FIXTURE);
    expect(file.metadata).toEqual({ format: 'pt', written_by: 'make_torch_fixture.py' });
    expect(file.info('x_f32')).toMatchObject({ dtype: 'F32', shape: [6022] });
    expect(file.info('emb_bf16')).toMatchObject({ dtype: 'BF16', shape: [6, 4] });
    expect(file.info('f8_e4m3').dtype).toBe('F8_E4M3');
    await file.close();
  });

  it('reads each dtype to the values torch stored', async () => {
    const ckpt = await openCheckpoint(FIXTURE);
    const values = async (name: string) => Array.from(await ckpt.readF32(name));
    expect(await values('i8')).toEqual([-128, -1, 0, 127]);
    expect(await values('u8')).toEqual([0, 1, 255]);
    expect(await values('i16')).toEqual([-32768, 32767]);
    expect(await values('i32')).toEqual([-(2 ** 31), Math.fround(2 ** 31 - 1)]); // 2^31 - 1 rounds to 2^31 in f32
    expect(await values('i64')).toEqual([Math.fround(-(2 ** 40) - 3), 2 ** 53, -1]);
    expect(await values('f64')).toEqual([1.5, -Infinity, 2 ** -30]);
    expect(await values('bool')).toEqual([1, 0, 1]);
    expect(await values('f8_e4m3')).toEqual([1, -448, 0.015625, 2 ** -9]);
    expect(await values('f8_e5m2')).toEqual([1, -57344, 2 ** -16]);
    const rows = await ckpt.readRows('emb_bf16', 2, 2);
    expect(Array.from(rows)).toEqual(Array.from({ length: 8 }, (_, i) => (8 + i) / 8 - 1));
    await ckpt.close();
  });

  it('rounds f32 → f16 and f32 → bf16 bit-for-bit like torch (edge values, f16-range and arbitrary bit patterns)', async () => {
    const ckpt = await openCheckpoint(FIXTURE);
    const x = await ckpt.readF32('x_f32');
    const torchF16 = new Uint16Array((await ckpt.readRaw('x_f16')).buffer, 0, x.length);
    const torchBf16 = new Uint16Array((await ckpt.readRaw('x_bf16')).buffer, 0, x.length);
    expect(mismatches(f32ToF16Array(x), torchF16, isF16NaN)).toEqual([]);
    expect(mismatches(f32ToBf16Array(x), torchBf16, isBf16NaN)).toEqual([]);
    // The checkpoint's readF16 takes the same rounding path.
    expect(await ckpt.readF16('x_f32')).toEqual(f32ToF16Array(x));
    await ckpt.close();
  });
});
