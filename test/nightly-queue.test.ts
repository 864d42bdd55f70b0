// The distributed nightly end to end, as a farm runs it: a real redis-server, two `forge worker`
// processes (a big one, 8 GB, and a small one, 2 GB), and `forge nightly --queue` of the three twin
// builds, one of which declares more memory than the small worker has. The small worker is killed
// with SIGKILL once a stage of its build has finished and a spare worker joins; BullMQ's stalled-job
// detection hands the dead worker's job to it, and it resumes the build from the shared stage cache:
// a real S3-compatible server (s3proxy) seeded with the twins only, each worker with a local cache of its own, cold at the
// start, so the builds really run and the spare worker can only have the dead one's stages from S3.
// The nightly is green with every build once; a second nightly with nothing changed is all cached
// and reports no regression.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync, createWriteStream } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { forge, lastJson } from './helpers/forge-cli.js';
import { startRedis, type RedisServer } from './helpers/redis.js';
import { startS3Server, type S3Server } from './helpers/s3-server.js';
import { ListObjectsV2Command } from '@aws-sdk/client-s3';
import type { RunRecord } from '../src/engine/record.js';
import { queueStatus, type QueueStatus } from '../src/nightly/status.js';
import type { Nightly } from '../src/nightly/summary.js';
import { twinDir } from './helpers/twin.js';
import { RemoteCache } from '../src/engine/remote-cache.js';

let work: string;
let recipes: string; // FORGE_RECIPES of every worker and nightly here
let redis: RedisServer;
let s3: S3Server;
const BUCKET = 'forge-farm';
const SHARED = `s3://${BUCKET}/nightly`;
const workers: ChildProcess[] = [];

// Short locks so a dead worker's job is retried within seconds (the defaults, 30 s, suit a farm).
const QUEUE_ENV = { FORGE_QUEUE_LOCK_MS: '10000', FORGE_QUEUE_STALLED_MS: '3000' };

/** A worker as on a machine of its own: its own local stage cache, the farm's shared one in S3. */
function startWorker(name: string, budgetGB: number): ChildProcess {
  const log = createWriteStream(join(work, `${name}.log`));
  const w = spawn(resolve('forge'), ['worker', '--queue', redis.url, '--memory-budget', String(budgetGB), '--out', join(work, name), '--cache', SHARED], {
    env: { ...process.env, CI: '1', ...QUEUE_ENV, ...s3.env, FORGE_RECIPES: recipes, FORGE_CACHE: join(work, `${name}-cache`) }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  w.stdout!.pipe(log);
  w.stderr!.pipe(log);
  workers.push(w);
  return w;
}

const until = async <T>(what: string, f: () => Promise<T | undefined>, timeoutMs: number): Promise<T> => {
  const t0 = Date.now();
  for (;;) {
    const v = await f();
    if (v !== undefined) return v;
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 1000));
  }
};

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'forge-nightly-queue-'));
  // The farm is what this file tests, not the twins' graphs (their own tests gate them on the
  // simulator): the twins skip the simulator's gate here (~150 s for tiny-qwen3.5, ~45 s for each
  // tiny-qwen3 build).
  recipes = join(work, 'recipes');
  cpSync('recipes', recipes, { recursive: true });
  for (const id of ['tiny-qwen3.5', 'tiny-qwen3']) {
    const file = join(recipes, id, 'recipe.json');
    const recipe = JSON.parse(readFileSync(file, 'utf8'));
    recipe.gates.emulation = false;
    writeFileSync(file, JSON.stringify(recipe, null, 2));
  }
  redis = await startRedis();
  s3 = await startS3Server();
  await s3.createBucket(BUCKET);
  await seedTwins(['qwen3_5', 'qwen3']);
});

/**
 * The farm's shared cache starts with the twins in it (their fetch entries, made once by this test
 * run's own cache): making a twin is not what a farm test is about, and each worker made its own
 * beside the others' builds (minutes on two cores). Every later stage still runs cold on the workers.
 */
