// A farm that says what is wrong and never eats jobs, against a real redis-server with a password
// and a real S3-compatible server (s3proxy): a wrong password is not a server that is down; a worker
// whose shared cache or memory budget cannot work refuses to start; a worker whose cache goes away
// mid-job hands the job back and the nightly reports no regression. No model is built here: the
// workers in this process run an injected build that does what build() does first with a shared
// cache (opens it), so the farm's own handling is what is tested, in seconds.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { forge } from './helpers/forge-cli.js';
import { startRedis, type RedisServer } from './helpers/redis.js';
import { startS3Server, type S3Server } from './helpers/s3-server.js';
import { connectRedis } from '../src/nightly/queue.js';
import { startWorker, type BuildRunner, type RunningWorker } from '../src/nightly/worker.js';
import { InfraFailure, runBuildJob } from '../src/nightly/build-job.js';
import { nightly } from '../src/nightly/run.js';
import { formatStatus, queueStatus } from '../src/nightly/status.js';
import { RemoteCache } from '../src/engine/remote-cache.js';
import { silentProgress } from '../src/engine/progress.js';
import type { BuildRequest } from '../src/build.js';
import type { RunRecord } from '../src/engine/record.js';
import { formatBytes } from '../src/units.js';

const PASSWORD = 'farm pw/with:odd@chars';
const BUCKET = 'forge-farm';
let work: string;
let redis: RedisServer;
let s3: S3Server;
const savedEnv = { ...process.env };

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'forge-farm-errors-'));
  [redis, s3] = await Promise.all([startRedis({ password: PASSWORD }), startS3Server()]);
  await s3.createBucket(BUCKET);
  // The in-process workers reach s3proxy as a farm machine would: through the AWS_* environment.
  Object.assign(process.env, s3.env, { FORGE_CACHE: join(work, 'cache'), FORGE_QUEUE_HAND_BACK_MS: '500', FORGE_WORKER_RECHECK_MS: '300' });
}, 120_000);

afterAll(async () => {
  for (const k of Object.keys(process.env)) if (!(k in savedEnv)) delete process.env[k];
  Object.assign(process.env, savedEnv);
  await redis?.stop();
  await s3?.stop();
});

const until = async (what: string, f: () => boolean | Promise<boolean>, timeoutMs = 60_000) => {
  const t0 = Date.now();
  while (!(await f())) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
};

const error = (p: Promise<unknown>) => p.then(() => null, (e: Error) => e.message);
const withPassword = (pw: string) => { const u = new URL(redis.bareUrl); u.password = pw; return u.toString(); };

describe('a Redis that refuses the password', () => {
  it('says so, distinct from a Redis that cannot be reached, never printing the password', async () => {
    const wrong = await error(connectRedis(withPassword('not-it')));
    expect(wrong).toBe(`Redis at redis://:***@${new URL(redis.bareUrl).host} refused the password (WRONGPASS): check FORGE_REDIS_PASSWORD or --redis-password-file`);
    const none = await error(connectRedis(redis.bareUrl));
    expect(none).toBe(`Redis at ${redis.bareUrl} wants a password and was given none: set FORGE_REDIS_PASSWORD or give --redis-password-file`);
    const down = await error(connectRedis('redis://:not-it@127.0.0.1:1'));
    expect(down).toMatch(/^cannot reach Redis at redis:\/\/:\*\*\*@127\.0\.0\.1:1: .*ECONNREFUSED/);
    for (const m of [wrong, none, down]) expect(m).not.toContain('not-it');
    (await connectRedis(redis.url)).disconnect();
  });

  it('forge worker takes the password from FORGE_REDIS_PASSWORD or --redis-password-file, and refuses a budget the machine does not have', async () => {
    const w = await forge(['worker', '--queue', redis.bareUrl, '--out', join(work, 'cli')], { FORGE_REDIS_PASSWORD: 'not-it' });
    expect(w.code).toBe(1);
    expect(w.stderr).toContain(`forge: this worker takes no jobs: Redis at ${redis.bareUrl.replace('//', '//:***@')} refused the password (WRONGPASS)`);
    expect(w.stderr).not.toContain('not-it');
    // The right password, from a file: Redis is fine; a 100000 GB budget is not, and the machine's total is said.
    const file = join(work, 'redis-password');
    writeFileSync(file, `${PASSWORD}\n`);
    const big = await forge(['worker', '--queue', redis.bareUrl, '--redis-password-file', file, '--memory-budget', '100000', '--out', join(work, 'cli')]);
    expect(big.code).toBe(1);
    expect(big.stderr).toContain(`forge: this worker takes no jobs: --memory-budget 100000.00 GB is more than this machine has: ${formatBytes(totalmem())} of memory in all\n`);
    expect(big.stderr).not.toContain('taking jobs from');
  }, 120_000);
});

describe('a worker whose shared cache cannot work', () => {
  it('refuses to start with bad S3 credentials, naming the bucket and the endpoint and not the secret', async () => {
    const r = await forge(['worker', '--queue', redis.bareUrl, '--cache', `s3://${BUCKET}/farm`, '--out', join(work, 'cli')], {
      FORGE_REDIS_PASSWORD: PASSWORD, AWS_SECRET_ACCESS_KEY: 'wrong-secret-xyz',
    });
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`forge: this worker takes no jobs: remote cache s3://${BUCKET}/farm: access to bucket '${BUCKET}' denied (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) (endpoint ${s3.endpoint})`);
    expect(r.stderr).not.toContain('wrong-secret-xyz');
    expect(r.stderr).not.toContain(s3.secretAccessKey);
    expect(r.stderr).not.toContain('taking jobs from');
  }, 60_000);

  it('refuses to start on a bucket that does not exist; every problem is said at once', async () => {
    const m = await error(startWorker({ queue: redis.bareUrl, memoryBudgetBytes: totalmem() * 2, remoteCache: 's3://no-such-bucket/x', out: join(work, 'w0'), log: () => undefined }));
    expect(m).toContain('this worker takes no jobs:\n');
    expect(m).toContain(`--memory-budget ${formatBytes(totalmem() * 2)} is more than this machine has`);
    expect(m).toContain('wants a password and was given none');
    expect(m).toContain(`remote cache s3://no-such-bucket/x: bucket 'no-such-bucket' does not exist (endpoint ${s3.endpoint})`);
  }, 60_000);
});

