// `forge build` on a machine that fails it: a disk that fills, Ctrl-C and kill -9 mid-compile, a
// rebuild that fails over a good bundle, --until, bad numbers. Runs the CLI as a user would.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { cpSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statfsSync, writeFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { createHash, randomUUID } from 'node:crypto';
import { spawn, spawnSync } from 'node:child_process';
import { forge, lastJson } from './helpers/forge-cli.js';
import { alive, describePids, pidsWithEnv, sleep, waitFor } from './helpers/procs.js';

const statuses = (record: { stages: Array<{ name: string; status: string }> }) => Object.fromEntries(record.stages.map((s) => [s.name, s.status]));

/** path → sha256 of every file under dir: a bundle "byte-identical afterwards" means this is equal. */
function treeHashes(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out[relative(dir, p)] = createHash('sha256').update(readFileSync(p)).digest('hex');
    }
  };
  walk(dir);
  return out;
}

/** Whether this machine lets us mount a small tmpfs (root in a container that allows it). */
function tmpfsMountable(): boolean {
  if (process.getuid?.() !== 0) return false;
  const probe = mkdtempSync(join(tmpdir(), 'forge-tmpfs-probe-'));
  const ok = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', probe]).status === 0;
  if (ok) spawnSync('umount', [probe]);
  rmSync(probe, { recursive: true, force: true });
  return ok;
}
const CAN_MOUNT = tmpfsMountable();

let work: string;
let good: string; // a complete tiny-qwen3 bundle
let goodRecord: any;
const mounts: string[] = [];

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'forge-lifecycle-cli-'));
  good = join(work, 'good');
  const r = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', good]);
  expect(r.code, r.stderr).toBe(0);
  goodRecord = lastJson(r.stdout);
});

afterAll(() => {
  for (const m of mounts) spawnSync('umount', [m]);
  rmSync(work, { recursive: true, force: true });
});

/** A fresh tmpfs of `mb` MB. */
function mountTmpfs(mb: number): string {
  const dir = mkdtempSync(join(work, 'tmpfs-'));
  const r = spawnSync('mount', ['-t', 'tmpfs', '-o', `size=${mb}m`, 'tmpfs', dir]);
  if (r.status !== 0) throw new Error(`mount tmpfs: ${r.stderr}`);
  mounts.push(dir);
  return dir;
}

/** Fills dir's filesystem until `leave` bytes are free. */
function fillUntil(dir: string, leave: number): string {
  const s = statfsSync(dir);
  const ballast = join(dir, 'ballast');
  writeFileSync(ballast, Buffer.alloc(Math.max(0, s.bavail * s.bsize - leave)));
  return ballast;
}

/** A copy of the good build's own cache entries for `stages`, under a new cache root. */
function seedCache(root: string, stages: string[]): void {
  for (const name of stages) {
    const key = goodRecord.stages.find((s: { name: string }) => s.name === name).key;
    cpSync(join(process.env.FORGE_CACHE!, name, key), join(root, name, key), { recursive: true });
  }
}

const entryDirs = (root: string, stage: string) => (existsSync(join(root, stage)) ? readdirSync(join(root, stage)).filter((n) => /^[0-9a-f]{64}$/.test(n)) : []);
const tmpDirs = (root: string, stage: string) => (existsSync(join(root, stage, '.tmp')) ? readdirSync(join(root, stage, '.tmp')) : []);

/** A copy of the good bundle, as the last good build in an output directory. */
function previousBundle(name: string, parent = work): string {
  const dir = join(parent, name);
  cpSync(good, dir, { recursive: true });
  return dir;
}

