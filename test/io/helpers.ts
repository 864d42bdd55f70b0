// Shared helpers for the io specs: temp directories, hand-made (possibly corrupt)
// safetensors files, and an assertion for "fails with a CheckpointError here".

import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, expect } from 'vitest';
import { CheckpointError } from '../../src/io/errors.js';
import { encodeHeader } from '../../src/io/safetensors-writer.js';

const made: string[] = [];

/** A fresh temp directory, removed after the current test. */
export async function tempDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'forge-io-'));
  made.push(dir);
  return dir;
}

afterEach(async () => {
  await Promise.all(made.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

/** Write `header` + `data` verbatim: lets a spec describe an invalid file directly. */
export async function writeRawSafetensors(path: string, header: unknown, data: Uint8Array | number = 0): Promise<string> {
  const bytes = typeof data === 'number' ? new Uint8Array(data) : data;
  await writeFile(path, Buffer.concat([encodeHeader(header), bytes]));
  return path;
}

/** Header entry shorthand. */
export function entry(dtype: string, shape: unknown, begin: number, end: number) {
  return { dtype, shape, data_offsets: [begin, end] };
}

/** Await `action`, expect a CheckpointError at `file` (and `tensor`) whose message names them and matches `pattern`. */
export async function expectCheckpointError(
  action: Promise<unknown> | (() => unknown),
  where: { file: string; tensor?: string; pattern?: RegExp },
): Promise<CheckpointError> {
  let error: unknown;
  try {
    await (typeof action === 'function' ? action() : action);
  } catch (err) {
    error = err;
  }
  expect(error, 'expected a CheckpointError').toBeInstanceOf(CheckpointError);
  const e = error as CheckpointError;
  expect(e.file).toBe(where.file);
  expect(e.message).toContain(where.file);
  if (where.tensor !== undefined) {
    expect(e.tensor).toBe(where.tensor);
    expect(e.message).toContain(where.tensor);
  }
  if (where.pattern) expect(e.message).toMatch(where.pattern);
  return e;
}
