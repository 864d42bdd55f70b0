import { describe, it, expect, beforeEach } from 'vitest';
import { mkdtempSync, readFileSync, writeFileSync, existsSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { hostname, tmpdir } from 'node:os';
import { spawn } from 'node:child_process';
import { StageCache } from '../src/engine/cache.js';
import { Scheduler } from '../src/engine/scheduler.js';
import { runPipeline, type RunOptions } from '../src/engine/run.js';
import { silentProgress } from '../src/engine/progress.js';
import { fixedMemory, type Pipeline, type StageNode } from '../src/engine/stage.js';
import type { WriteParams } from './fixtures/stages/write.js';

const WRITE = resolve('test/fixtures/stages/write.ts');
const GATE = resolve('test/fixtures/stages/gate.ts');
const MB = 1 << 20;

let dir: string;
let cacheRoot: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'forge-engine-'));
  cacheRoot = join(dir, 'cache');
});

const write = (id: string, params: WriteParams, inputs: Record<string, string> = {}, extra: Partial<StageNode> = {}): StageNode => ({
  id, module: WRITE, params: params as any, inputs, tools: [], memory: fixedMemory(100 * MB, 'test'), ...extra,
});

const runs = (counter: string) => (existsSync(counter) ? readFileSync(counter, 'utf8').trim().split('\n').filter(Boolean).length : 0);

function run(p: Pipeline, opts: Partial<RunOptions> = {}) {
  return runPipeline(p, {
    cache: new StageCache(cacheRoot),
    scheduler: new Scheduler({ concurrency: 2, memoryBudgetBytes: 1e12 }),
    progress: silentProgress,
    toolVersions: { qnn: '2.7.0' },
    ...opts,
  });
}

const value = (r: Awaited<ReturnType<typeof run>>, id: string) => readFileSync(join(r.entries.get(id)!.dir, 'value.txt'), 'utf8');

function twoStage(aParams: Partial<WriteParams> = {}, bParams: Partial<WriteParams> = {}): Pipeline {
  return {
    nodes: [
      write('a', { text: 'A', counter: join(dir, 'a.count'), ...aParams }),
      write('b', { text: 'B', counter: join(dir, 'b.count'), ...bParams }, { up: 'a' }),
    ],
    publish: ['b'],
  };
}