async function seedTwins(twins: string[]): Promise<void> {
  const saved = { ...process.env };
  Object.assign(process.env, s3.env);
  try {
    const remote = await RemoteCache.open(SHARED);
    for (const twin of twins) {
      const dir = dirname(await twinDir(twin)); // the fetch stage's entry
      await remote.upload(dir, JSON.parse(readFileSync(join(dir, 'meta.json'), 'utf8')));
    }
  } finally {
    for (const k of Object.keys(s3.env)) if (saved[k] === undefined) delete process.env[k]; else process.env[k] = saved[k];
  }
}

/** Whether the shared cache holds a complete entry (its meta.json, written last) of the stage. */
/**
 * Whether every entry of `stage` that a worker's own cache holds is committed in S3 (its meta.json
 * there): that worker's builds' entries, not another worker's of the same stage.
 */
async function inS3(worker: string, stage: string): Promise<boolean> {
  const dir = join(work, `${worker}-cache`, stage);
  const keys = existsSync(dir) ? readdirSync(dir).filter((k) => existsSync(join(dir, k, 'meta.json'))) : [];
  if (!keys.length) return false;
  const r = await s3.client.send(new ListObjectsV2Command({ Bucket: BUCKET, Prefix: `nightly/${stage}/` }));
  const committed = new Set((r.Contents ?? []).map((o) => o.Key ?? ''));
  return keys.every((k) => committed.has(`nightly/${stage}/${k}/meta.json`));
}

afterAll(async () => {
  for (const w of workers) if (w.exitCode === null && w.signalCode === null) w.kill('SIGTERM');
  await redis?.stop();
  await s3?.stop();
});

