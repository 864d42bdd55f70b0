// The queue's conventions on crafted data (no build and no Redis server here; the farm is in
// nightly-queue.test.ts, its failures in nightly-farm-errors.test.ts): job payloads, which worker may take a job, URLs without their secrets.
import { describe, it, expect } from 'vitest';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { admission, connectedWorkers, connectRedis, jobIdOf, parseBuildJob, queueTimings, redactUrl, runIdOf, unholdable } from '../src/nightly/queue.js';
import { loadMatrix } from '../src/nightly/matrix.js';
import { forge } from './helpers/forge-cli.js';
import { formatStatus } from '../src/nightly/status.js';
import { queueUrl } from '../src/nightly/queue.js';
import { infraCauseOfError, infraCauseOfRecord } from '../src/nightly/build-job.js';
import { compareNightlies } from '../src/nightly/compare.js';
import { nightlyMarkdown } from '../src/nightly/report.js';
import { memoryBudgetProblem } from '../src/nightly/preflight.js';
import { RemoteCacheError } from '../src/engine/s3.js';
import type { RunRecord } from '../src/engine/record.js';
import type { BuildSummary } from '../src/nightly/summary.js';

const job = { format: 'forge-build-job/1', runId: 'r1', index: 0, recipe: 'tiny-qwen3', arch: 'v81', memoryBytes: 4e9 };

describe('build job payloads', () => {
  it('accepts a well-formed job and refuses anything else naming the job and the field', () => {
    expect(parseBuildJob(job, 'r1/tiny-qwen3/v81')).toEqual(job);
    expect(() => parseBuildJob({ ...job, format: 'forge-build-job/2' }, 'j')).toThrow(/^invalid build job j: format: /);
    expect(() => parseBuildJob({ ...job, memoryBytes: -1 }, 'j')).toThrow(/^invalid build job j: memoryBytes: /);
    expect(() => parseBuildJob({ ...job, extra: 1 }, 'j')).toThrow(/^invalid build job j: \(root\): .*extra/);
    expect(() => parseBuildJob('tiny-qwen3', 'j')).toThrow(/^invalid build job j: /);
  });

  it('names jobs by run and build, without the ":" BullMQ reserves', () => {
    const run = runIdOf('2026-11-26T02:14:30.000Z');
    expect(jobIdOf(run, 'tiny-qwen3.5', 'v81')).toBe('2026-11-26T02-14-30.000Z/tiny-qwen3.5/v81');
    expect(jobIdOf(run, 'tiny-qwen3.5', 'v81')).not.toContain(':');
  });

  it('a matrix entry may declare its memory; a bad one is refused before anything is queued', () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-queue-rules-'));
    const file = join(dir, 'm.json');
    writeFileSync(file, JSON.stringify({ builds: [{ recipe: 'tiny-qwen3', arch: 'v81', memoryGB: 3.5 }] }));
    expect(loadMatrix(file).matrix.builds[0].memoryGB).toBe(3.5);
    writeFileSync(file, JSON.stringify({ builds: [{ recipe: 'tiny-qwen3', arch: 'v81', memoryGB: 0 }] }));
    expect(() => loadMatrix(file)).toThrow(/builds\[0\]\.memoryGB: /);
  });
});

