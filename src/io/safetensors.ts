// Reading one .safetensors file with positional reads only: the header is parsed
// and validated up front, tensor data is read on demand, so memory stays bounded
// by what the caller asks for — never the file.
//
// Format: u64 little-endian header length N, N bytes of JSON
// `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__"?: {str: str}}`,
// then the data section; offsets are relative to the start of the data section.
// Validation follows the `safetensors` Rust crate: known dtype, byte length equal
// to product(shape) × dtype size, and tensors that tile the data section exactly
// (sorted by offset, each beginning where the previous ended, no holes, no
// overlap, no trailing bytes).

import { open, type FileHandle } from 'node:fs/promises';
import { CheckpointError } from './errors.js';
import { DTYPE_BYTES, isDType, type DType } from './dtype.js';
import { firstDuplicateKey } from './json-duplicates.js';

/** Headers larger than this are refused as corrupt (same limit as the Rust crate). */
export const MAX_HEADER_BYTES = 100_000_000;

export interface TensorInfo {
  name: string;
  dtype: DType;
  shape: number[];
  /** Size of the tensor's data in bytes. */
  byteLength: number;
  /** Absolute position of the tensor's first byte in the file. */
  fileOffset: number;
}

export interface SafetensorsFile {
  readonly path: string;
  /** Tensors in header order. */
  readonly tensors: ReadonlyMap<string, TensorInfo>;
  /** The `__metadata__` string map (empty when absent). */
  readonly metadata: Readonly<Record<string, string>>;
  /** Absolute position of the data section (8 + header length). */
  readonly dataOffset: number;
  readonly fileSize: number;
  /** Info for `name`; throws CheckpointError naming file and tensor when absent. */
  info(name: string): TensorInfo;
  /** The whole tensor's bytes, in a fresh buffer of its own (offset 0, so typed views align). */
  read(name: string): Promise<Buffer>;
  /** `byteLength` bytes of tensor `name` starting `byteStart` bytes into it. */
  readRange(name: string, byteStart: number, byteLength: number): Promise<Buffer>;
  /** Like readRange, into caller-owned memory (e.g. a view of an output typed array). */
  readRangeInto(name: string, byteStart: number, target: Uint8Array): Promise<void>;
  close(): Promise<void>;
}

// FileHandle.read takes at most ~2 GiB per call; stay well under it.
const MAX_READ_CHUNK = 1 << 30;

/** Fill `target` from `position`, looping over short reads. */
export async function readFully(fh: FileHandle, target: Uint8Array, position: number, file: string): Promise<void> {
  let done = 0;
  while (done < target.byteLength) {
    const want = Math.min(target.byteLength - done, MAX_READ_CHUNK);
    const { bytesRead } = await fh.read(target, done, want, position + done);
    if (bytesRead === 0) {
      throw CheckpointError.at(file, undefined, `unexpected end of file at byte ${position + done} (file truncated while open?)`);
    }
    done += bytesRead;
  }
}

export async function openSafetensors(path: string): Promise<SafetensorsFile> {
  let fh: FileHandle;
  try {
    fh = await open(path, 'r');
  } catch (err) {
    throw CheckpointError.at(path, undefined, `cannot open: ${(err as Error).message}`, err);
  }
  try {
    const fileSize = (await fh.stat()).size;
    const parsed = await readHeader(fh, path, fileSize);
    return new SafetensorsFileImpl(fh, path, fileSize, parsed);
  } catch (err) {
    await fh.close();
    throw err;
  }
}

interface ParsedHeader {
  dataOffset: number;
  tensors: Map<string, TensorInfo>;
  metadata: Record<string, string>;
}

