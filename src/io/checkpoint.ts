// A Hugging Face checkpoint directory: `model.safetensors`, or shards listed by
// `model.safetensors.index.json` (`weight_map`: tensor name → shard file name).
// Everything about the layout is validated when opened, so later reads can only
// fail on I/O. Reads go through bounded scratch buffers: converting a tensor
// never holds its raw bytes and its converted copy whole at the same time, and
// readRows/iterRows let a caller walk a 1.3 GB embedding without holding it.

import { readFile, stat } from 'node:fs/promises';
import { dirname, isAbsolute, join, normalize, sep } from 'node:path';
import { CheckpointError, formatShape } from './errors.js';
import { DTYPE_BYTES, toFloat16Bits, toFloat32, type DType } from './dtype.js';
import { openSafetensors, type SafetensorsFile, type TensorInfo } from './safetensors.js';
import { firstDuplicateKey } from './json-duplicates.js';

export const SINGLE_FILE_NAME = 'model.safetensors';
export const INDEX_FILE_NAME = 'model.safetensors.index.json';

/** Conversion works through a scratch buffer of at most this many bytes of source data. */
const SCRATCH_BYTES = 4 << 20;
/**
 * Default size of one iterRows chunk, in bytes of f32 output. Measured: 4–8 MB
 * chunks stream a bf16 embedding ~3× faster than 64 MB ones, whose fresh
 * allocations cost more in page faults and GC than the conversion itself.
 */
const DEFAULT_CHUNK_BYTES = 8 << 20;

export interface CheckpointTensorInfo extends TensorInfo {
  /** Path of the .safetensors file that holds the tensor. */
  file: string;
}

export interface RowChunk {
  rowStart: number;
  rowCount: number;
  /** rowCount × (elements per row) values, row-major. */
  data: Float32Array;
}

export interface IterRowsOptions {
  /** Rows per chunk; default: as many as fit in `maxChunkBytes` of f32 (at least one). */
  rowsPerChunk?: number;
  maxChunkBytes?: number;
}

export interface OpenCheckpointOptions {
  /** Bytes of source data converted per step (default 4 MiB); small values exercise chunking in tests. */
  scratchBytes?: number;
}

export interface Checkpoint {
  readonly dir: string;
  /** The .safetensors files, in index order (one for a single-file checkpoint). */
  readonly files: readonly string[];
  /** `metadata` of the index JSON (e.g. total_size); `{}` for a single file. */
  readonly indexMetadata: Readonly<Record<string, unknown>>;
  /** Tensor names in index order (header order for a single file). */
  names(): string[];
  has(name: string): boolean;
  /** Throws CheckpointError when the checkpoint has no such tensor. */
  info(name: string): CheckpointTensorInfo;
  /** Throws CheckpointError "tensor X in file Y has shape [a,b], config expects [c,d]" on mismatch. */
  expectShape(name: string, shape: readonly number[]): CheckpointTensorInfo;
  readRaw(name: string): Promise<Buffer>;
  readF32(name: string): Promise<Float32Array>;
  /** IEEE half bit patterns (round-to-nearest-even from wider types). */
  readF16(name: string): Promise<Uint16Array>;
  /** Rows are slices along the first dimension (elements, for a 1-D tensor). */
  rowCount(name: string): number;
  readRowsRaw(name: string, rowStart: number, rowCount: number): Promise<Buffer>;
  /** Fill caller-owned `dst` (a whole number of rows) with the raw bytes of rows from `rowStart`: no conversion, no allocation. */
  readRowsRawInto(name: string, rowStart: number, dst: Uint8Array): Promise<Uint8Array>;
  readRows(name: string, rowStart: number, rowCount: number): Promise<Float32Array>;
  readRowsF16(name: string, rowStart: number, rowCount: number): Promise<Uint16Array>;
  /** Fill caller-owned `dst` (a whole number of rows) with rows from `rowStart`, as f32: no allocation. */
  readRowsInto(name: string, rowStart: number, dst: Float32Array): Promise<Float32Array>;
  /** Walk a tensor in row chunks as f32; each chunk is a fresh array. */
  iterRows(name: string, options?: IterRowsOptions): AsyncGenerator<RowChunk>;
  close(): Promise<void>;
}

async function isFile(path: string): Promise<boolean> {
  try {
    return (await stat(path)).isFile();
  } catch {
    return false;
  }
}

/**
 * Open a checkpoint: a directory holding `model.safetensors` (preferred when both
 * exist, as transformers does) or `model.safetensors.index.json`, or a path to a
 * single .safetensors file.
 */