describe('forge worker --memory-budget', () => {
  it('hands a job declaring more than its budget back to the queue: not built there, not failed', async () => {
    const own = await startRedis();
    try {
      const matrix = join(work, 'big-one.json');
      writeFileSync(matrix, JSON.stringify({ builds: [{ recipe: 'tiny-qwen3', arch: 'v81', memoryGB: 4 }] }));
      const log = createWriteStream(join(work, 'tiny.log'));
      const tiny = spawn(resolve('forge'), ['worker', '--queue', own.url, '--memory-budget', '1', '--out', join(work, 'tiny')], { env: { ...process.env, CI: '1' }, stdio: ['ignore', 'pipe', 'pipe'] });
      workers.push(tiny);
      let said = '';
      tiny.stderr!.on('data', (d) => { said += d; });
      tiny.stderr!.pipe(log);
      // The nightly waits for a worker that can hold 4 GB; none comes, so it is stopped here.
      const waiting = spawn(resolve('forge'), ['nightly', '--queue', own.url, '--matrix', matrix, '--run', 'big-one', '--out', join(work, 'never')], { env: { ...process.env, CI: '1', FORGE_QUEUE_WATCH_MS: '1000' }, stdio: ['ignore', 'ignore', 'pipe'] });
      let nightlySaid = '';
      waiting.stderr!.on('data', (d) => { nightlySaid += d; });
      try {
        await until('the 1 GB worker to hand the job back', async () => (said.includes('handing back') ? true : undefined), 300_000);
        expect(said).toMatch(/handing back \S+\/tiny-qwen3\/v81: tiny-qwen3\/v81 declares 4\.00 GB, over this worker's memory budget of 1\.00 GB/);
        // The waiting nightly says why nothing happens instead of waiting in silence, and keeps waiting.
        await until('the nightly to say no worker can hold the job', async () => (nightlySaid.includes('no connected worker can hold it') ? true : undefined), 60_000);
        expect(nightlySaid).toMatch(new RegExp(`tiny-qwen3/v81: no connected worker can hold it: [^ ]+:\\d+ \\(tiny-qwen3/v81 declares 4\\.00 GB, over this worker's memory budget of 1\\.00 GB\\); it waits for a worker with a larger --memory-budget`));
        expect(waiting.exitCode).toBeNull();
        const s = await queueStatus(own.url);
        expect(s.jobs).toHaveLength(1);
        expect(s.jobs[0]).toMatchObject({ build: 'tiny-qwen3/v81', stalled: 0, stages: [] });
        expect(['delayed', 'waiting', 'active']).toContain(s.jobs[0].state);
        if (s.jobs[0].state !== 'active') expect(Object.values(s.jobs[0].handedBack ?? {})).toEqual([expect.stringContaining('over this worker\'s memory budget of 1.00 GB')]);
        expect(said).not.toContain('building tiny-qwen3/v81');
        // A second nightly with the same --run attaches to the job rather than adding it again.
        const again = spawn(resolve('forge'), ['nightly', '--queue', own.url, '--matrix', matrix, '--run', 'big-one', '--out', join(work, 'never-2')], { env: { ...process.env, CI: '1' }, stdio: ['ignore', 'ignore', 'pipe'] });
        let againSaid = '';
        again.stderr!.on('data', (d) => { againSaid += d; });
        try {
          await until('the second nightly to attach', async () => (againSaid.includes('run big-one: 1 build jobs') ? true : undefined), 60_000);
          expect((await queueStatus(own.url, 'big-one')).jobs.map((j) => j.id)).toEqual(['big-one/tiny-qwen3/v81']);
        } finally {
          again.kill('SIGTERM');
        }
      } finally {
        waiting.kill('SIGTERM');
        tiny.kill('SIGTERM');
      }
    } finally {
      await own.stop();
    }
  }, 400_000);
});

describe('forge nightly --queue with two workers', () => {
  it('survives a worker killed mid-build: green, every build once, the killed build resumed from the shared S3 cache; the rerun is all cached', async () => {
    // tiny-qwen3.5 declares 4 GB: only the 8 GB worker may build it. It is first in the matrix so
    // that its cold build (the longest) starts at once on the big worker, beside the others.
    const matrix = join(work, 'twins.json');
    const twins = JSON.parse(readFileSync('nightly/twins.json', 'utf8'));
    const order = ['tiny-qwen3.5/v81', 'tiny-qwen3/v81', 'tiny-qwen3/v79'];
    twins.builds = order.map((id) => twins.builds.find((b: { recipe: string; arch: string }) => `${b.recipe}/${b.arch}` === id))
      .map((b: { recipe: string }) => (b.recipe === 'tiny-qwen3.5' ? { ...b, memoryGB: 4 } : b));
    writeFileSync(matrix, JSON.stringify(twins));
    const out = join(work, 'nightly');
    const nameOf = (w: ChildProcess) => `${hostname()}:${w.pid}`;

    // The big worker first, so it takes the first job; the small one then takes the next.
    const big = startWorker('big', 8);
    const t0 = Date.now();
    const first = forge(['nightly', '--queue', redis.url, '--matrix', matrix, '--out', out, '--json'], { ...QUEUE_ENV, FORGE_RECIPES: recipes });
    await until('the big worker on tiny-qwen3.5', async () => ((await queueStatus(redis.url)).jobs.some((j) => j.state === 'active' && j.worker === nameOf(big)) ? true : undefined), 300_000);
    const small = startWorker('small', 2);
    // Watch the jobs (what --status prints) until the small worker's build has finished a stage.
    const killedAt = await until('a stage done on the small worker', async () => {
      const s = await queueStatus(redis.url);
      const job = s.jobs.find((j) => j.state === 'active' && j.worker === nameOf(small) && j.stages.some((x) => x.status === 'ran'));
      return job ? { job, status: s } : undefined;
    }, 1_500_000);
    // Its finished stages are written back to S3 in the background: the kill comes once they are
    // there (a stage whose upload a kill cuts short is simply built again by the next worker).
    const done = killedAt.job.stages.filter((x) => x.status === 'ran').map((x) => x.name);
    await until('the small worker\'s finished stages in S3', async () => ((await Promise.all(done.map((stage) => inS3('small', stage)))).every(Boolean) ? true : undefined), 120_000);
    small.kill('SIGKILL');
    const killed = killedAt.job;
    console.log(`[measured] SIGKILL of the small worker ${((Date.now() - t0) / 1000).toFixed(1)} s into the nightly, building ${killed.build} with ${killed.stages.filter((x) => x.status !== 'running').map((x) => `${x.name} ${x.status}`).join(', ')} done`);
    // BullMQ's stalled check puts the job back at the head of the queue once the dead worker's lock lapses.
    await until('the killed job back in the queue', async () => {
      const j = (await queueStatus(redis.url)).jobs.find((x) => x.id === killed.id);
      return j && j.stalled >= 1 && j.state !== 'active' ? true : undefined;
    }, 120_000);
    console.log(`[measured] ${killed.id} back in the queue ${((Date.now() - t0) / 1000).toFixed(1)} s into the nightly`);
    // A machine added to the farm: with the big one busy, it is the one that picks the job up.
    const spare = startWorker('spare', 2);
    const [bigName, smallName, spareName] = [big, small, spare].map(nameOf);

    const a = await first;
    expect(a.code, a.stderr.slice(-3000)).toBe(0);
    const n: Nightly = lastJson(a.stdout);
    console.log(`[measured] first queued nightly (cold private cache, one worker killed): ${n.seconds.toFixed(1)} s; ${n.builds.map((b) => `${b.id} ${b.seconds.toFixed(1)} s on ${b.queue?.worker}`).join(', ')}`);
    // Every build once, in matrix order, green.
    expect(n.builds.map((b) => b.id)).toEqual(order);
    for (const b of n.builds) expect(b.ok, `${b.id}: ${b.error}`).toBe(true);
    expect(n.regressions).toBe(0);
    expect(a.stderr).toContain(`${killed.id}: stalled (its worker went away)`);

    // The killed build was finished by another worker, on its second start, after one stall, and
    // resumed: what the killed worker had committed to the cache is cached, the rest ran.
    const resumed = n.builds.find((b) => b.id === killed.build)!;
    expect(resumed.queue).toMatchObject({ worker: spareName, stalled: 1 });
    expect(resumed.queue!.attempts).toBeGreaterThanOrEqual(2);
    for (const s of killed.stages.filter((x) => x.status === 'ran')) expect(resumed.stages.find((x) => x.name === s.name)?.status, s.name).toBe('cached');
    expect(resumed.stages.some((x) => x.status === 'ran')).toBe(true);
    // The spare worker's own cache started empty: the dead worker's stages came from S3, checked.
    const record = JSON.parse(readFileSync(resumed.runRecord!, 'utf8')) as RunRecord;
    for (const s of done) expect(record.stages.find((x) => x.name === s), s).toMatchObject({ status: 'cached', source: 'remote' });
    console.log(`[measured] resumed ${killed.build}: ${resumed.stages.map((x) => `${x.name} ${x.status}`).join(', ')}`);
    // Over the small workers' budget: built on the big one.
    expect(n.builds[0].queue!.worker).toBe(bigName);
    expect(n.builds.map((b) => b.queue!.worker)).not.toContain(smallName);

    // --status: every job of the nightly, completed, with its attempts.
    const st = await forge(['nightly', '--status', '--queue', redis.url, '--json']);
    expect(st.code, st.stderr).toBe(0);
    const status: QueueStatus = lastJson(st.stdout);
    expect(status.jobs.map((j) => [j.build, j.state])).toEqual(n.builds.map((b) => [b.id, 'completed']));
    expect(status.jobs.find((j) => j.id === killed.id)).toMatchObject({ stalled: 1, worker: spareName, result: 'ok' });
    const text = await forge(['nightly', '--status', '--queue', redis.url]);
    expect(text.stdout).toContain(`${killed.build.padEnd(16)} completed attempts ${resumed.queue!.attempts} (stalled 1) on ${spareName}`);

    // Nothing changed: a second nightly, on the workers that are left, is all cached and flags nothing.
    const b = await forge(['nightly', '--queue', redis.url, '--matrix', matrix, '--out', out, '--json'], { ...QUEUE_ENV, FORGE_RECIPES: recipes });
    expect(b.code, b.stderr.slice(-3000)).toBe(0);
    const again: Nightly = lastJson(b.stdout);
    expect(again.comparedWith).toBe(join(out, 'nightly.json'));
    for (const s of again.builds) expect(s.stages.filter((x) => x.status !== 'cached'), s.id).toEqual([]);
    expect(again.regressions).toBe(0);
    const report = readFileSync(join(out, 'report.md'), 'utf8');
    expect(report).toContain('**ok: 3 builds, no regression**');
    // The build table says where each build ran.
    expect(report).toContain('| worker |');
    console.log(`[measured] second queued nightly (all cached): ${again.seconds.toFixed(1)} s; whole test ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  }, 2_400_000); // three cold twin builds on a shared 2-core machine (as nightly.test.ts), a kill and its lock lapse, a cached pass
});