describe('stage cache', () => {
  it('runs each stage once, then reuses it', async () => {
    const first = await run(twoStage());
    expect(first.stages.map((s) => s.status)).toEqual(['ran', 'ran']);
    expect(value(first, 'b')).toBe('A+B');
    const second = await run(twoStage());
    expect(second.stages.map((s) => s.status)).toEqual(['cached', 'cached']);
    expect(runs(join(dir, 'a.count'))).toBe(1);
    expect(runs(join(dir, 'b.count'))).toBe(1);
  });

  it('re-runs a stage whose params changed, and the stages downstream of it when its output changed', async () => {
    await run(twoStage());
    const r = await run(twoStage({ text: 'A2' }));
    expect(r.stages.map((s) => s.status)).toEqual(['ran', 'ran']);
    expect(value(r, 'b')).toBe('A2+B');
  });

  it('keeps downstream stages cached when an upstream re-run produced the same content', async () => {
    await run(twoStage());
    const r = await run(twoStage({ note: 'changed, but not the output' }));
    expect(r.stages.map((s) => s.status)).toEqual(['ran', 'cached']);
  });

  it('misses when a declared tool version changes', async () => {
    const p: Pipeline = { nodes: [write('a', { text: 'A' }, {}, { tools: ['qnn'] })], publish: [] };
    await run(p);
    expect((await run(p)).stages[0].status).toBe('cached');
    expect((await run(p, { toolVersions: { qnn: '2.8.0' } })).stages[0].status).toBe('ran');
  });

  it('refuses a stage that names a tool with no known version', async () => {
    const p: Pipeline = { nodes: [write('a', { text: 'A' }, {}, { tools: ['qairt'] })], publish: [] };
    await expect(run(p)).rejects.toThrow(/tool 'qairt'/);
  });

  it('re-runs a forced stage even when cached', async () => {
    await run(twoStage());
    const r = await run(twoStage(), { force: ['a'] });
    expect(r.stages.map((s) => s.status)).toEqual(['ran', 'cached']);
    expect(runs(join(dir, 'a.count'))).toBe(2);
  });

  it('stops after --until and names the valid stages when it is unknown', async () => {
    const r = await run(twoStage(), { until: 'a' });
    expect(r.stages.map((s) => s.name)).toEqual(['a']);
    await expect(run(twoStage(), { until: 'nope' })).rejects.toThrow(/unknown stage 'nope'.*stages: a, b/);
  });

  it('records a failed stage with its message and skips what depends on it', async () => {
    const r = await run(twoStage({ fail: 'weights are corrupt' }));
    expect(r.ok).toBe(false);
    expect(r.stages[0]).toMatchObject({ status: 'failed', error: 'weights are corrupt' });
    expect(r.stages[1].status).toBe('skipped');
    expect(readdirSync(join(cacheRoot, 'a')).filter((n) => !n.startsWith('.') && !n.endsWith('.lock') && n !== 'logs')).toEqual([]);
  });

  it('stops downstream stages when a gate fails, and reports the gate, also when the failed gate comes from the cache', async () => {
    const p: Pipeline = {
      nodes: [
        write('a', { text: 'A' }),
        { id: 'g', module: GATE, params: { want: 'Z' }, inputs: { value: 'a' }, tools: [], memory: fixedMemory(MB, 'test') },
        write('after', { text: 'C' }, { up: 'g' }),
      ],
      publish: [],
    };
    const r = await run(p);
    expect(r.ok).toBe(false);
    expect(r.failure).toEqual({ stage: 'g', message: 'gate demo failed' });
    expect(r.entries.get('g')!.meta.outcome.gate).toEqual({ name: 'demo', ok: false });
    expect(r.stages.map((s) => s.status)).toEqual(['ran', 'ran', 'skipped']);
    for (const again of [await run(p), await run(p, { until: 'g' })]) {
      expect(again.ok).toBe(false);
      expect(again.failure).toEqual({ stage: 'g', message: 'gate demo failed' });
      expect(again.stages.find((s) => s.name === 'g')!.status).toBe('cached');
    }
  });

  it('kills a stage that runs past its timeout', async () => {
    const p: Pipeline = { nodes: [write('slow', { text: 'S', sleepMs: 20_000 }, {}, { timeoutSeconds: 1 })], publish: [] };
    const r = await run(p);
    expect(r.stages[0].status).toBe('failed');
    expect(r.stages[0].error).toMatch(/timed out after 1 s/);
  });

  it('reports the peak RSS of the process a stage ran in', async () => {
    const p: Pipeline = { nodes: [write('big', { text: 'B', allocateMb: 300 })], publish: [] };
    const r = await run(p);
    expect(r.stages[0].peakRssBytes).toBeGreaterThan(300 * MB);
    expect((await run(p)).stages[0].peakRssBytes).toBeNull(); // cached: nothing ran
  });
});