export async function openCheckpoint(dir: string, options: OpenCheckpointOptions = {}): Promise<Checkpoint> {
  const scratchBytes = options.scratchBytes ?? SCRATCH_BYTES;
  if (dir.endsWith('.safetensors') && (await isFile(dir))) {
    const file = await openSafetensors(dir);
    return new CheckpointImpl(dirname(dir), [file], {}, singleFileOwners(file), scratchBytes);
  }
  const single = join(dir, SINGLE_FILE_NAME);
  if (await isFile(single)) {
    const file = await openSafetensors(single);
    return new CheckpointImpl(dir, [file], {}, singleFileOwners(file), scratchBytes);
  }
  const indexPath = join(dir, INDEX_FILE_NAME);
  if (await isFile(indexPath)) return openSharded(dir, indexPath, scratchBytes);
  throw CheckpointError.at(dir, undefined, `not a checkpoint: neither ${SINGLE_FILE_NAME} nor ${INDEX_FILE_NAME} is there`);
}

function singleFileOwners(file: SafetensorsFile): Map<string, SafetensorsFile> {
  return new Map([...file.tensors.keys()].map((name) => [name, file]));
}

/** Parse and check the index JSON; returns weight_map as tensor → shard file name. */
async function readIndex(indexPath: string): Promise<{ weightMap: Map<string, string>; metadata: Record<string, unknown> }> {
  const fail = (detail: string, tensor?: string) => CheckpointError.at(indexPath, tensor, detail);
  let json: unknown;
  let text: string;
  try {
    text = await readFile(indexPath, 'utf8');
    json = JSON.parse(text);
  } catch (err) {
    throw fail(`index is not readable JSON: ${(err as Error).message}`);
  }
  // JSON.parse keeps the last of two equal keys: a tensor listed twice would silently move shards.
  const duplicate = firstDuplicateKey(text);
  if (duplicate && duplicate.path[0] === 'weight_map' && duplicate.path.length === 1) {
    throw fail(`weight_map lists this tensor twice`, duplicate.key);
  }
  if (duplicate) throw fail(`index has the key "${duplicate.key}" twice${duplicate.path.length ? ` in ${duplicate.path.join('.')}` : ''}`);
  const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);
  if (!isObject(json)) throw fail(`index is not a JSON object`);
  if (!isObject(json.weight_map)) throw fail(`index has no "weight_map" object`);
  const weightMap = new Map<string, string>();
  for (const [name, shard] of Object.entries(json.weight_map)) {
    if (typeof shard !== 'string' || shard === '') throw fail(`weight_map entry is not a file name: ${JSON.stringify(shard)}`, name);
    // Shards live beside the index; refuse paths that would read elsewhere.
    const normal = normalize(shard);
    if (isAbsolute(shard) || normal === '..' || normal.startsWith(`..${sep}`)) {
      throw fail(`weight_map points outside the checkpoint directory: ${JSON.stringify(shard)}`, name);
    }
    weightMap.set(name, shard);
  }
  return { weightMap, metadata: isObject(json.metadata) ? json.metadata : {} };
}

async function openSharded(dir: string, indexPath: string, scratchBytes: number): Promise<Checkpoint> {
  const { weightMap, metadata } = await readIndex(indexPath);
  const firstTensorOf = new Map<string, string>(); // shard name → a tensor the index puts there
  for (const [name, shard] of weightMap) if (!firstTensorOf.has(shard)) firstTensorOf.set(shard, name);

  const shardNames = [...firstTensorOf.keys()];
  const opened = await Promise.allSettled(
    shardNames.map(async (shard) => {
      const path = join(dir, shard);
      if (!(await isFile(path))) {
        const tensor = firstTensorOf.get(shard)!;
        throw CheckpointError.at(path, tensor, `shard file is missing (index ${indexPath} maps tensor "${tensor}" to it)`);
      }
      return openSafetensors(path);
    }),
  );
  const files = opened.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  try {
    const failure = opened.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failure) throw failure.reason;
    const byShard = new Map(shardNames.map((shard, i) => [shard, files[i]]));
    return new CheckpointImpl(dir, files, metadata, checkShardsAgainstIndex(indexPath, weightMap, byShard), scratchBytes);
  } catch (err) {
    await Promise.all(files.map((f) => f.close()));
    throw err;
  }
}