/** What build() does first with a shared cache, then a record of one stage from it: no model is built. */
async function fakeBuild(r: BuildRequest): Promise<RunRecord> {
  const remote = await RemoteCache.fromOption(r.remoteCache as string | undefined);
  remote?.client.destroy();
  const stage = { name: 'fetch', status: 'cached' as const, source: 'remote' as const, seconds: 0.1, peakRssBytes: null, peakPrivateBytes: null, peakMappedBytes: null };
  return { recipe: r.recipe, arch: r.arch, ok: true, status: 'ok', stages: [stage], gates: {}, summaries: {}, tools: {}, bundle: r.out ?? null, buildDir: null, seconds: 0.2 };
}

describe('an infrastructure failure on a worker', () => {
  const matrix = () => {
    const file = join(work, 'one.json');
    writeFileSync(file, JSON.stringify({ builds: [{ recipe: 'tiny-qwen3', arch: 'v81' }] }));
    return file;
  };

  it('hands the job back when the shared cache fails mid-job, takes nothing until it is back, and the nightly reports no regression', async () => {
    const logs: string[] = [];
    const runBuild: BuildRunner = (req) => runBuildJob(req, silentProgress, fakeBuild);
    const w: RunningWorker = await startWorker({ queue: redis.url, memoryBudgetBytes: 1e9, remoteCache: `s3://${BUCKET}/farm`, out: join(work, 'w1'), log: (l) => logs.push(l), runBuild });
    try {
      // The worker's checks passed; now the shared cache goes away.
      const port = Number(new URL(s3.endpoint).port);
      await s3.stop();
      const said: string[] = [];
      const run = nightly({ queue: redis.url, matrix: matrix(), out: join(work, 'nightly'), log: (l) => said.push(l) });
      await until('the job handed back', () => logs.some((l) => l.startsWith('handing back')));
      expect(logs.find((l) => l.startsWith('handing back'))).toMatch(new RegExp(`^handing back \\S+/tiny-qwen3/v81 \\(a failure of this machine's, not the build's\\): remote cache s3://${BUCKET}/farm: bucket '${BUCKET}' cannot be reached: `));
      await until('the worker to stop taking jobs', () => logs.some((l) => l.startsWith('taking no jobs until this is fixed')));
      const waiting = (await queueStatus(redis.url)).jobs[0];
      expect(['delayed', 'waiting']).toContain(waiting.state);
      expect(waiting.infra).toEqual([{ worker: w.name, reason: expect.stringContaining(`remote cache s3://${BUCKET}/farm`) }]);
      // Nothing else was taken meanwhile: one build started, not one per retry.
      expect(logs.filter((l) => l.includes(': building tiny-qwen3/v81'))).toHaveLength(1);

      s3 = await startS3Server({ port });
      await s3.createBucket(BUCKET);
      const outcome = await run;
      expect(logs).toContain('checks pass again: taking jobs');
      const b = outcome.nightly.builds[0];
      expect(b.ok, b.error).toBe(true);
      expect(b.infra).toBeUndefined();
      expect(b.queue?.worker).toBe(w.name);
      expect(outcome.comparison.regressions).toEqual([]);
      expect(outcome.nightly.regressions).toBe(0);
      // --status: the stage from the shared cache counts as cached; the hand-back is on the job.
      const text = formatStatus(await queueStatus(redis.url));
      expect(text).toMatch(/tiny-qwen3\/v81 +completed attempts \d+ on \S+; stages 1 done \(1 cached, 1 of them from the shared cache\); ok; handed back after a failure of the machine, not the build: /);
    } finally {
      await w.close();
    }
  }, 240_000);

  it('a job whose build process is killed on every try ends as not built, never as a regression', async () => {
    const logs: string[] = [];
    let tries = 0;
    const runBuild: BuildRunner = async (req) => {
      tries++;
      throw new InfraFailure(`the build process of ${req.recipe}/${req.arch} ended without a result (signal SIGKILL)`);
    };
    const w = await startWorker({ queue: redis.url, memoryBudgetBytes: 1e9, out: join(work, 'w2'), log: (l) => logs.push(l), runBuild });
    try {
      const out = join(work, 'nightly');
      const outcome = await nightly({ queue: redis.url, matrix: matrix(), out, log: () => undefined });
      expect(tries).toBe(3);
      const b = outcome.nightly.builds[0];
      expect(b.ok).toBe(false);
      expect(b.infra).toMatch(/^not built after 3 failures of the machines': \S+: the build process of tiny-qwen3\/v81 ended without a result \(signal SIGKILL\)/);
      // Compared with the previous test's nightly, where it was ok: shown, not flagged.
      expect(outcome.nightly.comparedWith).toBe(join(out, 'nightly.json'));
      expect(outcome.comparison.regressions).toEqual([]);
      expect(outcome.comparison.changes.find((c) => c.figure === 'build')).toMatchObject({ before: 'ok', after: 'not built', flagged: false });
      expect((await queueStatus(redis.url)).jobs[0]).toMatchObject({ state: 'not built', result: expect.stringMatching(/^NOT BUILT: not built after 3 failures/) });
    } finally {
      await w.close();
    }
  }, 120_000);
});