describe('which worker takes a job', () => {
  it('a job over the whole budget is refused; one over what running builds leave waits; the rest is taken', () => {
    expect(admission(job, 8e9, 0)).toBeNull();
    expect(admission(job, 2e9, 0)).toMatch(/^tiny-qwen3\/v81 declares 4\.00 GB, over this worker's memory budget of 2\.00 GB$/);
    expect(admission(job, 8e9, 5e9)).toMatch(/running builds leave 3\.00 GB of its 8\.00 GB/);
    // Undeclared (0): any worker.
    expect(admission({ ...job, memoryBytes: 0 }, 1e9, 1e9)).toBeNull();
  });

  it('lock and stalled timings default to BullMQ\'s and refuse a value that is not milliseconds', () => {
    expect(queueTimings({})).toEqual({ lockMs: 30_000, stalledMs: 30_000, maxStalled: 2 });
    expect(queueTimings({ FORGE_QUEUE_LOCK_MS: '5000' }).lockMs).toBe(5000);
    expect(() => queueTimings({ FORGE_QUEUE_STALLED_MS: '2s' })).toThrow("FORGE_QUEUE_STALLED_MS wants a whole number of milliseconds of at least 100, got '2s'");
  });

  it('a job every connected worker has handed back is named, with each worker\'s reason; not while one has yet to see it', () => {
    const progress = { stages: [], handedBack: { 'a:1': 'declares 21.00 GB, over 8.00 GB', 'b:2': 'declares 21.00 GB, over 2.00 GB' } };
    expect(unholdable(progress, ['a:1', 'b:2'])).toBe('no connected worker can hold it: a:1 (declares 21.00 GB, over 8.00 GB); b:2 (declares 21.00 GB, over 2.00 GB); it waits for a worker with a larger --memory-budget');
    // A third worker has not refused it yet (it may take it), and no worker at all is said elsewhere.
    expect(unholdable(progress, ['a:1', 'b:2', 'c:3'])).toBeNull();
    expect(unholdable(progress, [])).toBeNull();
    expect(unholdable(0, ['a:1'])).toBeNull();
  });

  it('reads the connected workers from their Redis client names, once per worker', async () => {
    const clients = [
      { rawname: 'bull:Zm9yZ2UtYnVpbGRz:w:farm-1:4242' }, { rawname: 'bull:Zm9yZ2UtYnVpbGRz:w:farm-1:4242' },
      { rawname: 'bull:Zm9yZ2UtYnVpbGRz:w:farm-2:77' }, { rawname: 'bull:Zm9yZ2UtYnVpbGRz' },
    ];
    expect(await connectedWorkers({ getWorkers: async () => clients })).toEqual(['farm-1:4242', 'farm-2:77']);
  });
});

describe('forge nightly --status', () => {
  it('one line per job: state, attempts, stalls, worker, stages; a job back in the queue shows where it was, not as running', () => {
    const text = formatStatus({ runId: 'r1', jobs: [
      { id: 'r1/tiny-qwen3/v81', build: 'tiny-qwen3/v81', state: 'completed', attempts: 2, stalled: 1, worker: 'b:2', stages: [{ name: 'fetch', status: 'cached' }, { name: 'export', status: 'ran' }], result: 'ok' },
      { id: 'r1/tiny-qwen3/v79', build: 'tiny-qwen3/v79', state: 'active', attempts: 1, stalled: 0, worker: 'a:1', stages: [{ name: 'fetch', status: 'ran' }, { name: 'compile', status: 'running' }], current: { stage: 'compile', done: 1, total: 2, label: 'lm_head' } },
      { id: 'r1/tiny-qwen3.5/v81', build: 'tiny-qwen3.5/v81', state: 'waiting', attempts: 1, stalled: 1, worker: 'a:1', stages: [{ name: 'fetch', status: 'cached' }, { name: 'plan', status: 'running' }] },
      { id: 'r1/qwen3.5-4b/v81', build: 'qwen3.5-4b/v81', state: 'delayed', attempts: 2, stalled: 0, stages: [], handedBack: { 'a:1': 'declares 21.00 GB, over 8.00 GB' } },
    ] });
    expect(text.split('\n')).toEqual([
      'run r1: 4 jobs',
      'tiny-qwen3/v81   completed attempts 2 (stalled 1) on b:2; stages 2 done (1 cached); ok',
      'tiny-qwen3/v79   active    attempts 1 on a:1; stages 1 done (0 cached), running compile 1/2 lm_head',
      'tiny-qwen3.5/v81 waiting   attempts 1 (stalled 1) last on a:1; stages 1 done (1 cached)',
      'qwen3.5-4b/v81   delayed   attempts 2; handed back by a:1 (declares 21.00 GB, over 8.00 GB)',
    ]);
    expect(formatStatus({ runId: null, jobs: [] })).toBe('no nightly jobs on this queue');
  });

  it('counts stages from the shared cache as cached, and shows failed and unbuilt builds as such', () => {
    const text = formatStatus({ runId: 'r1', jobs: [
      { id: 'r1/a/v81', build: 'a/v81', state: 'active', attempts: 1, stalled: 0, worker: 'a:1', stages: [
        { name: 'fetch', status: 'cached (remote)' }, { name: 'plan', status: 'cached (remote)' }, { name: 'trace', status: 'cached (remote)' },
        { name: 'export', status: 'cached' }, { name: 'quantize', status: 'ran' }, { name: 'oracle', status: 'running' },
      ] },
      { id: 'r1/b/v81', build: 'b/v81', state: 'failed', attempts: 1, stalled: 0, worker: 'a:1', stages: [{ name: 'oracle', status: 'ran' }], result: 'FAILED: oracle: gate oracle failed' },
      { id: 'r1/c/v81', build: 'c/v81', state: 'delayed', attempts: 2, stalled: 0, worker: 'b:2', stages: [], infra: [{ worker: 'b:2', reason: 'out of disk space: ENOSPC' }] },
    ] });
    expect(text.split('\n').slice(1)).toEqual([
      'a/v81        active    attempts 1 on a:1; stages 5 done (4 cached, 3 of them from the shared cache), running oracle',
      'b/v81        failed    attempts 1 on a:1; stages 1 done (0 cached); FAILED: oracle: gate oracle failed',
      'c/v81        delayed   attempts 2 last on b:2; handed back after a failure of the machine, not the build: b:2 (out of disk space: ENOSPC)',
    ]);
  });
});

describe('failures of the machine, not the build', () => {
  const record = (over: Partial<RunRecord>) => ({ status: 'failed' as const, stages: [], ...over });
  it('a full disk, a stopped build and an unusable shared cache are the machine\'s; a failed gate or stage error is the build\'s', () => {
    expect(infraCauseOfRecord(record({ error: 'export: ENOSPC: no space left on device, write (ENOSPC: no space left on device writing under /c/export/.tmp/k)' })))
      .toBe('out of disk space: export: ENOSPC: no space left on device, write (ENOSPC: no space left on device writing under /c/export/.tmp/k)');
    expect(infraCauseOfRecord(record({ status: 'interrupted', error: 'interrupted by SIGTERM' }))).toBe('the build was stopped: interrupted by SIGTERM');
    expect(infraCauseOfRecord(record({ error: 'oracle: gate oracle failed' }))).toBeNull();
    expect(infraCauseOfRecord(record({ error: 'compile: qnn-context-binary-generator exited 1' }))).toBeNull();
    expect(infraCauseOfRecord(record({ status: 'ok' }))).toBeNull();
    expect(infraCauseOfError(new RemoteCacheError("remote cache s3://b/p: access to bucket 'b' denied"))).toBe("remote cache s3://b/p: access to bucket 'b' denied");
    expect(infraCauseOfError(Object.assign(new Error('ENOSPC: no space left on device, mkdir'), { code: 'ENOSPC' }))).toMatch(/^out of disk space: /);
    expect(infraCauseOfError(new Error("recipe 'x' not found"))).toBeNull();
  });

  it('a build not built for the machine\'s reasons is shown, never flagged; a failed build is', () => {
    const summary = (id: string, over: Partial<BuildSummary>): BuildSummary => ({ id, recipe: id, arch: 'v81', ok: true, status: 'ok', seconds: 1, bundle: null, runRecord: null, figures: {}, stages: [], tools: {}, ...over });
    const thresholds = { maxCosineDrop: 1e-4, maxContextGrowth: 0.05, maxBundleGrowth: 0.05, failOnToolchainDifference: false };
    const before = { builds: [summary('a', {}), summary('b', {})] };
    const after = { thresholds, builds: [summary('a', { ok: false, status: 'failed', error: 'x', infra: 'out of disk space: ENOSPC' }), summary('b', { ok: false, status: 'failed', error: 'oracle: gate oracle failed' })] };
    const cmp = compareNightlies(after, before);
    expect(cmp.regressions.map((c) => c.build)).toEqual(['b']);
    expect(cmp.changes.find((c) => c.build === 'a')).toMatchObject({ after: 'not built', flagged: false, why: 'not built: out of disk space: ENOSPC' });
    // The report: the unbuilt build is said as such, and only the failed one makes the headline a regression.
    const n = { format: 'forge-nightly/1' as const, startedAt: 't', seconds: 1, matrix: 'm.json', comparedWith: 'b.json', regressions: 1, ...after };
    const md = nightlyMarkdown(n, { ...n, builds: before.builds }, cmp);
    expect(md).toContain("| a | NOT BUILT (the machines', not the build's): out of disk space: ENOSPC |");
    expect(md).toContain('REGRESSION: 1 failed build');
    const onlyUnbuilt = { ...n, builds: [after.builds[0]] };
    expect(nightlyMarkdown(onlyUnbuilt, null, compareNightlies(onlyUnbuilt, null))).toContain('incomplete: 1 of 1 builds not built (the machines failed, not the builds), no regression');
  });

  it('a memory budget over the machine\'s total is refused, naming the total', () => {
    expect(memoryBudgetProblem(64e9, 24e9)).toBe('--memory-budget 64.00 GB is more than this machine has: 24.00 GB of memory in all');
    expect(memoryBudgetProblem(20e9, 24e9)).toBeNull();
  });
});

describe('the Redis password', () => {
  it('comes from --redis-password-file, else FORGE_REDIS_PASSWORD, else the URL', () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-queue-pw-'));
    const file = join(dir, 'pw');
    writeFileSync(file, 'from:file@x\n');
    expect(queueUrl('redis://farm:6379', { env: {} })).toBe('redis://farm:6379');
    expect(queueUrl('redis://farm:6379', { env: { FORGE_REDIS_PASSWORD: 'from-env' } })).toBe('redis://:from-env@farm:6379');
    // Percent-encoded in the URL (ioredis decodes it); a trailing newline is not part of it.
    expect(new URL(queueUrl('redis://farm:6379', { passwordFile: file, env: { FORGE_REDIS_PASSWORD: 'from-env' } })).password).toBe(encodeURIComponent('from:file@x'));
    expect(() => queueUrl('redis://farm:6379', { passwordFile: join(dir, 'none') })).toThrow(`--redis-password-file ${join(dir, 'none')} cannot be read: ENOENT`);
    expect(redactUrl(queueUrl('redis://farm:6379', { env: { FORGE_REDIS_PASSWORD: 'from-env' } }))).toBe('redis://:***@farm:6379');
  });
});

