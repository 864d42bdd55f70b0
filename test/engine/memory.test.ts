// Stage memory: measured over the stage's whole process tree (private and mapped, sampled from
// /proc), predicted from what the stage processes, the two side by side in the record, and a stage
// that cannot fit refused before it starts — as soon as the outputs its prediction reads exist.
import { describe, it, expect, beforeEach, afterEach } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { StageCache } from '../../src/engine/cache.js';
import { Scheduler } from '../../src/engine/scheduler.js';
import { runPipeline, type RunOptions } from '../../src/engine/run.js';
import { silentProgress, type Progress } from '../../src/engine/progress.js';
import { sampleTree } from '../../src/engine/memory.js';
import { checkEvicted } from '../../src/engine/predict.js';
import { fixedMemory, type Pipeline, type StageMemory, type StageNode } from '../../src/engine/stage.js';
import type { MemoryParams } from '../fixtures/stages/memory.js';
import type { WriteParams } from '../fixtures/stages/write.js';

const MEMORY = resolve('test/fixtures/stages/memory.ts');
const WRITE = resolve('test/fixtures/stages/write.ts');
const MB = 1 << 20;
const GB = 1e9;
// What a stage process (node + tsx) holds before it does anything, beside what the test allocates.
const RUNTIME_SLACK = 200 * MB;

let dir: string;
beforeEach(() => { dir = mkdtempSync(join(tmpdir(), 'forge-memory-')); });
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const memoryStage = (id: string, params: MemoryParams, memory: StageMemory = fixedMemory(1, 'test'), inputs: Record<string, string> = {}): StageNode => ({
  id, module: MEMORY, params: params as any, inputs, tools: [], memory,
});
const write = (id: string, params: WriteParams, memory: StageMemory = fixedMemory(1, 'test'), inputs: Record<string, string> = {}): StageNode => ({
  id, module: WRITE, params: params as any, inputs, tools: [], memory,
});

function run(p: Pipeline, opts: Partial<RunOptions> = {}) {
  return runPipeline(p, {
    cache: new StageCache(join(dir, 'cache')),
    scheduler: new Scheduler({ concurrency: 2, memoryBudgetBytes: 1e12 }),
    progress: silentProgress,
    toolVersions: {},
    ...opts,
  });
}

const runs = (f: string) => (existsSync(f) ? readFileSync(f, 'utf8').trim().split('\n').filter(Boolean).length : 0);

describe('measured stage memory', () => {
  it('samples a process tree: the process and its descendants, summed', () => {
    const s = sampleTree(process.pid);
    expect(s.pids[0]).toBe(process.pid);
    expect(s.privateBytes).toBeGreaterThan(10 * MB);
    expect(s.mappedBytes).toBeGreaterThan(1 * MB);
  });

  it('records the private memory a stage allocates in its own process, within tolerance', async () => {
    const r = await run({ nodes: [memoryStage('m', { privateMb: 300, holdMs: 1200 })], publish: [] });
    const s = r.stages[0];
    expect(s.status).toBe('ran');
    expect(s.peakPrivateBytes).toBeGreaterThanOrEqual(300 * MB);
    expect(s.peakPrivateBytes).toBeLessThan(300 * MB + RUNTIME_SLACK);
    expect(s.peakRssBytes).toBeGreaterThan(300 * MB); // kept beside the split
    // The cache entry keeps them; a cached run measured nothing.
    expect(r.entries.get('m')!.meta.peakPrivateBytes).toBe(s.peakPrivateBytes);
    const again = (await run({ nodes: [memoryStage('m', { privateMb: 300, holdMs: 1200 })], publish: [] })).stages[0];
    expect(again).toMatchObject({ status: 'cached', peakPrivateBytes: null, peakMappedBytes: null });
  });

  it('adds what a subprocess holds: its anonymous memory as private, the file it maps as mapped', async () => {
    const r = await run({ nodes: [memoryStage('m', { privateMb: 100, childPrivateMb: 250, childMappedMb: 200, holdMs: 1500 })], publish: [] });
    const s = r.stages[0];
    expect(s.status).toBe('ran');
    expect(s.peakPrivateBytes).toBeGreaterThanOrEqual(350 * MB);
    expect(s.peakPrivateBytes).toBeLessThan(350 * MB + RUNTIME_SLACK);
    expect(s.peakMappedBytes).toBeGreaterThanOrEqual(200 * MB);
    expect(s.peakMappedBytes).toBeLessThan(200 * MB + RUNTIME_SLACK);
  });
});

