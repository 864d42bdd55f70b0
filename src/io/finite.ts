// NaN and ±Inf in a checkpoint's floating tensors are refused where they enter (the fetch stage):
// downstream, a non-finite weight only shows up as garbage logits that some comparisons cannot tell
// from agreement. The scan streams each shard once through two reused buffers (one read in flight
// while the other is scanned); bf16/f16 chunks (nearly every checkpoint) are tested in WebAssembly
// SIMD by w8-simd's max-magnitude kernel, everything else on the exponent bits in JS. FiniteScanner
// tests chunks for any reader: checkFinite here, and a local checkpoint's content digest, which
// scans the bytes it hashes (src/hub/local-digest.ts) so fetch need not read them a second time.
import { CheckpointError } from './errors.js';
import { DTYPE_BYTES, type DType } from './dtype.js';
import { openSafetensors, type SafetensorsFile, type TensorInfo } from './safetensors.js';
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
function describe(dtype: DType, bytes: Uint8Array, index: number): NonFinite['value'] {
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

/** The first non-finite element of a file: what a scan records and what its error names. */
export interface NonFinite { tensor: string; dtype: DType; index: number; count: number; value: 'NaN' | '+Inf' | '-Inf' }

/** The one-line error for a non-finite weight, the same whichever reader found it. */
export function nonFiniteError(file: string, bad: NonFinite): CheckpointError {
  return CheckpointError.at(file, bad.tensor,
    `${bad.value} at flat index ${bad.index} of ${bad.count} (${bad.dtype}): ` +
    `non-finite weights are refused (a recipe may allow them with source.allowNonFinite and a reason)`);
}

/** A piece of a .safetensors file as a reader walks it: header bytes (no tensor) or part of one tensor. */
export interface FileChunk { position: number; length: number; tensor?: TensorInfo; start: number }

/**
 * The chunks that read a file front to back: every tensor in file order in pieces of at most
 * CHUNK_BYTES (each starting on an element), preceded by the header when `withHeader`. Tensors tile
 * the data section (openSafetensors checks it), so with the header this is every byte once.
 */
export function fileChunks(file: SafetensorsFile, opts: { withHeader: boolean; floatOnly: boolean }): FileChunk[] {
  const out: FileChunk[] = [];
  if (opts.withHeader) for (let p = 0; p < file.dataOffset; p += CHUNK_BYTES) out.push({ position: p, length: Math.min(CHUNK_BYTES, file.dataOffset - p), start: 0 });
  const tensors = [...file.tensors.values()].filter((t) => !opts.floatOnly || FLOAT_DTYPES.has(t.dtype)).sort((a, b) => a.fileOffset - b.fileOffset);
  for (const t of tensors) {
    for (let start = 0; start < t.byteLength; start += CHUNK_BYTES) {
      out.push({ position: t.fileOffset + start, length: Math.min(CHUNK_BYTES, t.byteLength - start), tensor: t, start });
    }
  }
  return out;
}

/**
 * Tests chunks of tensors for NaN/Inf, whoever reads them: checkFinite below, or the local
 * checkpoint's content digest, which feeds it the chunks it hashes. Read into `buffers` (two
 * CHUNK_BYTES regions of the SIMD kernel's memory, for one read in flight while the other is
 * tested): bf16/f16 chunks there are tested in SIMD, located in JS only on a hit.
 */
export class FiniteScanner {
  private readonly simd = new Bf16W8([CHUNK_BYTES, CHUNK_BYTES]);
  readonly buffers: readonly Uint8Array[] = this.simd.regions;

  /** The first non-finite element of `data` (the chunk's bytes), or undefined; non-float chunks pass. */
  test(chunk: FileChunk, data: Uint8Array): NonFinite | undefined {
    const t = chunk.tensor;
    if (!t || !FLOAT_DTYPES.has(t.dtype)) return undefined;
    const limit = t.dtype === 'BF16' ? 0x7f80 : t.dtype === 'F16' ? 0x7c00 : 0;
    if (limit && this.simd.maxMagnitude(new Uint16Array(data.buffer, data.byteOffset, data.byteLength >>> 1)) < limit) return undefined;
    const bad = firstNonFinite(t.dtype, data);
    if (bad < 0) return undefined;
    const size = DTYPE_BYTES[t.dtype];
    return { tensor: t.name, dtype: t.dtype, index: chunk.start / size + bad, count: t.byteLength / size, value: describe(t.dtype, data, bad) };
  }

  /**
   * Reads `chunks` in order through `readInto`, one read ahead, handing each to `visit` while the
   * next is read. `visit` must be done with the bytes when it returns (its buffer is reused).
   */
  async readChunks(chunks: readonly FileChunk[], readInto: (chunk: FileChunk, target: Uint8Array) => Promise<void>,
    visit: (chunk: FileChunk, data: Uint8Array) => void): Promise<void> {
    const read = (k: number) => {
      const target = this.buffers[k & 1].subarray(0, chunks[k].length);
      return readInto(chunks[k], target).then(() => target);
    };
    let pending = chunks.length ? read(0) : undefined;
    try {
      for (let k = 0; k < chunks.length; k++) {
        const data = await pending!;
        pending = k + 1 < chunks.length ? read(k + 1) : undefined;
        visit(chunks[k], data);
      }
    } finally {
      await pending?.catch(() => {}); // never leave a read landing in a buffer someone else reuses
    }
  }
}

/**
 * Read every floating tensor of the given .safetensors files (only those `only` names, when given);
 * throws a CheckpointError naming the file, the tensor, the first bad flat index and what is there.
 * Returns what was scanned.
 */
export async function checkFinite(files: readonly string[], scanner = new FiniteScanner(), only?: ReadonlySet<string>): Promise<FiniteScan> {
  let tensors = 0, bytes = 0;
  const wanted = (t: TensorInfo) => FLOAT_DTYPES.has(t.dtype) && (only === undefined || only.has(t.name));
  for (const path of files) {
    const file = await openSafetensors(path);
    try {
      const chunks = fileChunks(file, { withHeader: false, floatOnly: true }).filter((c) => only === undefined || only.has(c.tensor!.name));
      await scanner.readChunks(chunks, (c, target) => file.readRangeInto(c.tensor!.name, c.start, target), (c, data) => {
        const bad = scanner.test(c, data);
        if (bad) throw nonFiniteError(path, bad);
        bytes += c.length;
      });
      tensors += [...file.tensors.values()].filter(wanted).length;
    } finally {
      await file.close();
    }
  }
  return { tensors, bytes };
}
