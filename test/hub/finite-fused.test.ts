// A local checkpoint is read once for two uses: its content digest hashes every byte, and the same
// chunks go through fetch's NaN/Inf scan; the result is kept beside the digest in the stat cache and
// fetch takes it while the file's stat still matches, scanning only what has no valid record.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { checkFiniteStage } from '../../src/hub/finite-check.js';
import { localCheckpointDigest, recordedFinite, statCacheFile } from '../../src/hub/local-digest.js';
import { sha256OfFile } from '../../src/engine/hash.js';
import { checkFinite } from '../../src/io/finite.js';
import { f32ToBf16Bits } from '../../src/io/dtype.js';
import { openSafetensors } from '../../src/io/safetensors.js';
import { writeSafetensors } from '../../src/io/safetensors-writer.js';
import type { Recipe } from '../../src/recipe/schema.js';

const saved = { ...process.env };
let work: string;
let dir: string;
const source = (): Recipe['source'] => ({ kind: 'local', path: dir }) as Recipe['source'];
const quiet = () => {};

beforeEach(() => {
  work = mkdtempSync(join(tmpdir(), 'forge-fused-'));
  process.env.FORGE_CACHE = join(work, 'cache');
  dir = join(work, 'model');
  mkdirSync(dir);
});
afterEach(() => {
  process.env = { ...saved };
  rmSync(work, { recursive: true, force: true });
});

/** A shard: a bf16 tensor of `elements` values (0.25 each, element `nanAt` NaN if given), an int tensor, an f32 tensor. */
async function shard(file: string, opts: { elements?: number; nanAt?: number } = {}) {
  const big = new Uint16Array(opts.elements ?? 64).fill(f32ToBf16Bits(0.25));
  if (opts.nanAt !== undefined) big[opts.nanAt] = f32ToBf16Bits(NaN);
  await writeSafetensors(join(dir, file), [
    { name: 'ids', dtype: 'I64', shape: [3], data: BigInt64Array.from([1n, 2n, -1n]) },
    { name: 'model.embed_tokens.weight', dtype: 'BF16', shape: [big.length], data: big },
    { name: 'model.norm.weight', dtype: 'F32', shape: [4], data: Float32Array.from([1, 1, 1, 1]) },
  ]);
}

/** Two shards and the index that names them. */
async function sharded(opts: { nanIn?: 'a' | 'b' } = {}) {
  await shard('a.safetensors', opts.nanIn === 'a' ? { nanAt: 5 } : {});
  // Tensor names must differ across shards: the second shard's are renamed in its own header.
  await writeSafetensors(join(dir, 'b.safetensors'), [
    { name: 'lm_head.weight', dtype: 'BF16', shape: [8], data: Uint16Array.from({ length: 8 }, (_, i) => f32ToBf16Bits(opts.nanIn === 'b' && i === 6 ? NaN : i)) },
    { name: 'empty', dtype: 'F32', shape: [0, 4], data: new Float32Array(0) },
  ]);
  const weight_map = { ids: 'a.safetensors', 'model.embed_tokens.weight': 'a.safetensors', 'model.norm.weight': 'a.safetensors', 'lm_head.weight': 'b.safetensors', empty: 'b.safetensors' };
  writeFileSync(join(dir, 'model.safetensors.index.json'), JSON.stringify({ metadata: {}, weight_map }));
}

describe('the content digest with the NaN/Inf scan fused', () => {
  it('gives every .safetensors file the same sha256 as a plain read, tensors past one 16 MiB chunk included', async () => {
    await shard('model.safetensors', { elements: 9 << 20 }); // 18 MiB of bf16: two chunks
    writeFileSync(join(dir, 'config.json'), '{}');
    const digest = await localCheckpointDigest(dir, { racyMs: 0 });
    expect(digest['model.safetensors']).toBe(await sha256OfFile(join(dir, 'model.safetensors')));
    expect(digest['config.json']).toBe(await sha256OfFile(join(dir, 'config.json')));
  });

  it('records "ok" for a clean file and the first bad tensor, index and value for a poisoned one', async () => {
    await sharded({ nanIn: 'b' });
    await localCheckpointDigest(dir, { racyMs: 0 });
    const recorded = recordedFinite(dir);
    expect(recorded.get('a.safetensors')).toBe('ok');
    expect(recorded.get('b.safetensors')).toEqual({ tensor: 'lm_head.weight', dtype: 'BF16', index: 6, count: 8, value: 'NaN' });
    expect(recorded.has('model.safetensors.index.json')).toBe(false);
  });

  it('reads a stat-cache entry from before the fused scan (no result) once more, to record it', async () => {
    await shard('model.safetensors');
    await localCheckpointDigest(dir, { racyMs: 0 });
    const cache = JSON.parse(readFileSync(statCacheFile(dir), 'utf8'));
    delete cache.files['model.safetensors'].finite;
    writeFileSync(statCacheFile(dir), JSON.stringify(cache));
    const lines: string[] = [];
    await localCheckpointDigest(dir, { racyMs: 0, log: (m) => lines.push(m) });
    expect(lines.some((l) => l.startsWith('hashing the local checkpoint'))).toBe(true);
    expect(recordedFinite(dir).get('model.safetensors')).toBe('ok');
  });
});

