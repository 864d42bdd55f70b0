// placeTree: how a bundle gets from the stage cache into out/ without copying gigabytes.
import { existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { describe, expect, it } from 'vitest';
import { placeFile, placeTree } from '../../src/io/files.js';
import { tempDir } from './helpers.js';

async function tree(): Promise<string> {
  const from = join(await tempDir(), 'from');
  mkdirSync(join(from, 'sub'), { recursive: true });
  writeFileSync(join(from, 'big.bin'), Buffer.alloc(4096, 1));
  writeFileSync(join(from, 'sub', 'deep.bin'), Buffer.alloc(8192, 2));
  writeFileSync(join(from, 'README.md'), 'card');
  writeFileSync(join(from, 'meta.json'), '{}');
  return from;
}

// A second filesystem to place across (tmpfs), where this machine has one.
const SHM = '/dev/shm';
const otherFs = existsSync(SHM) && statSync(SHM).dev !== statSync(tmpdir()).dev;

describe('placeTree', () => {
  it('places files of linkAtLeast bytes or more without a copy, copies the smaller ones, and leaves out what it skips', async () => {
    const from = await tree();
    const to = join(from, '..', 'to');
    const bytes = placeTree(from, to, { linkAtLeast: 4096, skip: new Set(['meta.json']) });
    expect(bytes.copy).toBe(4);
    expect(bytes.reflink + bytes.hardlink).toBe(4096 + 8192);
    for (const f of ['big.bin', 'sub/deep.bin', 'README.md']) expect(readFileSync(join(to, f)).equals(readFileSync(join(from, f))), f).toBe(true);
    // A hard link is the same file; a reflink a file of its own.
    if (bytes.hardlink) expect(statSync(join(to, 'big.bin')).ino).toBe(statSync(join(from, 'big.bin')).ino);
    expect(statSync(join(to, 'README.md')).ino).not.toBe(statSync(join(from, 'README.md')).ino);
    expect(existsSync(join(to, 'meta.json'))).toBe(false);
  });

  it.skipIf(!otherFs)('copies a file it can neither reflink nor hard-link (another filesystem)', async () => {
    const from = await tree();
    const to = join(SHM, `forge-place-${process.pid}`);
    try {
      expect(placeFile(join(from, 'big.bin'), to)).toBe('copy');
      expect(readFileSync(to).equals(readFileSync(join(from, 'big.bin')))).toBe(true);
    } finally {
      rmSync(to, { force: true });
    }
  });
});
