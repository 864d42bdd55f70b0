// What the real-size benchmarks measure a command with: its process group's peak private (RssAnon)
// and mapped (RssFile) memory sampled from /proc, /usr/bin/time's figures, the machine's lowest
// MemAvailable, and a watchdog that stops it before the box (24 GB, no swap) thrashes.
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream, existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Writable } from 'node:stream';
import { repoRoot } from '../src/paths.js';
import { sampleTree } from '../src/engine/memory.js';

export function dirBytes(path: string): { bytes: number; files: number } {
  if (!existsSync(path)) return { bytes: 0, files: 0 };
  let bytes = 0;
  let files = 0;
  for (const e of readdirSync(path, { withFileTypes: true })) {
    const p = join(path, e.name);
    if (e.isDirectory()) {
      const sub = dirBytes(p);
      bytes += sub.bytes;
      files += sub.files;
    } else if (e.isFile()) {
      bytes += statSync(p).size;
      files++;
    }
  }
  return { bytes, files };
}

/**
 * Bytes a directory tree holds on disk that are its own: each inode counted once, and inodes that
 * `exclude` holds (e.g. the checkpoint's files, hard-linked in by the reference export) not at all.
 */
export function uniqueBytes(path: string, exclude: Set<string> = new Set()): number {
  const seen = new Set(exclude);
  let bytes = 0;
  const walk = (p: string) => {
    for (const e of readdirSync(p, { withFileTypes: true })) {
      const q = join(p, e.name);
      if (e.isDirectory()) walk(q);
      else if (e.isFile()) {
        const st = statSync(q);
        const id = `${st.dev}:${st.ino}`;
        if (!seen.has(id)) {
          seen.add(id);
          bytes += st.size;
        }
      }
    }
  };
  if (existsSync(path)) walk(path);
  return bytes;
}

/** dev:inode of every file under a directory. */
export function inodesOf(path: string): Set<string> {
  const ids = new Set<string>();
  for (const e of readdirSync(path, { withFileTypes: true })) {
    const q = join(path, e.name);
    if (e.isDirectory()) for (const id of inodesOf(q)) ids.add(id);
    else if (e.isFile()) {
      const st = statSync(q);
      ids.add(`${st.dev}:${st.ino}`);
    }
  }
  return ids;
}

export function freeBytes(path: string): number {
  const r = spawnSync('df', ['-B1', '--output=avail', path], { encoding: 'utf8' });
  return Number(r.stdout.trim().split('\n').pop());
}

/** Try to drop the page cache; false where not permitted (containers). */
export function dropCaches(): boolean {
  spawnSync('sync');
  const r = spawnSync('sh', ['-c', 'echo 3 > /proc/sys/vm/drop_caches'], { encoding: 'utf8' });
  return r.status === 0;
}

/** Read every checkpoint file once so all contenders start from a page cache holding it. */
export async function warmCache(dir: string): Promise<void> {
  for (const f of readdirSync(dir)) {
    const p = join(dir, f);
    if (!statSync(p).isFile()) continue;
    await pipeline(createReadStream(p, { highWaterMark: 8 << 20 }), new Writable({ write: (_c, _e, cb) => cb() }));
  }
}

/** Pids of a process group (pgid = leader pid), from /proc. */
export function groupPids(pgid: number): number[] {
  const pids: number[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(fields[2]) === pgid) pids.push(Number(d)); // field 5 (pgrp), counted from state
    } catch {
      // process went away
    }
  }
  return pids;
}

/** MemAvailable from /proc/meminfo, in bytes. */
export function memAvailable(): number {
  const m = readFileSync('/proc/meminfo', 'utf8').match(/^MemAvailable:\s+(\d+) kB$/m);
  return m ? Number(m[1]) * 1024 : Infinity;
}

/** The kernel's count of OOM kills so far (/proc/vmstat oom_kill), or null where unreadable. */
export function oomKills(): number | null {
  try {
    const m = readFileSync('/proc/vmstat', 'utf8').match(/^oom_kill (\d+)$/m);
    return m ? Number(m[1]) : null;
  } catch {
    return null;
  }
}

export interface Measured {
  status: 'ok' | 'failed' | 'timed-out' | 'killed-rss-cap' | 'killed-low-memory' | 'killed-signal';
  seconds: number;
  peakRssBytes: number | null;
  /** Highest private + mapped RSS summed over the process tree, sampled every 0.5 s (cross-check, children included). */
  sampledPeakGroupRssBytes: number;
  /** Peak sampled anonymous RSS (private memory) and file-backed RSS (mapped files), summed over the tree. */
  sampledPeakAnonBytes: number;
  sampledPeakFileBytes: number;
  /** Lowest MemAvailable of the machine seen while it ran. */
  minMemAvailableBytes: number;
  userSeconds: number | null;
  systemSeconds: number | null;
  exitCode: number | null;
  signal: string | null;
  /** OOM kills the kernel counted while it ran (any process: check `signal` too). */
  oomKillsDuring: number | null;
  stdout: string;
  stderrTail: string;
}

