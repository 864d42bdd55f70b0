// The shared stage cache against a real S3-compatible server (s3proxy on loopback), through the
// engine's own runPipeline with the small `write` test stage, and through `forge build` for the
// errors a user sees first.
import { describe, it, expect, beforeAll, afterAll, beforeEach } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { DeleteBucketCommand, DeleteObjectCommand, GetObjectCommand, PutObjectCommand } from '@aws-sdk/client-s3';
import { StageCache, type EntryMeta } from '../src/engine/cache.js';
import { Scheduler } from '../src/engine/scheduler.js';
import { runPipeline, type RunOptions } from '../src/engine/run.js';
import { silentProgress } from '../src/engine/progress.js';
import { fixedMemory, type Pipeline, type StageNode } from '../src/engine/stage.js';
import { RemoteCache, type RemoteMeta } from '../src/engine/remote-cache.js';
import { s3Client } from '../src/engine/s3.js';
import { startS3Server, type S3Server } from './helpers/s3-server.js';
import { forge } from './helpers/forge-cli.js';
import type { WriteParams } from './fixtures/stages/write.js';

const WRITE = resolve('test/fixtures/stages/write.ts');
const MB = 1 << 20;
const BUCKET = 'forge-cache';

let s3: S3Server;
const savedEnv: Record<string, string | undefined> = {};
beforeAll(async () => {
  s3 = await startS3Server();
  await s3.createBucket(BUCKET);
  // RemoteCache reads credentials and endpoint from the environment, as a user's build does.
  for (const [k, v] of Object.entries(s3.env)) {
    savedEnv[k] = process.env[k];
    process.env[k] = v;
  }
});
afterAll(async () => {
  for (const [k, v] of Object.entries(savedEnv)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  await s3?.stop();
});

let dir: string;
let url: string;
let n = 0;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'forge-remote-'));
  url = `s3://${BUCKET}/test-${process.pid}-${(n += 1)}`; // each test its own prefix: a cold shared cache
});

const write = (id: string, params: WriteParams, inputs: Record<string, string> = {}): StageNode => ({
  id, module: WRITE, params: params as any, inputs, tools: [], memory: fixedMemory(100 * MB, 'test'),
});
const twoStage = (): Pipeline => ({
  nodes: [
    write('a', { text: 'A', counter: join(dir, 'a.count') }),
    write('b', { text: 'B', counter: join(dir, 'b.count') }, { up: 'a' }),
  ],
  publish: ['b'],
});
const runs = (stage: string) => {
  const f = join(dir, `${stage}.count`);
  return existsSync(f) ? readFileSync(f, 'utf8').trim().split('\n').length : 0;
};

/** A build on a machine of its own: a local cache of its own (cacheName), the shared cache given. */
function build(cacheName: string, remote: RemoteCache | undefined, p: Pipeline = twoStage(), opts: Partial<RunOptions> = {}) {
  return runPipeline(p, {
    cache: new StageCache(join(dir, cacheName)),
    scheduler: new Scheduler({ concurrency: 2, memoryBudgetBytes: 1e12 }),
    progress: silentProgress, toolVersions: {}, remote, ...opts,
  });
}
const statuses = (r: Awaited<ReturnType<typeof build>>) => r.stages.map((s) => `${s.status}${s.source ? `:${s.source}` : ''}`);

/** The remote meta.json of a stage's entry, and the object key of each of its files. */
async function remoteEntry(remote: RemoteCache, stage: string, key: string) {
  const got = await s3.client.send(new GetObjectCommand({ Bucket: BUCKET, Key: remote.metaKey(stage, key) }));
  const meta = JSON.parse(await got.Body!.transformToString()) as RemoteMeta;
  return { meta, fileKey: (rel: string) => remote.fileKey(stage, key, meta.remote.writer, rel) };
}