describe('a working set evicted while the stage runs', () => {
  it('is measured as what the stage tree read from disk: each time its mapped file was dropped and touched again', async () => {
    const r = await run({ nodes: [memoryStage('m', { childMappedMb: 64, childRereads: 3, holdMs: 600 })], publish: [] });
    const s = r.stages[0];
    expect(s.status).toBe('ran');
    // Three reads from disk after the first (which the page cache may still hold: just written).
    expect(s.diskReadBytes).toBeGreaterThanOrEqual(3 * 64 * MB);
    expect(r.entries.get('m')!.meta.diskReadBytes).toBe(s.diskReadBytes);
    expect(s.evicted).toBeUndefined(); // 0.2 GB: under the 1 GB floor, nothing said
  });

  it('is said when the stage read more than three times what it needs: its inputs, its mapped weights, at least 1 GB', () => {
    const predicted = { privateBytes: 1 * GB, mappedBytes: 2 * GB, how: 'test' };
    const measured = (read: number) => ({ privateBytes: GB, mappedBytes: 1.5 * GB, diskReadBytes: read });
    // A cold read of a 15 GB checkpoint is once what it needs.
    expect(checkEvicted(predicted, measured(15 * GB), 15 * GB)).toBeUndefined();
    expect(checkEvicted(predicted, measured(45 * GB), 15 * GB)).toBeUndefined();
    expect(checkEvicted(predicted, measured(142 * GB), 15 * GB)).toBe('its working set did not stay in memory: it read 142.00 GB from disk, 9.5× the 15.00 GB it needs (other jobs took the memory it maps; run it with less beside it)');
    // No inputs to speak of: its mapped working set, then the 1 GB floor.
    expect(checkEvicted(predicted, measured(6.5 * GB), 0)).toMatch(/6\.50 GB from disk, 3\.3× the 2\.00 GB it needs/);
    expect(checkEvicted(undefined, { privateBytes: 0, mappedBytes: 0, diskReadBytes: 2.9 * GB }, 0)).toBeUndefined();
    expect(checkEvicted(undefined, { privateBytes: 0, mappedBytes: 0 }, 0)).toBeUndefined(); // not measured
  });
});

describe('predicted stage memory', () => {
  it('keeps the prediction beside the measurement, without a flag when the stage stayed within it', async () => {
    const memory = fixedMemory(400 * MB, 'a fixed figure for the test', 100 * MB);
    const r = await run({ nodes: [memoryStage('m', { privateMb: 100, holdMs: 800 }, memory)], publish: [] });
    expect(r.stages[0].predicted).toEqual({ privateBytes: 400 * MB, mappedBytes: 100 * MB, how: 'a fixed figure for the test' });
    expect(r.stages[0].overPrediction).toBeUndefined();
  });

  it('flags in the record, and logs for --verbose only, when the measured private peak exceeds its prediction by more than 25%', async () => {
    // A diagnostic for forge's developers (a stale constant in pipelines/memory.ts), not a warning to every user.
    const warnings: string[] = [];
    const logged: string[] = [];
    const progress: Progress = { ...silentProgress, warn: (stage, m) => warnings.push(`${stage}: ${m}`), log: (stage, m) => logged.push(`${stage}: ${m}`) };
    const memory = fixedMemory(100 * MB, 'a figure that is too low', 500 * MB);
    const r = await run({ nodes: [memoryStage('m', { privateMb: 400, holdMs: 800 }, memory)], publish: [] }, { progress });
    expect(r.ok).toBe(true); // a warning, not a failure
    expect(r.stages[0].overPrediction).toMatch(/^measured peak over the prediction by more than 25%: private [\d.]+ MB vs 104\.9 MB predicted/);
    expect(r.stages[0].overPrediction).not.toMatch(/mapped/);
    expect(r.entries.get('m')!.meta.overPrediction).toBe(r.stages[0].overPrediction);
    expect(logged).toContain(`m: ${r.stages[0].overPrediction}`);
    expect(warnings).toEqual([]);
  });

  it('computes a prediction from an earlier stage\'s output', async () => {
    // Stage a writes "A"; b's prediction is a GB per character it reads there (1 GB).
    const fromA: StageMemory = { from: ['a'], predict: (d) => ({ privateBytes: readFileSync(join(d.a, 'value.txt'), 'utf8').length * GB, mappedBytes: 0, how: 'a GB per character of a' }) };
    const r = await run({ nodes: [write('a', { text: 'A' }), write('b', { text: 'B' }, fromA, { up: 'a' })], publish: [] });
    expect(r.stages[1].predicted).toEqual({ privateBytes: 1 * GB, mappedBytes: 0, how: 'a GB per character of a' });
  });
});