describe('scheduler', () => {
  it('never runs stages together whose declared peaks exceed the memory budget', async () => {
    const scheduler = new Scheduler({ concurrency: 3, memoryBudgetBytes: 10e9, available: () => Infinity });
    const nodes = ['x', 'y', 'z'].map((id) => write(id, { text: id, sleepMs: 300 }, {}, { memory: fixedMemory(6e9, 'test') }));
    const r = await run({ nodes, publish: [] }, { scheduler });
    expect(r.ok).toBe(true);
    expect(scheduler.maxReserved).toBe(6e9);
  });

  it('records the wait for a slot apart from the stage\'s own seconds', async () => {
    // Three stages of 6 GB in a 10 GB budget run one after another: two of them wait for a slot.
    const scheduler = new Scheduler({ concurrency: 3, memoryBudgetBytes: 10e9, available: () => Infinity });
    const nodes = ['x', 'y', 'z'].map((id) => write(id, { text: id, sleepMs: 1000 }, {}, { memory: fixedMemory(6e9, 'test') }));
    const ends: string[] = [];
    const r = await run({ nodes, publish: [] }, { scheduler, progress: { ...silentProgress, end: (s, status, seconds, queued) => ends.push(`${s} ${status} ${seconds > 0} ${(queued ?? 0) > 0}`) } });
    const [first, ...waited] = [...r.stages].sort((a, b) => (a.queuedSeconds ?? 0) - (b.queuedSeconds ?? 0));
    expect(first.queuedSeconds).toBeUndefined();
    // Each waited at least for the stages before it (1 s of sleep each), and its own time is its own sleep, not theirs.
    expect(waited.map((s) => s.queuedSeconds! >= 1)).toEqual([true, true]);
    expect(waited[1].queuedSeconds! - waited[0].queuedSeconds!).toBeGreaterThanOrEqual(1);
    for (const s of r.stages) expect(s.seconds, s.name).toBeGreaterThanOrEqual(1);
    expect(ends.sort()).toEqual([`${first.name} ran true false`, `${waited[0].name} ran true true`, `${waited[1].name} ran true true`].sort());
  });

  it('starts a stage only when it also fits beside what other processes on the machine hold, looking again while it waits', async () => {
    // A 24 GB machine, 21.6 GB budget; other processes hold 12 GB until the test frees it.
    let others = 12e9;
    const said: string[] = [];
    // What this build's running stages hold privately (the scheduler's own reservations stand for it).
    const held = (): number => (scheduler as unknown as { reservedPrivate: number }).reservedPrivate;
    const scheduler: Scheduler = new Scheduler({ concurrency: 3, memoryBudgetBytes: 21.6e9, machineBytes: 24e9, available: () => 24e9 - others - held(), onShort: (m) => said.push(m) });
    expect(scheduler.limitNow()).toEqual({ bytes: 21.6e9 - 12e9, others: 12e9 });
    const started: string[] = [];
    const stage = (id: string, ms: number) => scheduler.run(6e9, async () => { started.push(id); await new Promise((r) => setTimeout(r, ms)); }, 6e9, id);
    const x = stage('x', 5000);
    await new Promise((r) => setTimeout(r, 100));
    const y = stage('y', 100); // 6 + 6 GB > 9.6 GB: waits, though the budget alone would let it run
    await new Promise((r) => setTimeout(r, 500));
    expect(started).toEqual(['x']);
    expect(said).toEqual(['y waits: it needs 6.00 GB beside the 6.00 GB this build\'s stages hold, and other processes on this machine use 12.00 GB']);
    others = 2e9; // the other job ends: y starts within a recheck, before x ends
    let xDone = false;
    void x.then(() => { xDone = true; });
    await y;
    expect(started).toEqual(['x', 'y']);
    expect(xDone).toBe(false);
    await x;
    // With nothing of its own running, a build starts its stage whatever the machine holds.
    others = 20e9;
    await stage('z', 10);
    expect(started).toEqual(['x', 'y', 'z']);
  });

  it('runs independent stages side by side when they fit', async () => {
    const scheduler = new Scheduler({ concurrency: 3, memoryBudgetBytes: 10e9, available: () => Infinity });
    const nodes = ['x', 'y', 'z'].map((id) => write(id, { text: id, sleepMs: 1500 }, {}, { memory: fixedMemory(3e9, 'test') }));
    await run({ nodes, publish: [] }, { scheduler });
    expect(scheduler.maxReserved).toBe(9e9);
  });
});

// These run the engine in separate processes: one to be killed, two to race on one cache.
/** extra: further spec fields for test/fixtures/run-pipeline.ts (progress: 'lines', lockNoticeMs). */
function spawnPipeline(p: Pipeline, name: string, extra: Record<string, unknown> = {}) {
  const specFile = join(dir, `${name}.json`);
  writeFileSync(specFile, JSON.stringify({ pipeline: p, cacheRoot, ...extra }));
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/run-pipeline.ts', specFile], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  const done = new Promise<{ code: number | null; result: any; stderr: string }>((res) =>
    child.on('close', (code) => res({ code, result: out.trim() ? JSON.parse(out.trim().split('\n').pop()!) : null, stderr: err })),
  );
  return { child, done };
}

