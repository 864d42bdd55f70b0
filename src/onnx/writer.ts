import { closeSync, fsyncSync, openSync, renameSync, rmSync, writeSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import type { GraphBuilder } from './builder.js';
import { DEFAULT_ALIGN, DEFAULT_THRESHOLD, ExternalDataWriter, tempPathFor } from './external.js';
import { onnx } from './proto.js';

export { ExternalDataWriter, DEFAULT_ALIGN, DEFAULT_THRESHOLD } from './external.js';
export type { ExternalDataWriterOptions, ExternalRef } from './external.js';

export interface WriteModelOptions {
  /**
   * Only used when the builder has no externalSink: tensors above this many bytes go to the
   * data file at write time (default 1 KiB; Infinity keeps everything inline).
   */
  externalThreshold?: number;
  /** Data file name, in the model's directory. Default `<model file name>.data`. */
  dataFile?: string;
  /** Offset alignment for a data file made here (default 4096). */
  align?: number;
}

export interface WriteResult {
  modelPath: string;
  /** Absent when no tensor went external. */
  dataPath?: string;
  modelBytes: number;
  dataBytes: number;
}

/** Default data file path for a model path: `decode.onnx` → `decode.onnx.data`. */
export function defaultDataPath(modelPath: string): string {
  return resolve(modelPath) + '.data';
}

/** Encode in memory: bytes the builder holds stay inline, sink-written tensors stay references. */
export function encodeModel(g: GraphBuilder): Uint8Array {
  return onnx.ModelProto.encode(g.toModelProto()).finish();
}

/**
 * Write `g` to `modelPath` (+ its data file). Both are written under temporary names; the data
 * file is renamed first and the model last, so a model on disk always has complete data.
 * Same graph → same bytes: no timestamps, ordering is insertion order.
 */
export function writeModel(g: GraphBuilder, modelPath: string, opts: WriteModelOptions = {}): WriteResult {
  modelPath = resolve(modelPath);
  const sink = g.sink ?? new ExternalDataWriter(opts.dataFile ? join(dirname(modelPath), opts.dataFile) : defaultDataPath(modelPath), {
    align: opts.align ?? DEFAULT_ALIGN,
    threshold: opts.externalThreshold ?? DEFAULT_THRESHOLD,
  });
  const tmp = tempPathFor(modelPath);
  try {
    // A failed write (these checks included) drops the builder's streamed data: it is garbage.
    if (!sink.isOpen) throw new Error(`builder ${g.name}: its external data writer was already committed`);
    if (sink.dir !== dirname(modelPath)) throw new Error(`data file ${sink.path} must be in the model's directory ${dirname(modelPath)}`);
    if (opts.dataFile && opts.dataFile !== sink.location) throw new Error(`dataFile ${opts.dataFile} != sink ${sink.location}`);
    if (sink.location === basename(modelPath)) throw new Error('data file and model file share a name');
    const proto = g.toModelProto((_init, bytes) => (sink.wants(bytes.byteLength) ? sink.append(bytes) : undefined));
    const buf = onnx.ModelProto.encode(proto).finish();
    const fd = openSync(tmp, 'w');
    try {
      for (let off = 0; off < buf.byteLength; ) off += writeSync(fd, buf, off, buf.byteLength - off, off);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    const dataBytes = sink.size;
    sink.commit();
    renameSync(tmp, modelPath);
    return { modelPath, dataPath: dataBytes ? sink.path : undefined, modelBytes: buf.byteLength, dataBytes };
  } catch (e) {
    sink.abort();
    rmSync(tmp, { force: true });
    throw e;
  }
}
