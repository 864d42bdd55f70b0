// The distributed nightly end to end, as a farm runs it: a real redis-server, two `forge worker`
// processes (a small one, 2 GB, and a big one, 8 GB), and `forge nightly --queue` of the three twin
// builds, one of which declares more memory than the small worker has. The small worker is killed
// with SIGKILL once a stage of its build has finished; BullMQ's stalled-job detection hands the job
// to the other worker, which resumes it from the shared stage cache (the tests' private one, cold
// at the start, so the builds really run). The nightly is green with every build once; a second
// nightly with nothing changed is all cached and reports no regression.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync, createWriteStream } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { forge, lastJson } from './helpers/forge-cli.js';
import { startRedis, type RedisServer } from './helpers/redis.js';
import { queueStatus, type QueueStatus } from '../src/nightly/status.js';
import type { Nightly } from '../src/nightly/summary.js';

let work: string;
let redis: RedisServer;
const workers: ChildProcess[] = [];

// Short locks so a dead worker's job is retried within seconds (the defaults, 30 s, suit a farm).
const QUEUE_ENV = { FORGE_QUEUE_LOCK_MS: '10000', FORGE_QUEUE_STALLED_MS: '3000' };

function startWorker(name: string, budgetGB: number): ChildProcess {
  const log = createWriteStream(join(work, `${name}.log`));
  const w = spawn(resolve('forge'), ['worker', '--queue', redis.url, '--memory-budget', String(budgetGB), '--out', join(work, name)], {
    env: { ...process.env, CI: '1', ...QUEUE_ENV }, stdio: ['ignore', 'pipe', 'pipe'],
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
  redis = await startRedis();
});

afterAll(async () => {
  for (const w of workers) if (w.exitCode === null && w.signalCode === null) w.kill('SIGTERM');
  await redis?.stop();
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
      const waiting = spawn(resolve('forge'), ['nightly', '--queue', own.url, '--matrix', matrix, '--out', join(work, 'never')], { env: { ...process.env, CI: '1' }, stdio: 'ignore' });
      try {
        await until('the 1 GB worker to hand the job back', async () => (said.includes('handing back') ? true : undefined), 300_000);
        expect(said).toMatch(/handing back \S+\/tiny-qwen3\/v81: tiny-qwen3\/v81 declares 4\.00 GB, over this worker's memory budget of 1\.00 GB/);
        const s = await queueStatus(own.url);
        expect(s.jobs).toHaveLength(1);
        expect(s.jobs[0]).toMatchObject({ build: 'tiny-qwen3/v81', stalled: 0, stages: [] });
        expect(['delayed', 'waiting', 'active']).toContain(s.jobs[0].state);
        expect(said).not.toContain('building tiny-qwen3/v81');
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
  it('survives a worker killed mid-build: green, every build once, the killed build resumed from the cache; the rerun is all cached', async () => {
    // tiny-qwen3.5 declares 4 GB: the 2 GB worker hands it back and only the 8 GB one builds it.
    const matrix = join(work, 'twins.json');
    const twins = JSON.parse(readFileSync('nightly/twins.json', 'utf8'));
    twins.builds = twins.builds.map((b: { recipe: string }) => (b.recipe === 'tiny-qwen3.5' ? { ...b, memoryGB: 4 } : b));
    writeFileSync(matrix, JSON.stringify(twins));
    const small = startWorker('small', 2);
    const big = startWorker('big', 8);
    const smallName = `${hostname()}:${small.pid}`;
    const bigName = `${hostname()}:${big.pid}`;
    const out = join(work, 'nightly');

    const t0 = Date.now();
    const first = forge(['nightly', '--queue', redis.url, '--matrix', matrix, '--out', out, '--json'], QUEUE_ENV);
    // Watch the jobs (what --status prints) until the small worker's build has finished a stage.
    const killedAt = await until('a stage done on the small worker', async () => {
      const s = await queueStatus(redis.url);
      const job = s.jobs.find((j) => j.state === 'active' && j.worker === smallName && j.stages.some((x) => x.status === 'ran'));
      return job ? { job, status: s } : undefined;
    }, 1_500_000);
    small.kill('SIGKILL');
    const killed = killedAt.job;
    console.log(`[measured] SIGKILL of the small worker ${((Date.now() - t0) / 1000).toFixed(1)} s into the nightly, building ${killed.build} with ${killed.stages.filter((x) => x.status !== 'running').map((x) => `${x.name} ${x.status}`).join(', ')} done`);

    const a = await first;
    expect(a.code, a.stderr.slice(-3000)).toBe(0);
    const n: Nightly = lastJson(a.stdout);
    console.log(`[measured] first queued nightly (cold private cache, one worker killed): ${n.seconds.toFixed(1)} s; ${n.builds.map((b) => `${b.id} ${b.seconds.toFixed(1)} s on ${b.queue?.worker}`).join(', ')}`);
    // Every build once, in matrix order, green.
    expect(n.builds.map((b) => b.id)).toEqual(['tiny-qwen3/v81', 'tiny-qwen3/v79', 'tiny-qwen3.5/v81']);
    for (const b of n.builds) expect(b.ok, `${b.id}: ${b.error}`).toBe(true);
    expect(n.regressions).toBe(0);
    expect(a.stderr).toContain(`${killed.id}: stalled (its worker went away)`);

    // The killed build was finished by the big worker, on its second start, after one stall, and
    // resumed: what the killed worker had committed to the cache is cached, the rest ran.
    const resumed = n.builds.find((b) => b.id === killed.build)!;
    expect(resumed.queue).toMatchObject({ worker: bigName, stalled: 1 });
    expect(resumed.queue!.attempts).toBeGreaterThanOrEqual(2);
    for (const s of killed.stages.filter((x) => x.status === 'ran')) expect(resumed.stages.find((x) => x.name === s.name)?.status, s.name).toBe('cached');
    expect(resumed.stages.some((x) => x.status === 'ran')).toBe(true);
    console.log(`[measured] resumed ${killed.build}: ${resumed.stages.map((x) => `${x.name} ${x.status}`).join(', ')}`);
    // Over the small worker's budget: never built there.
    expect(n.builds[2].queue!.worker).toBe(bigName);

    // --status: every job of the nightly, completed, with its attempts.
    const st = await forge(['nightly', '--status', '--queue', redis.url, '--json']);
    expect(st.code, st.stderr).toBe(0);
    const status: QueueStatus = lastJson(st.stdout);
    expect(status.jobs.map((j) => [j.build, j.state])).toEqual(n.builds.map((b) => [b.id, 'completed']));
    expect(status.jobs.find((j) => j.id === killed.id)).toMatchObject({ stalled: 1, worker: bigName, result: 'ok' });
    const text = await forge(['nightly', '--status', '--queue', redis.url]);
    expect(text.stdout).toContain(`${killed.build.padEnd(16)} completed attempts ${resumed.queue!.attempts} (stalled 1) on ${bigName}`);

    // Nothing changed: a second nightly, on the worker that is left, is all cached and flags nothing.
    const b = await forge(['nightly', '--queue', redis.url, '--matrix', matrix, '--out', out, '--json'], QUEUE_ENV);
    expect(b.code, b.stderr.slice(-3000)).toBe(0);
    const again: Nightly = lastJson(b.stdout);
    expect(again.comparedWith).toBe(join(out, 'nightly.json'));
    for (const s of again.builds) expect(s.stages.filter((x) => x.status !== 'cached'), s.id).toEqual([]);
    expect(again.regressions).toBe(0);
    expect(readFileSync(join(out, 'report.md'), 'utf8')).toContain('**ok: 3 builds, no regression**');
    console.log(`[measured] second queued nightly (all cached): ${again.seconds.toFixed(1)} s; whole test ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  }, 2_400_000); // three cold twin builds on a shared 2-core machine (as nightly.test.ts), a kill and its lock lapse, a cached pass
});