describe("fetch's NaN/Inf check on a local checkpoint", () => {
  it('refuses a NaN the digest found, with the standalone scan\'s message, without reading the file again', async () => {
    await shard('model.safetensors', { elements: 9 << 20, nanAt: (8 << 20) + 7 });
    await localCheckpointDigest(dir, { racyMs: 0 });
    const scan = vi.fn(checkFinite);
    const file = join(dir, 'model.safetensors');
    const standalone = await checkFinite([file]).then(() => '', (e: Error) => e.message);
    expect(standalone).toContain(`NaN at flat index ${(8 << 20) + 7} of ${9 << 20} (BF16)`);
    await expect(checkFiniteStage(source(), dir, quiet, { scan })).rejects.toThrow(standalone);
    expect(scan).not.toHaveBeenCalled();
  });

  it('passes a clean checkpoint from the recorded results, counting the tensors and bytes they cover', async () => {
    await sharded();
    await localCheckpointDigest(dir, { racyMs: 0 });
    const scan = vi.fn(checkFinite);
    const lines: string[] = [];
    const r = await checkFiniteStage(source(), dir, (m) => lines.push(m), { scan });
    expect(scan).not.toHaveBeenCalled();
    const full = await checkFinite([join(dir, 'a.safetensors'), join(dir, 'b.safetensors')]);
    expect(full.tensors).toBe(4); // the zero-element one included
    expect(r).toMatchObject({ checked: true, tensors: full.tensors, bytes: full.bytes, filesFromDigest: 2 });
    rmSync(statCacheFile(dir)); // nothing recorded: the same totals from fetch's own scan
    expect(await checkFiniteStage(source(), dir, quiet)).toMatchObject({ tensors: full.tensors, bytes: full.bytes, filesFromDigest: 0 });
    expect(lines.join('\n')).toContain('all scanned as the content digest read them');
  });

  it('scans a file edited after the digest (size and mtime restored, ctime moved) and finds the new NaN', async () => {
    await shard('model.safetensors');
    await localCheckpointDigest(dir, { racyMs: 0 });
    const file = join(dir, 'model.safetensors');
    const ref = join(work, 'timestamps.ref');
    writeFileSync(ref, '');
    execFileSync('touch', ['-r', file, ref]);
    const st = await openSafetensors(file);
    const at = st.info('model.embed_tokens.weight').fileOffset + 2 * 9;
    await st.close();
    const bytes = readFileSync(file);
    bytes.writeUInt16LE(f32ToBf16Bits(-Infinity), at);
    writeFileSync(file, bytes);
    execFileSync('touch', ['-r', ref, file]);
    expect(recordedFinite(dir).has('model.safetensors')).toBe(false);
    const scan = vi.fn(checkFinite);
    await expect(checkFiniteStage(source(), dir, quiet, { scan })).rejects.toThrow(/tensor "model\.embed_tokens\.weight": -Inf at flat index 9 of 64/);
    expect(scan.mock.calls.map((c) => c[0])).toEqual([[file]]);
  });

  it('scans only the shard without a valid record (missing or damaged), taking the other from the digest', async () => {
    await sharded({ nanIn: 'a' });
    await localCheckpointDigest(dir, { racyMs: 0 });
    const cache = JSON.parse(readFileSync(statCacheFile(dir), 'utf8'));
    cache.files['a.safetensors'].finite = { tensor: 7 }; // damaged: not trusted, a.safetensors is read again
    writeFileSync(statCacheFile(dir), JSON.stringify(cache));
    const scan = vi.fn(checkFinite);
    await expect(checkFiniteStage(source(), dir, quiet, { scan })).rejects.toThrow(/a\.safetensors: tensor "model\.embed_tokens\.weight": NaN at flat index 5 of 64/);
    expect(scan.mock.calls.map((c) => c[0])).toEqual([[join(dir, 'a.safetensors')]]);
  });

  it('scans every file itself when the digest could not keep its results (files changed within the racy window)', async () => {
    await sharded({ nanIn: 'b' });
    await localCheckpointDigest(dir); // just written: within 2 s of their ctime, nothing is kept
    const scan = vi.fn(checkFinite);
    await expect(checkFiniteStage(source(), dir, quiet, { scan })).rejects.toThrow(/b\.safetensors: tensor "lm_head\.weight": NaN at flat index 6 of 8/);
    expect(scan).toHaveBeenCalledTimes(2);
  });

  it('skips the scan, recorded or not, when the recipe allows non-finite weights', async () => {
    await shard('model.safetensors', { nanAt: 1 });
    await localCheckpointDigest(dir, { racyMs: 0 });
    const r = await checkFiniteStage({ ...source(), allowNonFinite: { reason: 'test' } } as Recipe['source'], dir, quiet);
    expect(r).toEqual({ checked: false, reason: 'test' });
  });
});