/** Index and shard headers must agree exactly; returns tensor → owning file. */
function checkShardsAgainstIndex(
  indexPath: string,
  weightMap: Map<string, string>,
  byShard: Map<string, SafetensorsFile>,
): Map<string, SafetensorsFile> {
  const holder = new Map<string, SafetensorsFile>();
  // Path order, so which of two shards gets blamed does not depend on index order.
  for (const file of [...byShard.values()].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0))) {
    for (const name of file.tensors.keys()) {
      const other = holder.get(name);
      if (other) {
        throw CheckpointError.at(file.path, name, `tensor is also in shard ${other.path}: a tensor must be in exactly one shard`);
      }
      holder.set(name, file);
    }
  }
  const owners = new Map<string, SafetensorsFile>();
  for (const [name, shard] of weightMap) {
    const file = byShard.get(shard)!;
    if (!file.tensors.has(name)) {
      const actual = holder.get(name);
      const where = actual ? ` (it is in ${actual.path})` : '';
      throw CheckpointError.at(file.path, name, `index ${indexPath} lists the tensor in this shard, but the shard has no such tensor${where}`);
    }
    owners.set(name, file);
  }
  for (const file of byShard.values()) {
    for (const name of file.tensors.keys()) {
      if (!weightMap.has(name)) {
        throw CheckpointError.at(file.path, name, `tensor is in the shard but not listed in index ${indexPath}`);
      }
    }
  }
  return owners;
}

class CheckpointImpl implements Checkpoint {
  readonly files: readonly string[];

  constructor(
    readonly dir: string,
    private readonly shards: SafetensorsFile[],
    readonly indexMetadata: Readonly<Record<string, unknown>>,
    private readonly owners: Map<string, SafetensorsFile>,
    private readonly scratchBytes: number,
  ) {
    this.files = shards.map((s) => s.path);
  }

  names(): string[] {
    return [...this.owners.keys()];
  }

  has(name: string): boolean {
    return this.owners.has(name);
  }

  info(name: string): CheckpointTensorInfo {
    const { file, info } = this.locate(name);
    return { ...info, shape: [...info.shape], file: file.path };
  }

  private locate(name: string): { file: SafetensorsFile; info: TensorInfo } {
    const file = this.owners.get(name);
    if (!file) {
      const where = this.shards.length === 1 ? this.shards[0].path : this.dir;
      throw CheckpointError.at(where, name, `checkpoint has no such tensor`);
    }
    return { file, info: file.info(name) };
  }

  expectShape(name: string, shape: readonly number[]): CheckpointTensorInfo {
    const info = this.info(name);
    const same = info.shape.length === shape.length && info.shape.every((d, i) => d === shape[i]);
    if (!same) {
      throw new CheckpointError(
        `tensor ${name} in file ${info.file} has shape ${formatShape(info.shape)}, config expects ${formatShape(shape)}`,
        { file: info.file, tensor: name },
      );
    }
    return info;
  }

  async readRaw(name: string): Promise<Buffer> {
    const { file } = this.locate(name);
    return file.read(name);
  }

  async readF32(name: string): Promise<Float32Array> {
    const { info } = this.locate(name);
    return this.readElementsF32(name, 0, info.byteLength / DTYPE_BYTES[info.dtype]);
  }

  async readF16(name: string): Promise<Uint16Array> {
    const { info } = this.locate(name);
    return this.readElementsF16(name, 0, info.byteLength / DTYPE_BYTES[info.dtype]);
  }

  rowCount(name: string): number {
    const { file, info } = this.locate(name);
    if (info.shape.length === 0) throw CheckpointError.at(file.path, name, `a 0-d tensor has no rows`);
    return info.shape[0];
  }

  /** Element range of rows [rowStart, rowStart + rowCount), checked against the shape. */
  private rowElements(name: string, rowStart: number, rowCount: number): { start: number; count: number } {
    const { file, info } = this.locate(name);
    const rows = this.rowCount(name);
    if (!Number.isSafeInteger(rowStart) || !Number.isSafeInteger(rowCount) || rowStart < 0 || rowCount < 0 || rowStart + rowCount > rows) {
      throw CheckpointError.at(file.path, name, `rows [${rowStart},${rowStart + rowCount}) are outside shape ${formatShape(info.shape)}`);
    }
    const perRow = info.shape.slice(1).reduce((a, d) => a * d, 1);
    return { start: rowStart * perRow, count: rowCount * perRow };
  }

  async readRowsRaw(name: string, rowStart: number, rowCount: number): Promise<Buffer> {
    const { file, info } = this.locate(name);
    const { start, count } = this.rowElements(name, rowStart, rowCount);
    const size = DTYPE_BYTES[info.dtype];
    return file.readRange(name, start * size, count * size);
  }

  async readRowsRawInto(name: string, rowStart: number, dst: Uint8Array): Promise<Uint8Array> {
    const { file, info } = this.locate(name);
    const rowBytes = info.shape.slice(1).reduce((a, d) => a * d, 1) * DTYPE_BYTES[info.dtype];
    if (rowBytes === 0 || dst.byteLength % rowBytes !== 0) {
      throw CheckpointError.at(file.path, name, `destination of ${dst.byteLength} bytes is not a whole number of ${rowBytes}-byte rows`);
    }
    const { start } = this.rowElements(name, rowStart, dst.byteLength / rowBytes);
    await file.readRangeInto(name, start * DTYPE_BYTES[info.dtype], dst);
    return dst;
  }