async function readHeader(fh: FileHandle, file: string, fileSize: number): Promise<ParsedHeader> {
  const fail = (detail: string, tensor?: string) => CheckpointError.at(file, tensor, detail);
  if (fileSize < 8) throw fail(`file is ${fileSize} bytes, too short for the 8-byte header length`);
  const prefix = Buffer.alloc(8);
  await readFully(fh, prefix, 0, file);
  const headerLength64 = prefix.readBigUInt64LE(0);
  if (headerLength64 > BigInt(MAX_HEADER_BYTES)) {
    throw fail(`header length ${headerLength64} bytes exceeds the ${MAX_HEADER_BYTES}-byte limit (corrupt or not a safetensors file)`);
  }
  const headerLength = Number(headerLength64);
  if (8 + headerLength > fileSize) {
    throw fail(`header length ${headerLength} bytes runs past end of file (file is ${fileSize} bytes)`);
  }
  const headerBytes = Buffer.alloc(headerLength);
  await readFully(fh, headerBytes, 8, file);

  let json: unknown;
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(headerBytes);
    json = JSON.parse(text);
  } catch (err) {
    throw fail(`header is not valid UTF-8 JSON: ${(err as Error).message}`);
  }
  if (json === null || typeof json !== 'object' || Array.isArray(json)) {
    throw fail(`header is not a JSON object`);
  }
  const duplicate = firstDuplicateKey(text);
  if (duplicate?.path.length === 0) {
    throw fail(`the header names this tensor twice (a JSON parser would silently keep only the last entry)`, duplicate.key);
  }
  if (duplicate) throw fail(`header entry has the key "${duplicate.key}" twice`, duplicate.path[0]);

  const dataOffset = 8 + headerLength;
  const dataLength = fileSize - dataOffset;
  let metadata: Record<string, string> = {};
  const tensors = new Map<string, TensorInfo>();
  // Offsets relative to the data section, kept for the coverage check below.
  const spans: { name: string; begin: number; end: number }[] = [];

  for (const [name, entry] of Object.entries(json as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) throw fail(`__metadata__ is not an object`);
      for (const [key, value] of Object.entries(entry)) {
        if (typeof value !== 'string') throw fail(`__metadata__ value for ${JSON.stringify(key)} is not a string`);
      }
      // fromEntries defines own properties, so a "__proto__" key stays data.
      metadata = Object.fromEntries(Object.entries(entry as Record<string, string>));
      continue;
    }
    if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) throw fail(`header entry is not an object`, name);
    const { dtype, shape, data_offsets: offsets } = entry as Record<string, unknown>;

    if (!isDType(dtype)) throw fail(`unknown dtype ${JSON.stringify(dtype)}`, name);
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw fail(`shape ${JSON.stringify(shape)} is not an array of non-negative integers`, name);
    }
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isSafeInteger(o) && o >= 0)) {
      throw fail(`data_offsets ${JSON.stringify(offsets)} is not a pair of non-negative integers`, name);
    }
    const [begin, end] = offsets as [number, number];
    if (end < begin) throw fail(`data_offsets [${begin},${end}] end before they begin`, name);
    if (end > dataLength) {
      throw fail(`data_offsets [${begin},${end}] run past end of file (data section is ${dataLength} bytes)`, name);
    }
    // BigInt so absurd shapes cannot overflow into a false match.
    const expected = (shape as number[]).reduce((acc, d) => acc * BigInt(d), 1n) * BigInt(DTYPE_BYTES[dtype]);
    if (BigInt(end - begin) !== expected) {
      throw fail(
        `byte length ${end - begin} (data_offsets [${begin},${end}]) ≠ ${expected} = product of shape ${JSON.stringify(shape)} × ${DTYPE_BYTES[dtype]} bytes (${dtype})`,
        name,
      );
    }
    tensors.set(name, { name, dtype, shape: shape as number[], byteLength: end - begin, fileOffset: dataOffset + begin });
    spans.push({ name, begin, end });
  }

  checkCoverage(spans, dataLength, file);
  return { dataOffset, tensors, metadata };
}

/** Tensors must tile [0, dataLength) exactly, as the Rust crate demands. */
function checkCoverage(spans: { name: string; begin: number; end: number }[], dataLength: number, file: string): void {
  spans.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let expectedBegin = 0;
  let previous: string | undefined;
  for (const span of spans) {
    if (span.begin < expectedBegin) {
      throw CheckpointError.at(
        file,
        span.name,
        `data_offsets [${span.begin},${span.end}] overlap tensor ${JSON.stringify(previous)} (which ends at ${expectedBegin})`,
      );
    }
    if (span.begin > expectedBegin) {
      throw CheckpointError.at(
        file,
        span.name,
        `data_offsets [${span.begin},${span.end}] leave a hole of ${span.begin - expectedBegin} bytes before them ` +
          `(previous data ends at ${expectedBegin}); tensors must be contiguous`,
      );
    }
    expectedBegin = span.end;
    previous = span.name;
  }
  if (expectedBegin !== dataLength) {
    throw CheckpointError.at(
      file,
      previous,
      `data section is ${dataLength} bytes but tensors cover only ${expectedBegin}: ${dataLength - expectedBegin} trailing bytes belong to no tensor`,
    );
  }
}

class SafetensorsFileImpl implements SafetensorsFile {
  readonly tensors: ReadonlyMap<string, TensorInfo>;
  readonly metadata: Readonly<Record<string, string>>;
  readonly dataOffset: number;
  private closed = false;

  constructor(
    private readonly fh: FileHandle,
    readonly path: string,
    readonly fileSize: number,
    parsed: ParsedHeader,
  ) {
    this.tensors = parsed.tensors;
    this.metadata = parsed.metadata;
    this.dataOffset = parsed.dataOffset;
  }

  info(name: string): TensorInfo {
    const info = this.tensors.get(name);
    if (!info) throw CheckpointError.at(this.path, name, `no such tensor in this file`);
    return info;
  }

  async read(name: string): Promise<Buffer> {
    const info = this.info(name);
    return this.readRange(name, 0, info.byteLength);
  }

  async readRange(name: string, byteStart: number, byteLength: number): Promise<Buffer> {
    // allocUnsafeSlow: a buffer of its own at offset 0, so Float32Array etc. views align.
    const target = Buffer.allocUnsafeSlow(byteLength);
    await this.readRangeInto(name, byteStart, target);
    return target;
  }

  async readRangeInto(name: string, byteStart: number, target: Uint8Array): Promise<void> {
    if (this.closed) throw CheckpointError.at(this.path, name, `read after close`);
    const info = this.info(name);
    const byteLength = target.byteLength;
    if (!Number.isSafeInteger(byteStart) || byteStart < 0 || byteStart + byteLength > info.byteLength) {
      throw CheckpointError.at(
        this.path,
        name,
        `byte range [${byteStart},${byteStart + byteLength}) is outside the tensor's ${info.byteLength} bytes`,
      );
    }
    await readFully(this.fh, target, info.fileOffset + byteStart, this.path);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.fh.close();
  }
}