describe('shared stage cache (S3, read-through / write-back)', () => {
  it('a machine with an empty local cache takes every stage from a warm shared cache, verified, and runs none', async () => {
    const remote = await RemoteCache.open(url);
    const first = await build('machine-1', remote);
    expect(statuses(first)).toEqual(['ran', 'ran']);
    expect(first.stages.map((s) => s.remote)).toEqual(['uploaded 2 files, 0.0 MB', 'uploaded 2 files, 0.0 MB']);

    const second = await build('machine-2', remote);
    expect(statuses(second)).toEqual(['cached:remote', 'cached:remote']);
    expect(runs('a')).toBe(1);
    expect(runs('b')).toBe(1);
    expect(readFileSync(join(second.entries.get('b')!.dir, 'value.txt'), 'utf8')).toBe('A+B');
    // The downloaded entry is a normal local entry: same digests, no trace of the remote layout.
    const local = second.entries.get('b')!.meta;
    expect(local.contentHash).toBe(first.entries.get('b')!.meta.contentHash);
    expect(local).not.toHaveProperty('remote');

    // Now local: the next build on that machine does not touch the shared cache.
    expect(statuses(await build('machine-2', remote))).toEqual(['cached', 'cached']);
  });

  it('writes back an entry that only the local cache had, so a warm machine fills an empty shared cache', async () => {
    await build('machine-1', undefined);
    const remote = await RemoteCache.open(url);
    const warm = await build('machine-1', remote);
    expect(statuses(warm)).toEqual(['cached', 'cached']);
    expect(statuses(await build('machine-2', remote))).toEqual(['cached:remote', 'cached:remote']);
    expect(runs('a')).toBe(1);
  });

  it('an upload cut before its meta.json is no entry: the stage runs, and its upload completes the entry', async () => {
    const remote = await RemoteCache.open(url);
    const first = await build('machine-1', remote);
    const key = first.entries.get('a')!.meta.key;
    // What a writer killed between its last file and meta.json leaves: every file, no meta.json.
    await s3.client.send(new DeleteObjectCommand({ Bucket: BUCKET, Key: remote.metaKey('a', key) }));
    expect((await remote.entryKeys('a', key)).length).toBeGreaterThan(0);

    const second = await build('machine-2', remote);
    expect(statuses(second)).toEqual(['ran', 'cached:remote']);
    expect(runs('a')).toBe(2);
    expect(second.stages[0].remote).toMatch(/^uploaded/);
    expect(statuses(await build('machine-3', remote))).toEqual(['cached:remote', 'cached:remote']);
  });

  const tamperings: Array<[string, (remote: RemoteCache, key: string) => Promise<void>, RegExp]> = [
    ['a file whose bytes differ (same size)', async (remote, key) => {
      const { fileKey } = await remoteEntry(remote, 'a', key);
      await s3.client.send(new PutObjectCommand({ Bucket: BUCKET, Key: fileKey('value.txt'), Body: 'Z' }));
    }, /value\.txt does not match its sha256/],
    ['a truncated file', async (remote, key) => {
      const { fileKey } = await remoteEntry(remote, 'a', key);
      await s3.client.send(new PutObjectCommand({ Bucket: BUCKET, Key: fileKey('value.txt'), Body: '' }));
    }, /value\.txt is 0 bytes, meta\.json says 1/],
    ['a missing file', async (remote, key) => {
      const { fileKey } = await remoteEntry(remote, 'a', key);
      await s3.client.send(new DeleteObjectCommand({ Bucket: BUCKET, Key: fileKey('value.txt') }));
    }, /cannot download value\.txt: HTTP 404/],
    ['a truncated meta.json', async (remote, key) => {
      await s3.client.send(new PutObjectCommand({ Bucket: BUCKET, Key: remote.metaKey('a', key), Body: '{"stage": "a", "ke' }));
    }, /meta\.json is not JSON/],
  ];
  it.each(tamperings)('an entry with %s is never used: the stage reruns and its entry replaces the bad one', async (_what, tamper, why) => {
    const remote = await RemoteCache.open(url);
    const key = (await build('machine-1', remote)).entries.get('a')!.meta.key;
    await tamper(remote, key);

    const second = await build('machine-2', remote);
    expect(statuses(second)).toEqual(['ran', 'cached:remote']);
    expect(runs('a')).toBe(2);
    expect(second.stages[0].remote).toMatch(why);
    expect(second.stages[0].remote).toMatch(/; uploaded 2 files/);
    // Nothing of the bad download is left in the local cache's temp space.
    expect(readFileSync(join(second.entries.get('a')!.dir, 'value.txt'), 'utf8')).toBe('A');
    // The replacement is good: a third machine takes it.
    expect(statuses(await build('machine-3', remote))).toEqual(['cached:remote', 'cached:remote']);
  });

  it('two machines uploading the same key at once leave one whole entry, never a mix of both', async () => {
    // Same stage and key, different bytes (as two compiles of a nondeterministic tool would make),
    // several files each, so a mixed entry would be visible.
    const entryOf = async (machine: string, text: string, key: string): Promise<{ dir: string; meta: EntryMeta }> => {
      const cache = new StageCache(join(dir, machine));
      const tmp = await cache.makeTemp('compile', key);
      for (const f of ['ctx_0.bin', 'ctx_1.bin', 'sub/ctx_2.bin']) {
        await mkdir(join(tmp, 'sub'), { recursive: true });
        writeFileSync(join(tmp, f), `${text}:${f}:`.repeat(1000 + text.length));
      }
      const meta = await cache.commit(tmp, { stage: 'compile', module: 'compile', version: '1', key, seconds: 1, peakRssBytes: 0, outcome: {} });
      return { dir: cache.entryDir('compile', key), meta };
    };
    const machine1 = await RemoteCache.open(url);
    const machine2 = await RemoteCache.open(url);
    for (let round = 0; round < 4; round++) {
      const key = `k${round}`.padEnd(64, '0');
      const one = await entryOf('machine-1', 'one', key);
      const two = await entryOf('machine-2', 'second', key);
      // replace: both get past the "already there?" check, so both really write the same key at once.
      const outcomes = await Promise.all([machine1.upload(one.dir, one.meta, { replace: true }), machine2.upload(two.dir, two.meta, { replace: true })]);
      expect(outcomes.map((o) => o.outcome)).toContain('uploaded');
      // A writer that saw the other's meta.json win removed its own files (named by nothing now).
      const writers = new Set((await machine1.entryKeys('compile', key)).filter((k) => !k.endsWith('/meta.json')).map((k) => k.split('/')[3]));
      expect(writers.size).toBe(outcomes.filter((o) => o.outcome === 'uploaded').length);

      const reader = new StageCache(join(dir, `reader-${round}`));
      const got = await reader.withLock('compile', key, async () => machine1.fetchInto(reader, 'compile', key, await reader.makeTemp('compile', key)));
      expect(got.meta).not.toBeNull();
      const winner = got.meta!.contentHash === one.meta.contentHash ? one : two;
      expect([one.meta.contentHash, two.meta.contentHash]).toContain(got.meta!.contentHash);
      for (const f of Object.keys(winner.meta.files)) {
        expect(readFileSync(join(reader.entryDir('compile', key), f), 'utf8')).toBe(readFileSync(join(winner.dir, f), 'utf8'));
      }
    }
  });

  it('a sweep removes the files no meta.json names once they are old, never a committed entry nor one it cannot read', async () => {
    const remote = await RemoteCache.open(url);
    const key = (await build('machine-1', remote)).entries.get('a')!.meta.key;
    const put = (k: string, body: string) => s3.client.send(new PutObjectCommand({ Bucket: BUCKET, Key: k, Body: body }));
    const other = 'c'.repeat(64);
    await put(remote.fileKey('a', key, 'w-lost-race', 'value.txt'), 'L'); // a writer that lost, its files left
    await put(remote.fileKey('export', other, 'w-cut', 'model.onnx'), 'cut short'); // an upload killed before its meta.json
    await put(remote.metaKey('quantize', other), '{"stage": "quan'); // a truncated meta.json…
    await put(remote.fileKey('quantize', other, 'w-kept', 'model.onnx'), 'kept'); // …whose files are left for the rebuild to replace

    // Just written: maybe still uploading, so kept.
    const young = await remote.sweep({ olderThanMs: 3600_000 });
    expect(young).toMatchObject({ orphans: [], objects: 0, young: 2, unreadable: [`quantize/${other}`] });
    // Two hours on: a dry run lists the two orphans and removes nothing.
    const later = Date.now() + 2 * 3600_000;
    const dry = await remote.sweep({ olderThanMs: 3600_000, now: later, dryRun: true });
    expect(dry.orphans.sort()).toEqual([`a/${key}/w-lost-race`, `export/${other}/w-cut`]);
    expect(dry).toMatchObject({ objects: 2, bytes: 10, young: 0 });
    expect(await remote.entryKeys('a', key)).toContain(remote.fileKey('a', key, 'w-lost-race', 'value.txt'));

    // The CLI, as a farm's cron runs it: everything older than 0 h.
    const run = await forge(['clean', '--sweep', url, '--older-than', '0'], s3.env);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain('2 orphaned uploads older than 0 h removed (2 objects, 0.0 MB)');
    expect(run.stdout).toContain(`left alone: 1 entry whose meta.json cannot be read (quantize/${other})`);
    // What is left of each entry (s3proxy also lists its directories, as keys ending in '/').
    const left = async (stage: string, k: string) => (await remote.entryKeys(stage, k)).filter((x) => !x.endsWith('/')).sort();
    const { meta, fileKey } = await remoteEntry(remote, 'a', key);
    expect(await left('a', key)).toEqual([remote.metaKey('a', key), ...Object.keys(meta.files).map(fileKey)].sort());
    expect(await left('export', other)).toEqual([]);
    expect(await left('quantize', other)).toHaveLength(2);
    // The committed entries are whole: a fresh machine takes both stages from the shared cache.
    expect(statuses(await build('machine-2', remote))).toEqual(['cached:remote', 'cached:remote']);
  });

  it('moves a large entry in multipart parts and streams it back verified', async () => {
    const cache = new StageCache(join(dir, 'machine-1'));
    const key = 'big'.padEnd(64, '0');
    const tmp = await cache.makeTemp('export', key);
    // 40 MiB: three 16 MiB parts, the multipart path a real model's GB weights take.
    const big = Buffer.alloc(40 * MB);
    for (let i = 0; i < big.length; i += 4096) big.writeUInt32LE(i, i);
    writeFileSync(join(tmp, 'weights.bin'), big);
    const meta = await cache.commit(tmp, { stage: 'export', module: 'export', version: '1', key, seconds: 1, peakRssBytes: 0, outcome: {} });
    const remote = await RemoteCache.open(url);
    const up = await remote.upload(cache.entryDir('export', key), meta);
    expect(up).toEqual({ outcome: 'uploaded', files: 1, bytes: 40 * MB });
    expect(await remote.upload(cache.entryDir('export', key), meta)).toEqual({ outcome: 'present', files: 0, bytes: 0 });

    const reader = new StageCache(join(dir, 'machine-2'));
    const got = await reader.withLock('export', key, async () => remote.fetchInto(reader, 'export', key, await reader.makeTemp('export', key)));
    expect(got).toMatchObject({ bytes: 40 * MB, meta: { contentHash: meta.contentHash } });
    expect(readFileSync(join(reader.entryDir('export', key), 'weights.bin')).equals(big)).toBe(true);
  });

  it('a shared cache that fails mid-build warns and records it; the build still succeeds locally', async () => {
    await s3.createBucket('forge-gone');
    const remote = await RemoteCache.open('s3://forge-gone/p');
    await s3.client.send(new DeleteBucketCommand({ Bucket: 'forge-gone' })); // the server loses it after the start check
    const warnings: string[] = [];
    const r = await build('machine-1', remote, twoStage(), { progress: { ...silentProgress, warn: (s, m) => warnings.push(`${s}: ${m}`) } });
    expect(r.ok).toBe(true);
    expect(statuses(r)).toEqual(['ran', 'ran']);
    expect(r.stages[0].remote).toMatch(/^upload failed: .*NoSuchBucket/);
    expect(warnings.join('\n')).toMatch(/a: upload to the shared cache s3:\/\/forge-gone\/p failed \(the build goes on\)/);
  });
});