  async readRows(name: string, rowStart: number, rowCount: number): Promise<Float32Array> {
    const { start, count } = this.rowElements(name, rowStart, rowCount);
    return this.readElementsF32(name, start, count);
  }

  async readRowsInto(name: string, rowStart: number, dst: Float32Array): Promise<Float32Array> {
    const { file, info } = this.locate(name);
    const perRow = info.shape.slice(1).reduce((a, d) => a * d, 1);
    if (perRow === 0 || dst.length % perRow !== 0) {
      throw CheckpointError.at(file.path, name, `destination of ${dst.length} values is not a whole number of ${perRow}-value rows`);
    }
    const { start } = this.rowElements(name, rowStart, dst.length / perRow);
    await this.convertInto(name, start, dst, (dtype, bytes, out) => toFloat32(dtype, bytes, out as Float32Array));
    return dst;
  }

  async readRowsF16(name: string, rowStart: number, rowCount: number): Promise<Uint16Array> {
    const { start, count } = this.rowElements(name, rowStart, rowCount);
    return this.readElementsF16(name, start, count);
  }

  async *iterRows(name: string, options: IterRowsOptions = {}): AsyncGenerator<RowChunk> {
    const { info } = this.locate(name);
    const rows = this.rowCount(name);
    const rowBytes = Math.max(1, info.shape.slice(1).reduce((a, d) => a * d, 1) * 4);
    const rowsPerChunk = Math.max(1, options.rowsPerChunk ?? Math.floor((options.maxChunkBytes ?? DEFAULT_CHUNK_BYTES) / rowBytes));
    for (let rowStart = 0; rowStart < rows; rowStart += rowsPerChunk) {
      const rowCount = Math.min(rowsPerChunk, rows - rowStart);
      yield { rowStart, rowCount, data: await this.readRows(name, rowStart, rowCount) };
    }
  }

  private async readElementsF32(name: string, start: number, count: number): Promise<Float32Array> {
    const out = new Float32Array(count);
    await this.convertInto(name, start, out, (dtype, bytes, dst) => toFloat32(dtype, bytes, dst as Float32Array));
    return out;
  }

  private async readElementsF16(name: string, start: number, count: number): Promise<Uint16Array> {
    const out = new Uint16Array(count);
    await this.convertInto(name, start, out, (dtype, bytes, dst) => toFloat16Bits(dtype, bytes, dst as Uint16Array));
    return out;
  }

  /**
   * Fill `out` with elements [start, start + out.length) of `name`. When the dtype
   * already matches `out`, read straight into it; otherwise convert through one
   * bounded scratch buffer, reused chunk after chunk.
   */
  private async convertInto(
    name: string,
    start: number,
    out: Float32Array | Uint16Array,
    convert: (dtype: DType, bytes: Uint8Array, dst: Float32Array | Uint16Array) => void,
  ): Promise<void> {
    const { file, info } = this.locate(name);
    const size = DTYPE_BYTES[info.dtype];
    const sameType = (out instanceof Float32Array && info.dtype === 'F32') || (out instanceof Uint16Array && info.dtype === 'F16');
    if (sameType) {
      await file.readRangeInto(name, start * size, new Uint8Array(out.buffer, out.byteOffset, out.byteLength));
      return;
    }
    const chunkElements = Math.max(1, Math.floor(this.scratchBytes / size));
    const scratch = this.takeScratch();
    try {
      for (let done = 0; done < out.length; done += chunkElements) {
        const n = Math.min(chunkElements, out.length - done);
        const bytes = scratch.subarray(0, n * size);
        await file.readRangeInto(name, (start + done) * size, bytes);
        convert(info.dtype, bytes, out.subarray(done, done + n));
      }
    } finally {
      this.spareScratch = scratch;
    }
  }

  // One scratch buffer kept between reads (a fresh multi-MB buffer per read costs
  // page faults and GC); concurrent reads each take their own.
  private spareScratch: Buffer | undefined;
  private takeScratch(): Buffer {
    const spare = this.spareScratch;
    this.spareScratch = undefined;
    // +8 so any dtype's whole elements fit; allocUnsafeSlow keeps offset 0 (aligned views).
    return spare ?? Buffer.allocUnsafeSlow(this.scratchBytes + 8);
  }

  async close(): Promise<void> {
    await Promise.all(this.shards.map((s) => s.close()));
  }
}