describe.skipIf(!CAN_MOUNT)('a disk that fills up (a real tmpfs; skipped when this machine cannot mount one)', () => {
  for (const [stage, seeded, until, leave] of [
    // The reference export writes only graphs now (~150 KB for the twin; its weights are links to the checkpoint).
    ['export', ['fetch', 'plan'], 'export', 32 << 10],
    ['compile', ['fetch', 'plan', 'trace', 'export', 'quantize', 'oracle'], 'compile', 600 << 10],
  ] as const) {
    it(`mid-${stage}: exits non-zero with a run record naming ${stage}, the path and ENOSPC; no partial cache entry; the previous bundle byte-identical`, async () => {
      const fs = mountTmpfs(24);
      const cache = join(fs, 'cache');
      seedCache(cache, [...seeded]);
      const ballast = fillUntil(fs, leave);
      const out = previousBundle(`prev-${stage}`);
      const before = treeHashes(out);
      const r = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--until', until, '--json', '--out', out], { FORGE_CACHE: cache });
      expect(r.code).toBe(1);
      expect(r.stderr).not.toMatch(/Unhandled 'error' event|\n\s+at /);
      const rec = lastJson(r.stdout);
      expect(rec).toMatchObject({ ok: false, status: 'failed', bundle: null });
      expect(statuses(rec)[stage]).toBe('failed');
      console.log(`[observed] disk full mid-${stage}: ${rec.error}`);
      expect(rec.error).toMatch(new RegExp(`^${stage}: .*ENOSPC`, 's'));
      expect(rec.error).toContain(cache); // the path written
      expect(entryDirs(cache, stage)).toEqual([]);
      expect(tmpDirs(cache, stage)).toEqual([]);
      expect(treeHashes(out)).toEqual(before);
      // This run's record sits beside the bundle it did not replace.
      expect(JSON.parse(readFileSync(join(`${out}.incomplete`, 'build', 'run.json'), 'utf8'))).toEqual(rec);
      expect(rec.buildDir).toBe(join(`${out}.incomplete`, 'build'));
      // The disk, not the build, was the problem: with room again the same build completes.
      rmSync(ballast);
      const again = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--until', until, '--json', '--out', out], { FORGE_CACHE: cache });
      expect(again.code, again.stderr).toBe(0);
      expect(statuses(lastJson(again.stdout))[stage]).toBe('ran');
    });
  }

  it('while writing the bundle: exits non-zero naming the output path and ENOSPC, and the previous bundle stays byte-identical', async () => {
    const fs = mountTmpfs(8);
    const out = previousBundle('prev', fs);
    const before = treeHashes(out);
    fillUntil(fs, 300 << 10); // less than one more bundle
    const r = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', out, '--force', 'bundle']);
    expect(r.code).toBe(1);
    const rec = lastJson(r.stdout);
    expect(rec).toMatchObject({ ok: false, status: 'failed', bundle: null, buildDir: null });
    console.log(`[observed] disk full writing the bundle: ${rec.error}`);
    expect(rec.error).toMatch(/^output: .*ENOSPC/);
    expect(rec.error).toContain(fs);
    expect(treeHashes(out)).toEqual(before);
    expect(readdirSync(fs).sort()).toEqual(['ballast', 'prev']); // no staging dir left
  });
});

describe('no orphans', () => {
  for (const how of ['SIGKILL', 'SIGINT'] as const) {
    it(`${how === 'SIGINT' ? 'Ctrl-C' : 'kill -9'} of a build in its compile stage leaves no forge process alive 2 s later${how === 'SIGINT' ? ', and the run record says it was interrupted' : ''}`, async () => {
      const marker = randomUUID();
      const out = join(work, `orphans-${how}`);
      // Its own process group, as a shell's foreground job: Ctrl-C signals the whole group.
      const child = spawn(resolve('forge'), ['build', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', out, '--force', 'compile'], {
        detached: true, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, CI: '1', FORGE_TEST_MARKER: marker },
      });
      let stdout = '';
      child.stdout!.on('data', (d) => (stdout += d));
      const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
      const compiling = () => pidsWithEnv('FORGE_TEST_MARKER', marker).some((p) => describePids([p]).includes('qnn_compile.py'));
      await waitFor(compiling, 'the QNN compile helper to start', 300_000);
      process.kill(-child.pid!, how);
      const code = await exited;
      await sleep(2000);
      const left = pidsWithEnv('FORGE_TEST_MARKER', marker).filter(alive);
      expect(left, `still alive:\n${describePids(left)}`).toEqual([]);
      if (how === 'SIGINT') {
        expect(code).toBe(130);
        const rec = lastJson(stdout);
        expect(rec).toMatchObject({ ok: false, status: 'interrupted', error: 'interrupted by SIGINT', bundle: null });
        expect(statuses(rec).compile).toBe('cancelled');
      }
      // A rerun finds no stray lock holder: it takes over the compile's lock and completes.
      const again = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', out]);
      expect(again.code, again.stderr).toBe(0);
    });
  }
});