describe('shared stage cache: what is refused before anything runs', () => {
  it('takes the region from the environment, else the shared config file\'s profile, else us-east-1', async () => {
    const keep = { AWS_REGION: process.env.AWS_REGION, AWS_DEFAULT_REGION: process.env.AWS_DEFAULT_REGION, AWS_CONFIG_FILE: process.env.AWS_CONFIG_FILE, AWS_PROFILE: process.env.AWS_PROFILE };
    try {
      delete process.env.AWS_REGION;
      delete process.env.AWS_DEFAULT_REGION;
      delete process.env.AWS_PROFILE;
      const config = join(dir, 'aws-config');
      writeFileSync(config, '[default]\nregion = eu-west-3\n');
      process.env.AWS_CONFIG_FILE = config;
      expect(await (await s3Client()).config.region()).toBe('eu-west-3');
      process.env.AWS_CONFIG_FILE = join(dir, 'no-such-config');
      expect(await (await s3Client()).config.region()).toBe('us-east-1');
      process.env.AWS_REGION = 'ap-south-1';
      expect(await (await s3Client()).config.region()).toBe('ap-south-1');
    } finally {
      for (const [k, v] of Object.entries(keep)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  it('a missing bucket is one error naming it', async () => {
    await expect(RemoteCache.open('s3://no-such-bucket/team')).rejects.toThrow(/^remote cache s3:\/\/no-such-bucket\/team: bucket 'no-such-bucket' does not exist \(endpoint http:\/\/127\.0\.0\.1:\d+\)$/);
  });

  it('a URL that is not s3://bucket/prefix is refused', async () => {
    await expect(RemoteCache.open('https://example.com/x')).rejects.toThrow(/is not an s3:\/\/bucket\/prefix URL/);
    await expect(RemoteCache.open('s3://UP/x')).rejects.toThrow(/'UP' is not a valid bucket name/);
  });

  it('forge build / nightly with a missing bucket (--cache) or wrong credentials (FORGE_REMOTE_CACHE) stops before any stage, printing no secret', async () => {
    const missing = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--cache', 's3://no-such-bucket/p', '--out', join(dir, 'out')], s3.env);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/^forge: remote cache s3:\/\/no-such-bucket\/p: bucket 'no-such-bucket' does not exist/m);

    const nightly = await forge(['nightly', '--cache', 's3://no-such-bucket/p', '--out', join(dir, 'nightly')], s3.env);
    expect(nightly.code).toBe(1);
    expect(nightly.stderr).toMatch(/^forge: remote cache s3:\/\/no-such-bucket\/p: bucket 'no-such-bucket' does not exist/m);
    expect(nightly.stderr).not.toMatch(/building/); // refused before the first build of the matrix

    const badSecret = 'not-the-secret-0123456789';
    const denied = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--out', join(dir, 'out')], {
      ...s3.env, AWS_SECRET_ACCESS_KEY: badSecret, FORGE_REMOTE_CACHE: `s3://${BUCKET}/p`,
    });
    expect(denied.code).toBe(1);
    expect(denied.stderr).toMatch(/^forge: remote cache s3:\/\/forge-cache\/p: access to bucket 'forge-cache' denied/m);
    for (const r of [missing, denied]) {
      const all = r.stdout + r.stderr;
      expect(all).not.toContain(badSecret);
      expect(all).not.toContain(s3.secretAccessKey);
      expect(all).not.toMatch(/: running/); // no stage started
    }
  });
});
