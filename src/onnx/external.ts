import { close, closeSync, fdatasync, fsync, fsyncSync, openSync, renameSync, rmSync, write, writeSync } from 'node:fs';
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

// appendStream starts an fdatasync in the background every this many bytes, so the disk writes
// while the caller computes instead of all at the final fsync (the kernel would otherwise hold
// gigabytes of dirty pages until its own 30 s expiry).
const FLUSH_EVERY = 256 << 20;

/** One positional write in the libuv pool, looping over short writes. */
function writeAt(fd: number, src: Uint8Array, position: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const step = (done: number): void => {
      if (done >= src.byteLength) return resolve();
      write(fd, src, done, Math.min(src.byteLength - done, CHUNK), position + done, (err, n) => (err ? reject(err) : step(done + n)));
    };
    step(0);
  });
}

const promised = (f: (cb: (err: Error | null) => void) => void) => new Promise<void>((res, rej) => f((err) => (err ? rej(err) : res())));

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
  /** Writes and flushes still in the pool; each already has a catch, so none goes unhandled. */
  private readonly pending = new Set<Promise<void>>();
  private streaming = false;
  private flushing = false;
  private unflushed = 0;
  private flushError: Error | undefined;

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
    if (this.streaming) throw new Error(`external data writer for ${this.path}: append during appendStream`);
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

  /**
   * appendChunked with asynchronous writes, so reading and computing the next chunk overlap
   * writing this one: `write` reserves the chunk's place at once and returns when its bytes are
   * in the file; the caller must not reuse the chunk's memory before then, and must have awaited
   * every write by the time `fill` resolves. No other append may run meanwhile.
   */
  async appendStream(total: number, fill: (write: (chunk: Uint8Array) => Promise<void>) => Promise<void>): Promise<ExternalRef> {
    const ref = this.append(new Uint8Array(0));
    let written = 0;
    this.streaming = true;
    try {
      await fill((chunk) => {
        if (written + chunk.byteLength > total) throw new Error(`tensor at offset ${ref.offset} of ${this.path}: more than ${total} bytes written`);
        const at = this.end;
        this.end += chunk.byteLength;
        written += chunk.byteLength;
        const done = this.track(writeAt(this.fd!, chunk, at));
        this.unflushed += chunk.byteLength;
        if (this.unflushed >= FLUSH_EVERY && !this.flushing) {
          this.unflushed = 0;
          this.flushing = true;
          const fd = this.fd!;
          this.track(promised((cb) => fdatasync(fd, cb))).then(
            () => (this.flushing = false),
            (e: Error) => (this.flushError ??= e),
          );
        }
        return done;
      });
    } finally {
      this.streaming = false;
    }
    if (written !== total) throw new Error(`tensor at offset ${ref.offset} of ${this.path}: ${written} bytes written, ${total} declared`);
    return { ...ref, length: total };
  }

  private track(p: Promise<void>): Promise<void> {
    this.pending.add(p);
    const forget = () => void this.pending.delete(p);
    p.then(forget, forget);
    return p;
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
    if (this.pending.size) throw new Error(`external data writer for ${this.path}: commit() with writes in flight (use commitAsync)`);
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

  /** commit() that waits for writes in flight and does its fsync in the pool, off the main thread. */
  async commitAsync(): Promise<void> {
    if (this.state !== 'open') throw new Error(`external data writer for ${this.path} is ${this.state}`);
    try {
      await Promise.all(this.pending);
      if (this.flushError) throw this.flushError;
      if (this.fd !== null) {
        const fd = this.fd;
        await promised((cb) => fsync(fd, cb));
      }
    } catch (e) {
      this.abort();
      throw e;
    }
    if (this.state !== 'open') throw new Error(`external data writer for ${this.path} is ${this.state}`);
    this.state = 'committed';
    if (this.fd === null) {
      rmSync(this.path, { force: true });
      return;
    }
    const fd = this.fd;
    this.fd = null;
    await promised((cb) => close(fd, cb));
    renameSync(this.tmp!, this.path);
  }

  /** Drop everything written; the final path is left untouched. */
  abort(): void {
    if (this.state !== 'open') return;
    this.state = 'aborted';
    const fd = this.fd;
    const tmp = this.tmp;
    this.fd = null;
    const drop = () => {
      if (fd !== null) closeSync(fd);
      if (tmp) rmSync(tmp, { force: true });
    };
    // Closing under a write in flight could hand its fd number to another file: wait for them.
    if (this.pending.size) void Promise.allSettled(this.pending).then(drop);
    else drop();
  }
}
