// The engine's lifecycle: failed and cancelled stages leave nothing half-made, the first error stops
// the rest, and no subprocess outlives the stage or the build that started it.
import { describe, it, expect, beforeEach, afterEach } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import lockfile from 'proper-lockfile';
import { StageCache } from '../../src/engine/cache.js';
import { Scheduler } from '../../src/engine/scheduler.js';
import { runPipeline, type RunOptions } from '../../src/engine/run.js';
import { silentProgress } from '../../src/engine/progress.js';
import { runOwned, killOwnedGroups, ownedGroupCount } from '../../src/engine/subprocess.js';
import { describeFailure } from '../../src/engine/io-failure.js';
import { fixedMemory, type Pipeline, type StageNode } from '../../src/engine/stage.js';
import type { WriteParams } from '../fixtures/stages/write.js';
import type { SpawnParams } from '../fixtures/stages/spawn.js';
import { alive, describePids, pidsWithEnv, sleep, waitFor } from '../helpers/procs.js';

const WRITE = resolve('test/fixtures/stages/write.ts');
const SPAWN = resolve('test/fixtures/stages/spawn.ts');

let dir: string;
let cacheRoot: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'forge-lifecycle-'));
  cacheRoot = join(dir, 'cache');
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const write = (id: string, params: WriteParams, inputs: Record<string, string> = {}): StageNode => ({
  id, module: WRITE, params: params as any, inputs, tools: [], memory: fixedMemory(1, 'test'),
});
const spawnStage = (id: string, params: SpawnParams): StageNode => ({ id, module: SPAWN, params: params as any, inputs: {}, tools: [], memory: fixedMemory(1, 'test') });

function run(p: Pipeline, opts: Partial<RunOptions> = {}) {
  return runPipeline(p, {
    cache: new StageCache(cacheRoot),
    scheduler: new Scheduler({ concurrency: 2, memoryBudgetBytes: 1e12 }),
    progress: silentProgress,
    toolVersions: {},
    ...opts,
  });
}

const tmpEntries = (stage: string) => (existsSync(join(cacheRoot, stage, '.tmp')) ? readdirSync(join(cacheRoot, stage, '.tmp')) : []);
const lines = (f: string) => (existsSync(f) ? readFileSync(f, 'utf8').trim().split('\n').filter(Boolean).length : 0);

describe('failed stages', () => {
  it('leave no temp directory (empty or not) in the cache, and the log their error names is kept where the error says', async () => {
    const r = await run({ nodes: [write('a', { text: 'A', fail: 'helper crashed', failLog: true })], publish: [] });
    expect(r.ok).toBe(false);
    expect(tmpEntries('a')).toEqual([]);
    const log = /log: (\S+)\)/.exec(r.failure!.message)![1];
    expect(log).not.toContain('/.tmp/');
    expect(readFileSync(log, 'utf8')).toBe('what the helper said\n');
  });

  it('name ENOSPC and the directory written when a stage failed on a full disk', () => {
    const enospc = Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' });
    expect(describeFailure(enospc, '/cache/export/.tmp/k.1.ab')).toMatch(
      /^ENOSPC: no space left on device, write \(ENOSPC: no space left on device writing under \/cache\/export\/\.tmp\/k\.1\.ab/,
    );
    // A helper that died of a full disk without saying so (SIGABRT) is read off the free space left.
    expect(describeFailure(new Error('killed by SIGABRT'), dir)).toBe('killed by SIGABRT'); // this disk has room
    expect(describeFailure(new Error('killed by SIGABRT'), '/cache/compile/.tmp/k', 1 << 20)).toBe(
      'killed by SIGABRT (ENOSPC: no space left on device writing under /cache/compile/.tmp/k, 1048576 bytes free)',
    );
  });
});