/** Runs `cmd` under /usr/bin/time -v in its own process group; measures wall time around it. */
export async function measure(cmd: string[], opts: { timeoutS?: number; rssCapBytes?: number; minAvailBytes?: number; logFile?: string; env?: NodeJS.ProcessEnv } = {}): Promise<Measured> {
  const timeFile = join(tmpdir(), `.forge-bench-time-${process.pid}.txt`);
  rmSync(timeFile, { force: true });
  const t0 = performance.now();
  const child = spawn('/usr/bin/time', ['-v', '-o', timeFile, ...cmd], { cwd: repoRoot(), detached: true, stdio: ['ignore', 'pipe', 'pipe'], env: opts.env ?? process.env });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => { stdout += d.toString(); });
  child.stderr.on('data', (d: Buffer) => {
    stderr += d.toString();
    if (stderr.length > 1 << 20) stderr = stderr.slice(-(1 << 19));
  });
  type Why = 'timed-out' | 'killed-rss-cap' | 'killed-low-memory';
  let killedFor: Why | null = null;
  let sampled = 0;
  let peakAnon = 0;
  let peakFile = 0;
  let minAvail = Infinity;
  const kill = (why: Why) => {
    if (killedFor) return;
    killedFor = why;
    // The measured command first, so /usr/bin/time (the group leader) still reports its figures.
    for (const pid of groupPids(child.pid!)) if (pid !== child.pid) try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
    setTimeout(() => { try { process.kill(-child.pid!, 'SIGKILL'); } catch { /* gone */ } }, 5000).unref();
  };
  const oomBefore = oomKills();
  const poll = setInterval(() => {
    // The whole tree, not the process group: stage helpers run in groups of their own (runOwned).
    const tree = sampleTree(child.pid!);
    const rss = tree.privateBytes + tree.mappedBytes;
    if (rss > sampled) sampled = rss;
    peakAnon = Math.max(peakAnon, tree.privateBytes);
    peakFile = Math.max(peakFile, tree.mappedBytes);
    const avail = memAvailable();
    minAvail = Math.min(minAvail, avail);
    if (opts.rssCapBytes && rss > opts.rssCapBytes) kill('killed-rss-cap');
    if (opts.minAvailBytes && avail < opts.minAvailBytes) kill('killed-low-memory');
  }, 500);
  const timer = opts.timeoutS ? setTimeout(() => kill('timed-out'), opts.timeoutS * 1000) : null;
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((res) => child.on('close', (c, s) => res([c, s])));
  const seconds = (performance.now() - t0) / 1000;
  clearInterval(poll);
  if (timer) clearTimeout(timer);
  if (opts.logFile) writeFileSync(opts.logFile, stderr);
  const tv = existsSync(timeFile) ? readFileSync(timeFile, 'utf8') : '';
  rmSync(timeFile, { force: true });
  const num = (re: RegExp) => {
    const m = tv.match(re);
    return m ? Number(m[1]) : null;
  };
  const maxKb = num(/Maximum resident set size \(kbytes\): (\d+)/);
  const exit = num(/Exit status: (\d+)/);
  const sig = tv.match(/Command terminated by signal (\d+)/);
  let status: Measured['status'] = killedFor ?? (sig ? 'killed-signal' : (exit ?? code) === 0 ? 'ok' : 'failed');
  if (status === 'ok' && code !== 0) status = 'failed';
  return {
    status, seconds,
    peakRssBytes: maxKb === null ? null : maxKb * 1024,
    sampledPeakGroupRssBytes: sampled,
    sampledPeakAnonBytes: peakAnon,
    sampledPeakFileBytes: peakFile,
    minMemAvailableBytes: minAvail,
    userSeconds: num(/User time \(seconds\): ([\d.]+)/),
    systemSeconds: num(/System time \(seconds\): ([\d.]+)/),
    exitCode: exit ?? code,
    signal: sig ? `signal ${sig[1]}` : signal,
    oomKillsDuring: oomBefore === null ? null : (oomKills() ?? oomBefore) - oomBefore,
    stdout,
    // Progress bars redraw with \r: keep the last state of each line only.
    stderrTail: stderr.split('\n').map((l) => l.split('\r').filter((x) => x.trim()).pop() ?? '').filter((l) => l.trim() && !l.includes('skip to quantize')).slice(-8).join('\n'),
  };
}

/** sha256 over src/ (paths and contents): which forge code a run measured, even uncommitted. */
export function srcHash(): string {
  const h = createHash('sha256');
  const walk = (dir: string) => {
    for (const e of readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) h.update(p).update('\0').update(readFileSync(p)).update('\0');
    }
  };
  walk(join(repoRoot(), 'src'));
  return h.digest('hex').slice(0, 16);
}

export function gitState(): { head: string | null; dirtySrc: string[] } {
  const head = spawnSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: repoRoot(), encoding: 'utf8' });
  const st = spawnSync('git', ['status', '--porcelain', '--', 'src'], { cwd: repoRoot(), encoding: 'utf8' });
  return { head: head.status === 0 ? head.stdout.trim() : null, dirtySrc: st.status === 0 ? st.stdout.split('\n').filter(Boolean).map((l) => l.slice(3)) : [] };
}

export const gb = (b: number | null | undefined) => (b == null ? null : Math.round((b / 1e9) * 1000) / 1000);
export const r3 = (x: number) => Math.round(x * 1000) / 1000;
