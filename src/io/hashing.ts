// SHA-256 of files and buffers. Files are streamed, so hashing an 8 GB shard
// costs a read buffer of memory, not the shard.

import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';

/** Lowercase hex SHA-256 of the file at `path`, read as a stream. */
export async function sha256File(path: string): Promise<string> {
  const hash = createHash('sha256');
  // 4 MiB reads: large enough that syscall overhead is noise on big files.
  for await (const chunk of createReadStream(path, { highWaterMark: 4 << 20 })) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

/** Lowercase hex SHA-256 of in-memory bytes (or a UTF-8 string). */
export function sha256Bytes(data: ArrayBufferView | string): string {
  const hash = createHash('sha256');
  if (typeof data === 'string') hash.update(data, 'utf8');
  else hash.update(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  return hash.digest('hex');
}