const waitFor = async (cond: () => boolean, ms = 30_000) => {
  const t = Date.now();
  while (!cond()) {
    if (Date.now() - t > ms) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 50));
  }
};

describe('crash safety and sharing', () => {
  it('resumes after kill -9 mid-stage: completed stages are reused, the half-done one never is', async () => {
    const p = twoStage({}, { sleepMs: 3_000 });
    const { child, done } = spawnPipeline(p, 'killed');
    await waitFor(() => runs(join(dir, 'b.count')) === 1);
    child.kill('SIGKILL');
    await done;
    const entries = readdirSync(join(cacheRoot, 'b')).filter((n) => /^[0-9a-f]{64}$/.test(n));
    expect(entries).toEqual([]); // b's output exists only as a temp dir
    const r = await run(p);
    expect(r.stages.map((s) => s.status)).toEqual(['cached', 'ran']);
    expect(value(r, 'b')).toBe('A+B');
    expect(runs(join(dir, 'b.count'))).toBe(2);
    expect(readdirSync(join(cacheRoot, 'b', '.tmp'))).toEqual([]); // the abandoned temp dir was cleared
  });

  it('lets two concurrent builds share one cache: one computes, the other waits and reuses', async () => {
    const p = twoStage({ sleepMs: 1500 });
    const one = spawnPipeline(p, 'one');
    const two = spawnPipeline(p, 'two');
    const [r1, r2] = await Promise.all([one.done, two.done]);
    expect(r1.code).toBe(0);
    expect(r2.code).toBe(0);
    expect(runs(join(dir, 'a.count'))).toBe(1);
    expect(runs(join(dir, 'b.count'))).toBe(1);
    const statuses = [r1.result.stages[0].status, r2.result.stages[0].status].sort();
    expect(statuses).toEqual(['cached', 'ran']);
    const r = await run(p);
    expect(value(r, 'b')).toBe('A+B');
  });

  it("a build waiting on another's stage lock says whose it is and on which stage, and keeps saying so while it waits", async () => {
    const p = twoStage({ sleepMs: 8000 });
    const one = spawnPipeline(p, 'holder');
    await waitFor(() => runs(join(dir, 'a.count')) === 1); // the holder has a's lock and is running it
    const two = spawnPipeline(p, 'waiter', { progress: 'lines', lockNoticeMs: 500 });
    const [r1, r2] = await Promise.all([one.done, two.done]);
    expect(r1.code).toBe(0);
    expect(r2.code, r2.stderr).toBe(0);
    expect(r2.result.stages[0].status).toBe('cached'); // the waiter used the holder's entry
    // Its wait is recorded as queued, not as the stage's own time.
    expect(r2.result.stages[0].queuedSeconds).toBeGreaterThan(1);
    expect(r2.result.stages[0].seconds).toBeLessThan(r2.result.stages[0].queuedSeconds);
    expect(r2.stderr).toMatch(/\[forge\] a: cached \(\d+\.\d s, after \d+\.\d s queued\)/);
    expect(runs(join(dir, 'a.count'))).toBe(1);
    const holder = `build pid ${one.child.pid} on ${hostname()} (holding it since `;
    const waits = r2.stderr.split('\n').filter((l) => l.startsWith('[forge] a: ') && l.includes('waiting'));
    expect(waits[0], r2.stderr).toContain(`[forge] a: waiting for ${holder}`);
    expect(waits[0]).toContain(`which holds the a stage's lock (${join(cacheRoot, 'a')}/`);
    // Then again every lockNoticeMs while it waits (every 30 s by default), not once and then silence.
    const again = waits.slice(1);
    expect(again.length, r2.stderr).toBeGreaterThanOrEqual(2);
    for (const l of again) expect(l).toMatch(new RegExp(`^\\[forge\\] a: still waiting \\(\\d+ s\\) for build pid ${one.child.pid} on .*, which holds the a stage's lock$`));
    // The holder recorded itself beside the lock only while it held it.
    expect(readdirSync(join(cacheRoot, 'a')).filter((n) => n.endsWith('.owner'))).toEqual([]);
  });
});