describe('a full disk in any stage', () => {
  it("names the stage's directory when the engine's own write of its entry fails (an ENOSPC that names no file), not only the next stage", async () => {
    // The export stage's own writes are named by its process (above); its entry's meta.json is
    // written by the engine, where Node's ENOSPC carried no path.
    class FullDisk extends StageCache {
      override async adopt(tmp: string, full: Parameters<StageCache['adopt']>[1]): ReturnType<StageCache['adopt']> {
        if (full.stage === 'export') throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', errno: -28, syscall: 'write' });
        return super.adopt(tmp, full);
      }
    }
    const r = await run({ nodes: [write('export', { text: 'graphs' }), write('quantize', { text: 'q' }, { g: 'export' })], publish: [] }, { cache: new FullDisk(cacheRoot) });
    expect(r.ok).toBe(false);
    expect(r.failure?.stage).toBe('export');
    expect(r.failure?.message).toMatch(new RegExp(`^ENOSPC: no space left on device, write \\(ENOSPC: no space left on device writing under ${join(cacheRoot, 'export', '.tmp').replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}/\\S+, \\d+ bytes free\\)$`));
    expect(tmpEntries('export')).toEqual([]);
    // Said once, however many layers pass it on.
    expect(describeFailure(new Error(r.failure!.message), '/elsewhere', 0)).toBe(r.failure!.message);
  });
});

describe('stale temp directories', () => {
  it("are removed at the next start when their build is gone, but not while another build holds the entry's lock", async () => {
    const tmpRoot = join(cacheRoot, 'a', '.tmp');
    mkdirSync(join(tmpRoot, 'deadkey.4242.abcd'), { recursive: true });
    writeFileSync(join(tmpRoot, 'deadkey.4242.abcd', 'half.bin'), 'x');
    mkdirSync(join(tmpRoot, 'livekey.4343.abcd'), { recursive: true });
    const release = await lockfile.lock(join(cacheRoot, 'a', 'livekey'), { realpath: false, lockfilePath: join(cacheRoot, 'a', 'livekey.lock') });
    try {
      await run({ nodes: [write('b', { text: 'B' })], publish: [] });
      expect(tmpEntries('a')).toEqual(['livekey.4343.abcd']);
    } finally {
      await release();
    }
  });
});

describe('the first error', () => {
  it('stops the rest: a running stage is terminated, a waiting one never starts, both recorded as cancelled', async () => {
    const slow = join(dir, 'slow.count');
    const queued = join(dir, 'queued.count');
    const r = await run({
      nodes: [
        write('plan', { text: 'P', sleepMs: 2000, fail: 'plan refused the config' }),
        write('native', { text: 'N', sleepMs: 60_000, counter: slow }),
        write('trace', { text: 'T', counter: queued }),
      ],
      publish: [],
    }, { scheduler: new Scheduler({ concurrency: 2, memoryBudgetBytes: 1e12 }) });
    expect(r.failure).toEqual({ stage: 'plan', message: 'plan refused the config' });
    expect(r.stages.map((s) => [s.name, s.status])).toEqual([['plan', 'failed'], ['native', 'cancelled'], ['trace', 'cancelled']]);
    expect(r.stages[1].error).toBe('stopped after plan failed');
    expect(lines(slow)).toBe(1); // it had started
    expect(lines(queued)).toBe(0); // it never did
    expect(tmpEntries('native')).toEqual([]);
    expect(existsSync(join(cacheRoot, 'native'))).toBe(true);
    expect(readdirSync(join(cacheRoot, 'native')).filter((n) => /^[0-9a-f]{64}$/.test(n))).toEqual([]);
  });

  it('does not stop the other gates when a gate fails: their verdicts belong in the report', async () => {
    const GATE = resolve('test/fixtures/stages/gate.ts');
    const r = await run({
      nodes: [
        write('trace', { text: 'T' }),
        { id: 'oracle', module: GATE, params: { want: 'nothing like it' } as any, inputs: { value: 'trace' }, tools: [], memory: fixedMemory(1, 'test') },
        write('parity', { text: 'P', sleepMs: 500 }, { up: 'trace' }),
      ],
      publish: [],
    });
    expect(r.stages.map((s) => s.status)).toEqual(['ran', 'ran', 'ran']);
    expect(r.failure?.stage).toBe('oracle');
  });

  it('an interrupt stops everything and says so', async () => {
    const stop = new AbortController();
    const pending = run({ nodes: [write('long', { text: 'L', sleepMs: 60_000, counter: join(dir, 'long.count') })], publish: [] }, { signal: stop.signal });
    await waitFor(() => lines(join(dir, 'long.count')) === 1, 'the stage to start');
    stop.abort('SIGINT');
    const r = await pending;
    expect(r.ok).toBe(false);
    expect(r.interrupted).toBe('SIGINT');
    expect(r.stages[0]).toMatchObject({ status: 'cancelled', error: 'interrupted: SIGINT' });
    expect(tmpEntries('long')).toEqual([]);
  });
});