describe('Redis URLs', () => {
  it('never print a password', () => {
    expect(redactUrl('redis://user:hunter2@farm:6379/0')).toBe('redis://user:***@farm:6379/0');
    expect(redactUrl('redis://:hunter2@farm:6379')).toBe('redis://:***@farm:6379');
    expect(redactUrl('redis://farm:6379')).toBe('redis://farm:6379');
  });

  it('an unreachable Redis is one error naming the URL without its password', async () => {
    const err = await connectRedis('redis://:hunter2@127.0.0.1:1').then(() => null, (e: Error) => e);
    expect(err?.message).toMatch(/^cannot reach Redis at redis:\/\/:\*\*\*@127\.0\.0\.1:1: /);
    expect(err?.message).not.toContain('hunter2');
    await expect(connectRedis('http://farm:6379')).rejects.toThrow('--queue wants a redis:// or rediss:// URL, got http://farm:6379');
  });

  it('the CLI says so and exits 1, for the worker and for the nightly', async () => {
    const w = await forge(['worker', '--queue', 'redis://:hunter2@127.0.0.1:1']);
    expect(w.code).toBe(1);
    expect(w.stderr).toMatch(/^forge: this worker takes no jobs: cannot reach Redis at redis:\/\/:\*\*\*@127\.0\.0\.1:1: /m);
    // A password in argv works, and is said to be visible to every user.
    expect(w.stderr).toContain('forge: warning: the --queue URL carries a password, which every user of this machine sees in ps');
    expect(w.stderr).not.toContain('hunter2');
    const s = await forge(['nightly', '--status']);
    expect(s.stderr).toContain('forge: --status reads the job queue: give it --queue redis://host:port');
  }, 60_000);
});
