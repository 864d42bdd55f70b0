// Streaming .safetensors writer. All tensors (name, dtype, shape) are declared up
// front so the header — which precedes the data — can be written first; data is
// then appended tensor by tensor, in declared order, in chunks of any size. Memory
// stays bounded by the caller's chunk, so synthetic multi-GB checkpoints can be
// written for benchmarks. The file appears under its final name only on close().

import { open, rename, rm, type FileHandle } from 'node:fs/promises';
import { DTYPE_BYTES, type DType } from './dtype.js';

export interface TensorSpec {
  name: string;
  dtype: DType;
  shape: readonly number[];
}

export interface TensorWithData extends TensorSpec {
  data: ArrayBufferView;
}

/**
 * Encode `header` as a safetensors header: u64 LE length + JSON padded with
 * spaces to a multiple of `align` bytes (8, like the Rust crate, so data starts
 * aligned). Exported so tests can craft headers, including invalid ones.
 */
export function encodeHeader(header: unknown, align = 8): Buffer {
  const json = Buffer.from(JSON.stringify(header), 'utf8');
  const padded = Math.ceil((8 + json.length) / align) * align - 8;
  const out = Buffer.alloc(8 + padded, 0x20);
  out.writeBigUInt64LE(BigInt(padded), 0);
  json.copy(out, 8);
  return out;
}

function byteLengthOf(spec: TensorSpec): number {
  if (!(spec.dtype in DTYPE_BYTES)) throw new Error(`tensor "${spec.name}": unknown dtype ${spec.dtype}`);
  if (!spec.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new Error(`tensor "${spec.name}": shape [${spec.shape.join(',')}] is not non-negative integers`);
  }
  return spec.shape.reduce((a, d) => a * d, 1) * DTYPE_BYTES[spec.dtype];
}

function asBytes(data: ArrayBufferView): Uint8Array {
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

interface Slot {
  spec: TensorSpec;
  begin: number; // relative to the data section
  byteLength: number;
}

export class SafetensorsWriter {
  private current = 0; // index of the tensor being written
  private writtenInCurrent = 0;
  private finished = false;

  private constructor(
    readonly path: string,
    private readonly tempPath: string,
    private readonly fh: FileHandle,
    private readonly slots: Slot[],
    private readonly dataOffset: number,
  ) {}

  /** Create the file (as `<path>.partial`) and write its header. */
  static async create(path: string, specs: readonly TensorSpec[], metadata?: Record<string, string>): Promise<SafetensorsWriter> {
    const header: Record<string, unknown> = {};
    if (metadata) header.__metadata__ = metadata;
    const slots: Slot[] = [];
    let offset = 0;
    for (const spec of specs) {
      if (spec.name === '__metadata__' || Object.prototype.hasOwnProperty.call(header, spec.name)) {
        throw new Error(`tensor name "${spec.name}" is reserved or declared twice`);
      }
      const byteLength = byteLengthOf(spec);
      header[spec.name] = { dtype: spec.dtype, shape: [...spec.shape], data_offsets: [offset, offset + byteLength] };
      slots.push({ spec, begin: offset, byteLength });
      offset += byteLength;
    }
    const encoded = encodeHeader(header);
    const tempPath = `${path}.partial`;
    const fh = await open(tempPath, 'w');
    const writer = new SafetensorsWriter(path, tempPath, fh, slots, encoded.length);
    try {
      await writer.writeAt(encoded, 0);
    } catch (err) {
      await writer.abort();
      throw err;
    }
    return writer;
  }

  /** Append `chunk` to tensor `name`, which must be the tensor due next in declared order. */
  async write(name: string, chunk: ArrayBufferView): Promise<void> {
    if (this.finished) throw new Error(`${this.path}: write after close/abort`);
    // Move past tensors already complete (including zero-sized ones) until `name`.
    while (
      this.current < this.slots.length &&
      this.slots[this.current].spec.name !== name &&
      this.writtenInCurrent === this.slots[this.current].byteLength
    ) {
      this.current++;
      this.writtenInCurrent = 0;
    }
    const slot = this.slots[this.current];
    if (!slot || slot.spec.name !== name) {
      const due = slot ? `"${slot.spec.name}" is due` : 'all tensors are complete';
      throw new Error(`${this.path}: cannot write tensor "${name}" now: ${due} (write in declared order)`);
    }
    const bytes = asBytes(chunk);
    if (this.writtenInCurrent + bytes.byteLength > slot.byteLength) {
      throw new Error(`${this.path}: tensor "${name}" overflows: ${this.writtenInCurrent + bytes.byteLength} bytes written, shape holds ${slot.byteLength}`);
    }
    await this.writeAt(bytes, this.dataOffset + slot.begin + this.writtenInCurrent);
    this.writtenInCurrent += bytes.byteLength;
  }

  /** Check that every declared byte was written, then move the file into place. */
  async close(): Promise<void> {
    if (this.finished) return;
    for (let i = this.current; i < this.slots.length; i++) {
      const written = i === this.current ? this.writtenInCurrent : 0;
      if (written !== this.slots[i].byteLength) {
        await this.abort();
        throw new Error(`${this.path}: tensor "${this.slots[i].spec.name}" got ${written} of ${this.slots[i].byteLength} bytes before close`);
      }
    }
    this.finished = true;
    await this.fh.close();
    await rename(this.tempPath, this.path);
  }

  /** Discard the partial file. */
  async abort(): Promise<void> {
    if (this.finished) return;
    this.finished = true;
    await this.fh.close().catch(() => undefined);
    await rm(this.tempPath, { force: true });
  }

  private async writeAt(bytes: Uint8Array, position: number): Promise<void> {
    let done = 0;
    while (done < bytes.byteLength) {
      const { bytesWritten } = await this.fh.write(bytes, done, bytes.byteLength - done, position + done);
      done += bytesWritten;
    }
  }
}

/** Writes tensors that are all in memory already, in one go. */
export async function writeSafetensors(path: string, tensors: readonly TensorWithData[], metadata?: Record<string, string>): Promise<void> {
  const writer = await SafetensorsWriter.create(path, tensors, metadata);
  try {
    for (const t of tensors) await writer.write(t.name, t.data);
    await writer.close();
  } catch (err) {
    await writer.abort();
    throw err;
  }
}