describe('refusal', () => {
  it('refuses a stage predicted over the budget before it starts, with the numbers', async () => {
    const counter = join(dir, 'big.count');
    const memory = fixedMemory(3 * GB, '3 × the input', 1 * GB);
    const scheduler = new Scheduler({ concurrency: 2, memoryBudgetBytes: 2 * GB, machineBytes: 24 * GB });
    const r = await run({ nodes: [write('big', { text: 'B', counter }, memory)], publish: [] }, { scheduler });
    expect(r.ok).toBe(false);
    expect(runs(counter)).toBe(0); // never started, not even alone
    expect(r.stages[0]).toMatchObject({ status: 'failed', predicted: { privateBytes: 3 * GB, mappedBytes: 1 * GB } });
    expect(r.failure?.message).toBe(
      'refused before it started: big is predicted to need 4.00 GB (3.00 GB private + 1.00 GB mapped), over the memory budget of 2.00 GB (--memory-budget; this machine has 24.00 GB); predicted from 3 × the input',
    );
  });

  it('refuses against the machine when the budget asked for is more than it has', async () => {
    const scheduler = new Scheduler({ concurrency: 2, memoryBudgetBytes: 100 * GB, machineBytes: 8 * GB });
    const r = await run({ nodes: [write('big', { text: 'B' }, fixedMemory(10 * GB, 'test'))], publish: [] }, { scheduler });
    expect(r.failure?.message).toMatch(/over this machine's 8\.00 GB of memory \(--memory-budget 100\.00 GB is more than it has\)/);
  });

  it('refuses as soon as the outputs its prediction and key need exist, not after the long stages it waits for', async () => {
    // As in the build: compile reads plan's output, runs after a slow gate (20 s), predicts from plan.
    // It is refused once plan is done and its own entry is found missing: the slow stage is stopped
    // (cancelled), not run to its end first.
    const huge: StageMemory = { from: ['plan'], predict: () => ({ privateBytes: 50 * GB, mappedBytes: 0, how: 'the plan' }) };
    const compileCounter = join(dir, 'compile.count');
    const p: Pipeline = {
      nodes: [
        write('plan', { text: 'P' }),
        write('slow', { text: 'S', sleepMs: 20_000 }, fixedMemory(1, 'test'), { up: 'plan' }),
        { ...write('compile', { text: 'C', counter: compileCounter }, huge, { up: 'plan' }), after: ['slow'] },
      ],
      publish: [],
    };
    const scheduler = new Scheduler({ concurrency: 2, memoryBudgetBytes: 10 * GB, machineBytes: 24 * GB });
    const r = await run(p, { scheduler });
    expect(r.stages.map((s) => [s.name, s.status])).toEqual([['plan', 'ran'], ['slow', 'cancelled'], ['compile', 'failed']]);
    expect(r.failure?.stage).toBe('compile');
    expect(r.failure?.message).toMatch(/^refused before it started: compile is predicted to need 50\.00 GB, over the memory budget of 10\.00 GB/);
    expect(runs(compileCounter)).toBe(0);
  });

  it('does not refuse a stage that is in the cache: it will not run', async () => {
    const memory = fixedMemory(50 * GB, 'too much');
    const p: Pipeline = { nodes: [write('a', { text: 'A' }), write('b', { text: 'B' }, fixedMemory(1, 'test'), { up: 'a' })], publish: [] };
    expect((await run(p)).ok).toBe(true);
    const scheduler = new Scheduler({ concurrency: 2, memoryBudgetBytes: 1 * GB, machineBytes: 24 * GB });
    const again = await run({ ...p, nodes: [p.nodes[0], { ...p.nodes[1], memory }] }, { scheduler });
    expect(again.stages.map((s) => s.status)).toEqual(['cached', 'cached']);
    const forced = await run({ ...p, nodes: [p.nodes[0], { ...p.nodes[1], memory }] }, { scheduler, force: ['b'] });
    expect(forced.failure).toMatchObject({ stage: 'b', message: expect.stringMatching(/^refused before it started: b is predicted to need 50\.00 GB/) });
  });

  it('fails a stage whose prediction cannot be computed, naming why', async () => {
    const broken: StageMemory = { from: ['a'], predict: (d) => JSON.parse(readFileSync(join(d.a, 'plan.json'), 'utf8')) };
    const r = await run({ nodes: [write('a', { text: 'A' }), write('b', { text: 'B' }, broken, { up: 'a' })], publish: [] });
    expect(r.failure?.stage).toBe('b');
    expect(r.failure?.message).toMatch(/^cannot predict its memory: ENOENT.*plan\.json/);
  });
});