describe('output directories', () => {
  it('a failed rebuild leaves the last good bundle byte-identical and writes its own record beside it', async () => {
    const out = previousBundle('prev-failed');
    const before = treeHashes(out);
    const recipes = join(work, 'recipes-bad');
    cpSync('recipes', recipes, { recursive: true });
    const file = join(recipes, 'tiny-qwen3', 'recipe.json');
    const recipe = JSON.parse(readFileSync(file, 'utf8'));
    recipe.config = { model_type: 'qwen3', hidden_size: 4096 };
    writeFileSync(file, JSON.stringify(recipe));
    const r = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--out', out], { FORGE_RECIPES: recipes });
    expect(r.code).toBe(1);
    expect(r.stdout).toContain(`run record: ${out}.incomplete/build/run.json`);
    expect(treeHashes(out)).toEqual(before);
    expect(JSON.parse(readFileSync(join(`${out}.incomplete`, 'build', 'run.json'), 'utf8'))).toMatchObject({ status: 'failed', bundle: null });
    // The next good build replaces the bundle and drops the stale record.
    const ok = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--out', out]);
    expect(ok.code, ok.stderr).toBe(0);
    expect(existsSync(`${out}.incomplete`)).toBe(false);
  });

  it('puts back the bundle a build killed mid-swap had moved aside, and removes its staging dir', async () => {
    const out = join(work, 'killed-mid-swap');
    const deadPid = 4194305; // above Linux's largest pid: no such process
    const aside = previousBundle(`killed-mid-swap.old-${deadPid}`);
    const before = treeHashes(aside);
    cpSync(good, `${out}.staging-${deadPid}`, { recursive: true });
    const r = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--until', 'plan', '--out', out]);
    expect(r.code, r.stderr).toBe(0);
    expect(treeHashes(out)).toEqual(before);
    expect(readdirSync(work).filter((n) => n.startsWith('killed-mid-swap')).sort()).toEqual(['killed-mid-swap', 'killed-mid-swap.incomplete']);
  });

  it('--until says the run is partial: status, console line and record, and claims no bundle', async () => {
    const out = join(work, 'partial');
    const r = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--until', 'export', '--out', out]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^partial: stopped after export as asked; no bundle made, no gate ran$/m);
    expect(r.stdout).not.toMatch(/^ok:/m);
    const rec = JSON.parse(readFileSync(join(out, 'build', 'run.json'), 'utf8'));
    expect(rec).toMatchObject({ ok: true, status: 'partial', until: 'export', bundle: null, buildDir: join(out, 'build'), gates: {} });
    expect(readdirSync(out)).toEqual(['build']);
  });
});

describe('numeric flags', () => {
  for (const [flag, value, says] of [
    ['--jobs', '0', "--jobs wants a whole number of at least 1, got '0'"],
    ['--jobs', 'abc', "--jobs wants a whole number of at least 1, got 'abc'"],
    ['--jobs', '2x', "--jobs wants a whole number of at least 1, got '2x'"],
    ['--memory-budget', '-1', "--memory-budget wants a number of GB above 0, got '-1'"],
    ['--memory-budget', '8GB', "--memory-budget wants a number of GB above 0, got '8GB'"],
    ['--shard-ceiling', '0', "--shard-ceiling wants a number of GB above 0, got '0'"],
    ['--shard-ceiling', '1.5x', "--shard-ceiling wants a number of GB above 0, got '1.5x'"],
  ]) {
    it(`refuses ${flag} ${value} in one line naming the flag`, async () => {
      const r = await forge(['build', 'tiny-qwen3', '--arch', 'v81', flag, value]);
      expect(r.code).toBe(1);
      expect(r.stderr.trim()).toBe(`forge: ${says}`);
    });
  }
});
