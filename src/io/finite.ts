// NaN and ±Inf in a checkpoint's floating tensors are refused where they enter (the fetch stage):
// downstream, a non-finite weight only shows up as garbage logits that some comparisons cannot tell
// from agreement. The scan streams each shard once through two reused buffers (one read in flight
// while the other is scanned); bf16/f16 chunks (nearly every checkpoint) are tested in WebAssembly
// SIMD by w8-simd's max-magnitude kernel, everything else on the exponent bits in JS.
import { CheckpointError } from './errors.js';
import { DTYPE_BYTES, type DType } from './dtype.js';
import { openSafetensors, type TensorInfo } from './safetensors.js';
import { Bf16W8 } from '../quant/w8-simd.js';

/** Bytes per read; a multiple of every element size. Measured: larger chunks did not read faster. */
const CHUNK_BYTES = 16 << 20;

export const FLOAT_DTYPES: ReadonlySet<DType> = new Set<DType>(['BF16', 'F16', 'F32', 'F64', 'F8_E5M2', 'F8_E4M3']);

/**
 * Index of the first non-finite element in `bytes` (whole elements of `dtype`, 8-byte aligned), or -1.
 * Half types: adding the smallest all-ones-exponent complement to the magnitude sets bit 15 exactly
 * when the exponent is all ones; two halves per word cannot carry into each other (max 0x807f).
 */
export function firstNonFinite(dtype: DType, bytes: Uint8Array): number {
  switch (dtype) {
    case 'BF16': return scanHalves(bytes, 0x0080);
    case 'F16': return scanHalves(bytes, 0x0400);
    case 'F32': {
      const w = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 2);
      let acc = 0;
      for (let i = 0; i < w.length; i++) acc |= (w[i] & 0x7fffffff) + 0x00800000;
      if ((acc & 0x80000000) === 0) return -1;
      for (let i = 0; i < w.length; i++) if ((w[i] & 0x7f800000) === 0x7f800000) return i;
      return -1;
    }
    case 'F64': {
      const f = new Float64Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 3);
      for (let i = 0; i < f.length; i++) if (f[i] - f[i] !== 0) return i;
      return -1;
    }
    case 'F8_E5M2':
      for (let i = 0; i < bytes.length; i++) if ((bytes[i] & 0x7c) === 0x7c) return i;
      return -1;
    case 'F8_E4M3': // the "fn" variant: no Inf, NaN is S.1111.111
      for (let i = 0; i < bytes.length; i++) if ((bytes[i] & 0x7f) === 0x7f) return i;
      return -1;
    default:
      return -1;
  }
}

function scanHalves(bytes: Uint8Array, carry: number): number {
  const words = bytes.byteLength >>> 2;
  const w = new Uint32Array(bytes.buffer, bytes.byteOffset, words);
  const add = carry * 0x10001;
  let acc = 0;
  for (let i = 0; i < words; i++) acc |= (w[i] & 0x7fff7fff) + add;
  const h = new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 1);
  const exp = carry === 0x0080 ? 0x7f80 : 0x7c00;
  if ((acc & 0x80008000) === 0 && (h.length & 1) === 0) return -1;
  for (let i = (acc & 0x80008000) === 0 ? h.length - 1 : 0; i < h.length; i++) if ((h[i] & exp) === exp) return i;
  return -1;
}

/** What a non-finite element is, for the message: "NaN", "+Inf" or "-Inf". */
function describe(dtype: DType, bytes: Uint8Array, index: number): string {
  const size = DTYPE_BYTES[dtype];
  const view = new DataView(bytes.buffer, bytes.byteOffset + index * size, size);
  let value: number;
  if (dtype === 'BF16') value = new Float32Array(new Uint32Array([view.getUint16(0, true) << 16]).buffer)[0];
  else if (dtype === 'F16') value = (view.getUint16(0, true) & 0x3ff) ? NaN : (view.getUint16(0, true) & 0x8000 ? -Infinity : Infinity);
  else if (dtype === 'F32') value = view.getFloat32(0, true);
  else if (dtype === 'F64') value = view.getFloat64(0, true);
  else value = dtype === 'F8_E5M2' && (view.getUint8(0) & 0x03) === 0 ? (view.getUint8(0) & 0x80 ? -Infinity : Infinity) : NaN;
  return Number.isNaN(value) ? 'NaN' : value > 0 ? '+Inf' : '-Inf';
}

export interface FiniteScan {
  tensors: number;
  bytes: number;
}

/**
 * Read every floating tensor of the given .safetensors files; throws a CheckpointError naming the
 * file, the tensor, the first bad flat index and what is there. Returns what was scanned.
 */
export async function checkFinite(files: readonly string[]): Promise<FiniteScan> {
  const simd = new Bf16W8([CHUNK_BYTES, CHUNK_BYTES]);
  const buffers = simd.regions;
  /** -1, or where the first non-finite element of the chunk is: half types in SIMD first, located only on a hit. */
  const firstBad = (dtype: DType, data: Uint8Array): number => {
    const limit = dtype === 'BF16' ? 0x7f80 : dtype === 'F16' ? 0x7c00 : 0;
    if (limit && simd.maxMagnitude(new Uint16Array(data.buffer, data.byteOffset, data.byteLength >>> 1)) < limit) return -1;
    return firstNonFinite(dtype, data);
  };
  let tensors = 0, bytes = 0;
  for (const path of files) {
    const file = await openSafetensors(path);
    try {
      // File order: the reads walk the shard front to back.
      const work = [...file.tensors.values()].filter((t) => FLOAT_DTYPES.has(t.dtype)).sort((a, b) => a.fileOffset - b.fileOffset);
      const chunks = work.flatMap((t) => chunksOf(t));
      let next = 0;
      const read = (k: number) => {
        const c = chunks[k];
        const target = buffers[k & 1].subarray(0, c.length);
        return file.readRangeInto(c.tensor.name, c.start, target).then(() => target);
      };
      let pending = chunks.length ? read(0) : undefined;
      for (; next < chunks.length; next++) {
        const data = await pending!;
        pending = next + 1 < chunks.length ? read(next + 1) : undefined;
        const c = chunks[next];
        const bad = firstBad(c.tensor.dtype, data);
        if (bad >= 0) {
          await pending?.catch(() => {});
          const size = DTYPE_BYTES[c.tensor.dtype];
          const index = c.start / size + bad;
          throw CheckpointError.at(path, c.tensor.name,
            `${describe(c.tensor.dtype, data, bad)} at flat index ${index} of ${c.tensor.byteLength / size} (${c.tensor.dtype}): ` +
            `non-finite weights are refused (a recipe may allow them with source.allowNonFinite and a reason)`);
        }
        bytes += c.length;
      }
      tensors += work.length;
    } finally {
      await file.close();
    }
  }
  return { tensors, bytes };
}

function chunksOf(t: TensorInfo): Array<{ tensor: TensorInfo; start: number; length: number }> {
  const out = [];
  for (let start = 0; start < t.byteLength; start += CHUNK_BYTES) out.push({ tensor: t, start, length: Math.min(CHUNK_BYTES, t.byteLength - start) });
  return out;
}
