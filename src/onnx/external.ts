import { closeSync, fsyncSync, openSync, renameSync, rmSync, writeSync } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';

export interface ExternalDataWriterOptions {
  /**
   * Offset alignment of each tensor. 4096 = page size, so ORT can mmap tensors in place on
   * Linux/Android; ORT itself needs no alignment (Windows maps at 64 KiB granularity and
   * rounds the offset down itself).
   */
  align?: number;
  /** Tensors with more bytes than this go to the data file; smaller ones stay inline. */
  threshold?: number;
}

export interface ExternalRef {
  /** Path of the data file relative to the model's directory (what external_data "location" holds). */
  location: string;
  offset: number;
  length: number;
}

export const DEFAULT_ALIGN = 4096;
export const DEFAULT_THRESHOLD = 1024;

// Fixed-size writes: one writeSync is capped near 2 GiB, and zero-padding needs a source.
const CHUNK = 1 << 30;
const ZEROS = new Uint8Array(1 << 16);

let tmpCounter = 0;
export function tempPathFor(path: string): string {
  return `${path}.tmp-${process.pid}-${++tmpCounter}`;
}

/**
 * Append-only writer of one ONNX external data file. Bytes hit the (temporary) file inside
 * append(), so the caller's buffer can be dropped right after; nothing is retained here.
 * The file appears under its final name only at commit(), which the model writer calls just
 * before renaming the model itself.
 */
export class ExternalDataWriter {
  readonly path: string;
  readonly location: string;
  readonly align: number;
  readonly threshold: number;
  private fd: number | null = null;
  private tmp: string | null = null;
  private end = 0;
  private state: 'open' | 'committed' | 'aborted' = 'open';

  constructor(path: string, opts: ExternalDataWriterOptions = {}) {
    this.path = resolve(path);
    this.location = basename(this.path);
    this.align = opts.align ?? DEFAULT_ALIGN;
    this.threshold = opts.threshold ?? DEFAULT_THRESHOLD;
    if (!Number.isInteger(this.align) || this.align < 1) throw new Error(`bad alignment ${this.align}`);
  }

  get dir(): string {
    return dirname(this.path);
  }

  /** Bytes written so far (including alignment padding). */
  get size(): number {
    return this.end;
  }

  get isOpen(): boolean {
    return this.state === 'open';
  }

  /** Whether a tensor of this many bytes belongs in the data file. */
  wants(byteLength: number): boolean {
    return byteLength > this.threshold;
  }

  append(bytes: Uint8Array): ExternalRef {
    if (this.state !== 'open') throw new Error(`external data writer for ${this.path} is ${this.state}`);
    if (this.fd === null) {
      this.tmp = tempPathFor(this.path);
      this.fd = openSync(this.tmp, 'w');
    }
    const pad = (this.align - (this.end % this.align)) % this.align;
    this.writeAll(ZEROS, pad);
    const offset = this.end;
    this.writeAll(bytes, bytes.byteLength);
    return { location: this.location, offset, length: bytes.byteLength };
  }

  /**
   * Append one tensor of `total` bytes written in pieces by `fill` (so a 1.3 GB lm-head streams
   * row chunk by row chunk and is never whole in memory). The pieces must add up to `total`.
   */
  async appendChunked(total: number, fill: (write: (chunk: Uint8Array) => void) => Promise<void>): Promise<ExternalRef> {
    const ref = this.append(new Uint8Array(0));
    let written = 0;
    await fill((chunk) => {
      if (written + chunk.byteLength > total) throw new Error(`tensor at offset ${ref.offset} of ${this.path}: more than ${total} bytes written`);
      this.writeAll(chunk, chunk.byteLength);
      written += chunk.byteLength;
    });
    if (written !== total) throw new Error(`tensor at offset ${ref.offset} of ${this.path}: ${written} bytes written, ${total} declared`);
    return { ...ref, length: total };
  }

  private writeAll(src: Uint8Array, total: number): void {
    let done = 0;
    while (done < total) {
      const n = Math.min(total - done, CHUNK, src === ZEROS ? ZEROS.byteLength : CHUNK);
      const off = src === ZEROS ? 0 : done;
      const w = writeSync(this.fd!, src, off, n, this.end);
      done += w;
      this.end += w;
    }
  }

  /** Flush and move the data file to its final name. With nothing appended, no file is kept. */
  commit(): void {
    if (this.state !== 'open') throw new Error(`external data writer for ${this.path} is ${this.state}`);
    this.state = 'committed';
    if (this.fd === null) {
      rmSync(this.path, { force: true }); // a stale file from an earlier export would mislead
      return;
    }
    fsyncSync(this.fd);
    closeSync(this.fd);
    this.fd = null;
    renameSync(this.tmp!, this.path);
  }

  /** Drop everything written; the final path is left untouched. */
  abort(): void {
    if (this.state !== 'open') return;
    this.state = 'aborted';
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
    if (this.tmp) rmSync(this.tmp, { force: true });
  }
}
