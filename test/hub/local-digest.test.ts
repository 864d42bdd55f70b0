// Local checkpoints are keyed by content: an edit that keeps the size and sets the mtime back is
// still a new key, while an unchanged file is not hashed twice (the stat cache).
import { execFileSync } from 'node:child_process';
import { linkSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { localCheckpointDigest, statCacheFile, type DigestStats } from '../../src/hub/local-digest.js';
import { hashTree, sha256OfFile } from '../../src/engine/hash.js';
import { knownDigest } from '../../src/engine/known-digests.js';
import { CheckpointLinks } from '../../src/onnx/linked-data.js';

const saved = { ...process.env };
let dir: string;
let lines: string[];
const log = (m: string) => { lines.push(m); };
const hashed = () => lines.some((l) => l.startsWith('hashing the local checkpoint'));

beforeEach(() => {
  const work = mkdtempSync(join(tmpdir(), 'forge-digest-'));
  process.env.FORGE_CACHE = join(work, 'cache');
  dir = join(work, 'model');
  mkdirSync(join(dir, 'sub'), { recursive: true });
  writeFileSync(join(dir, 'model.safetensors'), Buffer.alloc(4096, 7));
  writeFileSync(join(dir, 'config.json'), '{"hidden_size": 64}');
  writeFileSync(join(dir, 'sub', 'extra.txt'), 'x');
  lines = [];
});
afterEach(() => { process.env = { ...saved }; });

/** Rewrites one byte in place, then sets the mtime back with `touch -r` (to the nanosecond). */
function editKeepingSizeAndMtime(file: string): void {
  const before = statSync(file, { bigint: true });
  const ref = join(dir, '..', 'timestamps.ref');
  writeFileSync(ref, '');
  execFileSync('touch', ['-r', file, ref]);
  const bytes = readFileSync(file);
  bytes[bytes.length - 1] ^= 0x80;
  writeFileSync(file, bytes);
  execFileSync('touch', ['-r', ref, file]);
  const after = statSync(file, { bigint: true });
  expect([after.size, after.mtimeNs, after.ino]).toEqual([before.size, before.mtimeNs, before.ino]);
}

describe('local checkpoint digest', () => {
  it('says how much it read and how long it took, with progress by bytes; a second digest reads nothing', async () => {
    const stats = { dir: '', files: 0, hashedFiles: 0, hashedBytes: 0, seconds: -1 } as DigestStats;
    const seen: Array<[number, number, string]> = [];
    await localCheckpointDigest(dir, { racyMs: 0, stats, progress: (done, total, f) => seen.push([done, total, f]) });
    const total = 4096 + '{"hidden_size": 64}'.length + 1;
    expect(stats).toMatchObject({ dir, files: 3, hashedFiles: 3, hashedBytes: total });
    expect(stats.seconds).toBeGreaterThanOrEqual(0);
    expect(seen.map(([, t]) => t)).toEqual([total, total, total]);
    expect(seen.at(-1)![0]).toBe(total);
    await localCheckpointDigest(dir, { racyMs: 0, stats });
    expect(stats).toMatchObject({ files: 3, hashedFiles: 0, hashedBytes: 0 });
  });

  it('lets the cache commit the export\'s hard link to a digested file by its digest, without reading it, and not once its bytes change', async () => {
    const d = await localCheckpointDigest(dir, { racyMs: 0 });
    const out = join(dir, '..', 'export');
    mkdirSync(out);
    new CheckpointLinks(out).ref({ file: join(dir, 'model.safetensors'), fileOffset: 0, byteLength: 4096 }, 4); // as the fp32 export reads weights in place
    writeFileSync(join(out, 'graph.onnx'), 'new bytes');
    const tree = await hashTree(out, new Set(), knownDigest);
    expect(tree.reusedBytes).toBe(4096);
    expect(tree.files['model.safetensors'].sha256).toBe(d['model.safetensors']);
    expect(knownDigest(join(out, 'graph.onnx'))).toBeUndefined(); // never digested: read
    // Edited in place through the link, size and mtime put back: no longer the digested bytes.
    editKeepingSizeAndMtime(join(dir, 'model.safetensors'));
    const again = await hashTree(out, new Set(), knownDigest);
    expect(again.reusedBytes).toBe(0);
    expect(again.files['model.safetensors'].sha256).toBe(await sha256OfFile(join(out, 'model.safetensors')));
    expect(again.files['model.safetensors'].sha256).not.toBe(d['model.safetensors']);
  });

  it('does not vouch for a file once a link it did not make moved its ctime: that file is read', async () => {
    await localCheckpointDigest(dir, { racyMs: 0 });
    expect(knownDigest(join(dir, 'config.json'))).toBeDefined();
    linkSync(join(dir, 'config.json'), join(dir, '..', 'someone-elses-link.json'));
    expect(knownDigest(join(dir, 'config.json'))).toBeUndefined();
  });

  it('names every file by its sha256', async () => {
    const d = await localCheckpointDigest(dir, { racyMs: 0 });
    expect(Object.keys(d)).toEqual(['config.json', 'model.safetensors', 'sub/extra.txt']);
    expect(d['config.json']).toMatch(/^[0-9a-f]{64}$/);
  });

  it('gives a new digest for a same-size edit whose mtime was restored (touch -r)', async () => {
    const first = await localCheckpointDigest(dir, { racyMs: 0, log });
    editKeepingSizeAndMtime(join(dir, 'model.safetensors'));
    const second = await localCheckpointDigest(dir, { racyMs: 0, log });
    expect(second['model.safetensors']).not.toBe(first['model.safetensors']);
    expect(second['config.json']).toBe(first['config.json']);
  });

  it('reuses the digest of a file whose size, mtime, ctime and inode are unchanged, without reading it', async () => {
    await localCheckpointDigest(dir, { racyMs: 0, log });
    expect(hashed()).toBe(true);
    lines = [];
    const again = await localCheckpointDigest(dir, { racyMs: 0, log });
    expect(hashed()).toBe(false);
    // The proof it was not read: the stat cache's digest is what comes back, even a doctored one.
    const cache = JSON.parse(readFileSync(statCacheFile(dir), 'utf8'));
    cache.files['config.json'].sha256 = 'f'.repeat(64);
    writeFileSync(statCacheFile(dir), JSON.stringify(cache));
    expect((await localCheckpointDigest(dir, { racyMs: 0 }))['config.json']).toBe('f'.repeat(64));
    expect(again['config.json']).not.toBe('f'.repeat(64));
  });

  it('takes a ctime moved by a hard link made or removed (forge reads weights in place) as no edit, but an edit beside it still re-hashes', async () => {
    const first = await localCheckpointDigest(dir, { racyMs: 0, log });
    const linkDir = mkdtempSync(join(tmpdir(), 'forge-digest-link-'));
    const link = join(linkDir, 'model.safetensors');
    linkSync(join(dir, 'model.safetensors'), link); // ctime moves, nlink 1 → 2
    lines = [];
    expect(await localCheckpointDigest(dir, { racyMs: 0, log })).toEqual(first);
    expect(hashed()).toBe(false);
    rmSync(linkDir, { recursive: true }); // nlink 2 → 1, ctime moves again
    lines = [];
    expect(await localCheckpointDigest(dir, { racyMs: 0, log })).toEqual(first);
    expect(hashed()).toBe(false);
    editKeepingSizeAndMtime(join(dir, 'model.safetensors')); // ctime moves, nlink as recorded
    lines = [];
    const edited = await localCheckpointDigest(dir, { racyMs: 0, log });
    expect(hashed()).toBe(true);
    expect(edited['model.safetensors']).not.toBe(first['model.safetensors']);
  });

  it('does not cache a digest taken within the racy window of the file\'s last change', async () => {
    await localCheckpointDigest(dir, { log }); // files written just now: within 2 s of their ctime
    lines = [];
    await localCheckpointDigest(dir, { log });
    expect(hashed()).toBe(true);
  });

  it('hashes everything again when the stat cache is damaged', async () => {
    const good = await localCheckpointDigest(dir, { racyMs: 0 });
    writeFileSync(statCacheFile(dir), '{"dir": 3, "files": ');
    expect(await localCheckpointDigest(dir, { racyMs: 0, log })).toEqual(good);
    expect(hashed()).toBe(true);
    expect(JSON.parse(readFileSync(statCacheFile(dir), 'utf8')).files['config.json'].sha256).toBe(good['config.json']);
  });
});