/**
 * One file: an f32 clip bound nothing reads (+Inf, first in file order), a bf16 weight forge reads
 * (element `badAt` -Inf if given) and an f32 norm forge reads.
 */
async function withUnread(opts: { badAt?: number } = {}) {
  const w = new Uint16Array(16).fill(f32ToBf16Bits(0.5));
  if (opts.badAt !== undefined) w[opts.badAt] = f32ToBf16Bits(-Infinity);
  await writeSafetensors(join(dir, 'model.safetensors'), [
    { name: 'model.audio_tower.clip.input_max', dtype: 'F32', shape: [1], data: Float32Array.from([Infinity]) },
    { name: 'model.layers.0.mlp.down_proj.weight', dtype: 'BF16', shape: [4, 4], data: w },
    { name: 'model.norm.weight', dtype: 'F32', shape: [4], data: Float32Array.from([1, 1, 1, 1]) },
  ]);
}
const READS = ['model.layers.0.mlp.down_proj.weight', 'model.norm.weight'];

describe("fetch's NaN/Inf check over the tensors forge reads", () => {
  it('passes an Inf in a tensor nothing reads, counting it as not checked, from the digest or from its own scan', async () => {
    await withUnread();
    const notRead = { tensors: 1, bytes: 4, under: { 'model.audio_tower.clip.input_max': 1 } };
    const lines: string[] = [];
    // Nothing recorded (fresh files): fetch's own scan, of the read tensors only.
    const r = await checkFiniteStage(source(), dir, (m) => lines.push(m), { reads: READS });
    expect(r).toMatchObject({ checked: true, tensors: 2, bytes: 32 + 16, filesFromDigest: 0, notRead });
    expect(lines.join('\n')).toContain('not checked: 1 floating tensors nothing reads (0.00 MB): model.audio_tower.clip.input_max');
    // The digest stopped at the unread Inf: the file is scanned again for what is read, and passes.
    await localCheckpointDigest(dir, { racyMs: 0 });
    expect(recordedFinite(dir).get('model.safetensors')).toMatchObject({ tensor: 'model.audio_tower.clip.input_max', value: '+Inf' });
    const scan = vi.fn(checkFinite);
    const again = await checkFiniteStage(source(), dir, quiet, { reads: READS, scan });
    expect(again).toMatchObject({ checked: true, tensors: 2, bytes: 48, filesFromDigest: 0, notRead });
    expect(scan.mock.calls.map((c) => c[0])).toEqual([[join(dir, 'model.safetensors')]]);
  });

  it('refuses an Inf in a tensor the graphs read, naming file and tensor, even behind an unread Inf the digest stopped at', async () => {
    await withUnread({ badAt: 9 });
    const bad = /model\.safetensors: tensor "model\.layers\.0\.mlp\.down_proj\.weight": -Inf at flat index 9 of 16 \(BF16\)/;
    await expect(checkFiniteStage(source(), dir, quiet, { reads: READS })).rejects.toThrow(bad);
    await localCheckpointDigest(dir, { racyMs: 0 });
    await expect(checkFiniteStage(source(), dir, quiet, { reads: READS })).rejects.toThrow(bad);
  });

  it('refuses a NaN the digest recorded in a tensor forge reads without reading the file again', async () => {
    await shard('model.safetensors', { nanAt: 3 });
    await localCheckpointDigest(dir, { racyMs: 0 });
    const scan = vi.fn(checkFinite);
    await expect(checkFiniteStage(source(), dir, quiet, { reads: ['model.embed_tokens.weight'], scan })).rejects.toThrow(/tensor "model\.embed_tokens\.weight": NaN at flat index 3 of 64/);
    expect(scan).not.toHaveBeenCalled();
  });

  it('fails safe: with no list of what forge reads (absent or empty) every floating tensor is scanned', async () => {
    await withUnread();
    for (const reads of [undefined, []]) {
      await expect(checkFiniteStage(source(), dir, quiet, { reads })).rejects.toThrow(/tensor "model\.audio_tower\.clip\.input_max": \+Inf at flat index 0 of 1 \(F32\)/);
    }
  });
});