describe('subprocesses', () => {
  it('runOwned kills the whole group at its timeout, grandchildren included', async () => {
    const pidFile = join(dir, 'pids');
    const r = await runOwned('bash', ['-c', `sleep 60 & echo "$$ $!" > ${pidFile}; wait`], { timeoutSeconds: 1 });
    expect(r.timedOut).toBe(true);
    const pids = readFileSync(pidFile, 'utf8').trim().split(' ').map(Number);
    await waitFor(() => pids.every((p) => !alive(p)), 'the group to die', 2000);
    expect(ownedGroupCount()).toBe(0);
  });

  it('runOwned says which command could not start', async () => {
    const r = await runOwned(join(dir, 'no-such-tool'), []);
    expect(r.spawnError).toMatch(/no-such-tool/);
    expect(r.exitCode).toBeNull();
  });

  it('killOwnedGroups kills every group still running', async () => {
    const pidFile = join(dir, 'pids');
    const pending = runOwned('bash', ['-c', `sleep 60 & echo "$$ $!" > ${pidFile}; wait`]);
    await waitFor(() => existsSync(pidFile) && readFileSync(pidFile, 'utf8').includes(' '), 'the helper to start');
    killOwnedGroups();
    const r = await pending;
    expect(r.signal).toBe('SIGKILL');
    const pids = readFileSync(pidFile, 'utf8').trim().split(' ').map(Number);
    await waitFor(() => pids.every((p) => !alive(p)), 'the group to die', 2000);
  });

  it('die with their stage when the build stops it (SIGTERM to the stage process): the helper and its grandchild are gone 2 s later', async () => {
    const pidFile = join(dir, 'helper.pids');
    const stop = new AbortController();
    const pending = run({ nodes: [spawnStage('compile', { pidFile, seconds: 300 })], publish: [] }, { signal: stop.signal });
    await waitFor(() => existsSync(pidFile), 'the helper and its grandchild to start');
    const pids = readFileSync(pidFile, 'utf8').trim().split(' ').map(Number);
    expect(pids.every(alive)).toBe(true);
    stop.abort('SIGTERM');
    const r = await pending;
    expect(r.stages[0]).toMatchObject({ status: 'cancelled' });
    await sleep(2000);
    expect(pids.filter(alive), `still alive:\n${describePids(pids.filter(alive))}`).toEqual([]);
  });

  for (const how of ['SIGKILL', 'SIGTERM', 'SIGINT'] as const) {
    it(`die with the build: ${how} of the process running the pipeline leaves no stage process or helper alive 2 s later`, async () => {
      const marker = randomUUID();
      const pidFile = join(dir, 'helper.pids');
      const p: Pipeline = { nodes: [spawnStage('compile', { pidFile, seconds: 300 })], publish: [] };
      const specFile = join(dir, 'spec.json');
      writeFileSync(specFile, JSON.stringify({ pipeline: p, cacheRoot }));
      const build = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/run-pipeline.ts', specFile], {
        stdio: 'ignore', env: { ...process.env, FORGE_TEST_MARKER: marker },
      });
      const exited = new Promise((r) => build.on('exit', r));
      await waitFor(() => existsSync(pidFile), 'the helper and its grandchild to start');
      const tree = pidsWithEnv('FORGE_TEST_MARKER', marker);
      expect(tree.length).toBeGreaterThanOrEqual(4); // the build, its stage process, the helper shell, its sleep
      build.kill(how);
      await exited;
      await sleep(2000);
      const left = pidsWithEnv('FORGE_TEST_MARKER', marker).filter(alive);
      expect(left, `still alive:\n${describePids(left)}`).toEqual([]);
    });
  }
});
