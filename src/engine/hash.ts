import { createHash, type Hash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { readdir, stat } from 'node:fs/promises';
import { join, relative, sep } from 'node:path';

/** JSON with sorted keys, so equal values hash equally whatever order they were built in. */
export function stableStringify(value: unknown): string {
  if (value === undefined) return 'null';
  if (value === null || typeof value !== 'object') return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(stableStringify).join(',')}]`;
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj).filter((k) => obj[k] !== undefined).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${stableStringify(obj[k])}`).join(',')}}`;
}

export function sha256Hex(data: string | Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}

/** Streams a file through `hash` (4 MiB reads: an 8 GB shard costs a read buffer, not the shard). */
export async function hashFile(path: string, hash: Hash): Promise<string> {
  for await (const chunk of createReadStream(path, { highWaterMark: 4 << 20 })) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

export const sha256OfFile = (path: string) => hashFile(path, createHash('sha256'));

export interface FileDigest {
  size: number;
  sha256: string;
}

/** Every regular file under dir (sorted, '/'-separated relative paths), skipping names in `skip`. */
export async function listFiles(dir: string, skip: Set<string> = new Set()): Promise<string[]> {
  const out: string[] = [];
  async function walk(d: string): Promise<void> {
    const entries = await readdir(d, { withFileTypes: true });
    for (const e of entries) {
      const p = join(d, e.name);
      const rel = relative(dir, p).split(sep).join('/');
      if (skip.has(rel)) continue;
      if (e.isDirectory()) await walk(p);
      else if (e.isFile()) out.push(rel);
      else throw new Error(`stage output ${p} is neither a file nor a directory (links are not allowed in outputs)`);
    }
  }
  await walk(dir);
  return out.sort();
}

/**
 * Content hash of a directory tree: the files' paths, sizes and sha256s, in path order. `known` may
 * give a file's sha256 without reading it (a digest forge already took of that very file); `reused`
 * counts the bytes it was not read for.
 */
export async function hashTree(dir: string, skip: Set<string> = new Set(), known?: (path: string) => string | undefined): Promise<{ contentHash: string; files: Record<string, FileDigest>; reusedBytes: number }> {
  const files: Record<string, FileDigest> = {};
  let reusedBytes = 0;
  for (const rel of await listFiles(dir, skip)) {
    const p = join(dir, rel);
    const size = (await stat(p)).size;
    const sha256 = known?.(p);
    if (sha256) reusedBytes += size;
    files[rel] = { size, sha256: sha256 ?? (await sha256OfFile(p)) };
  }
  return { contentHash: sha256Hex(stableStringify(files)), files, reusedBytes };
}
