import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { sha256Hex, sha256OfFile } from '../../src/engine/hash.js';
import { tempDir } from '../io/helpers.js';

describe('sha256', () => {
  it('hashes strings and bytes to the standard digest', () => {
    expect(sha256Hex('abc')).toBe('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
    expect(sha256Hex(new Uint8Array(0))).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
  });

  it('streams a file (larger than one read) to the same digest as its bytes', async () => {
    const path = join(await tempDir(), 'blob.bin');
    const bytes = new Uint8Array(9 << 20).map((_, i) => (i * 131) & 0xff); // > 2 × the 4 MiB read size
    await writeFile(path, bytes);
    expect(await sha256OfFile(path)).toBe(sha256Hex(bytes));
  });
});
