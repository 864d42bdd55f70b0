// Measured memory of a stage's whole process tree: the stage process and every process below it
// (runOwned's subprocess groups, their children), read from /proc at an interval and summed over
// the tree at each sample. Two figures, because they cost the machine differently:
// - private: RssAnon, memory only that process holds (heaps, tensors); it cannot be dropped.
// - mapped: RssFile, resident pages of mapped files (weights ORT or safetensors mmap); they sit in
//   the page cache and the kernel can drop them under pressure (at the price of re-reading).
// Each peak is the highest sum seen at one sample; a spike shorter than the interval can be missed,
// which is why the interval is short (a scan costs ~3 ms of CPU with ~150 processes on this 2-core
// machine: under 2% of a core at 200 ms). Beside them, what the tree read from storage (page cache
// misses, mapped pages faulted in included): how a working set evicted while it ran shows.
import { readFileSync, readdirSync } from 'node:fs';

export interface MemoryPeak {
  privateBytes: number;
  mappedBytes: number;
  /**
   * Bytes its processes read from storage (/proc/<pid>/io read_bytes: page cache misses, by read()
   * or by touching mapped pages that were not resident). Absent where it was not measured.
   */
  diskReadBytes?: number;
}

export interface TreeSample extends MemoryPeak {
  pids: number[];
}

/** The fields of /proc/<pid>/stat after the command name (field 3, the state, first), or null when it is gone. */
function statFields(pid: number): string[] | null {
  try {
    // The command name (field 2) is in parentheses and may itself hold ') ': parse after the last one.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  } catch {
    return null; // exited between readdir and read
  }
}

/** pid → parent pid for every process visible in /proc. */
function parents(): Map<number, number> {
  const out = new Map<number, number>();
  for (const name of readdirSync('/proc')) {
    const pid = Number(name);
    if (!Number.isInteger(pid)) continue;
    const f = statFields(pid);
    if (f) out.set(pid, Number(f[1]));
  }
  return out;
}

/** Bytes one process has read from storage so far (not its reaped children's); 0 when it is gone or unreadable. */
export function diskReadBytes(pid: number): number {
  try {
    const m = /^read_bytes:\s+(\d+)$/m.exec(readFileSync(`/proc/${pid}/io`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/** The root and all its descendants (by parent pid), root first. */
export function processTree(root: number): number[] {
  const byParent = new Map<number, number[]>();
  for (const [pid, ppid] of parents()) {
    const kids = byParent.get(ppid);
    if (kids) kids.push(pid);
    else byParent.set(ppid, [pid]);
  }
  const tree: number[] = [];
  const stack = [root];
  while (stack.length) {
    const pid = stack.pop()!;
    tree.push(pid);
    stack.push(...(byParent.get(pid) ?? []));
  }
  return tree;
}

const RSS_ANON = /^RssAnon:\s+(\d+) kB/m;
const RSS_FILE = /^RssFile:\s+(\d+) kB/m;
const kB = (status: string, field: RegExp) => {
  const m = field.exec(status);
  return m ? Number(m[1]) * 1024 : 0;
};

/** Private (RssAnon) and mapped (RssFile) bytes of one process now; zeros when it is gone. */
export function processMemory(pid: number): MemoryPeak {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    return { privateBytes: kB(status, RSS_ANON), mappedBytes: kB(status, RSS_FILE) };
  } catch {
    return { privateBytes: 0, mappedBytes: 0 };
  }
}

/** One sample of a process tree: the sums over every process in it. */
export function sampleTree(root: number): TreeSample {
  const pids = processTree(root);
  let privateBytes = 0;
  let mappedBytes = 0;
  for (const pid of pids) {
    const m = processMemory(pid);
    privateBytes += m.privateBytes;
    mappedBytes += m.mappedBytes;
  }
  return { pids, privateBytes, mappedBytes };
}

/** /proc is Linux's; elsewhere nothing is sampled and the peaks stay null. */
export const canSampleMemory = () => process.platform === 'linux';

/**
 * Samples root's tree every intervalMs until stop(), which takes one last sample and returns the
 * peaks (later calls return the same, sampling nothing), or null when nothing could be sampled (not Linux).
 */
export function watchTreeMemory(root: number, intervalMs = 200): { stop(): MemoryPeak | null } {
  if (!canSampleMemory()) return { stop: () => null };
  const peak: MemoryPeak = { privateBytes: 0, mappedBytes: 0, diskReadBytes: 0 };
  // Each process's count as last seen: a process that exits keeps what it had at its last sample.
  const reads = new Map<number, number>();
  const take = () => {
    const s = sampleTree(root);
    peak.privateBytes = Math.max(peak.privateBytes, s.privateBytes);
    peak.mappedBytes = Math.max(peak.mappedBytes, s.mappedBytes);
    for (const pid of s.pids) reads.set(pid, Math.max(reads.get(pid) ?? 0, diskReadBytes(pid)));
    peak.diskReadBytes = [...reads.values()].reduce((a, b) => a + b, 0);
  };
  take();
  const timer = setInterval(take, intervalMs);
  timer.unref();
  let stopped = false;
  return {
    stop: () => {
      if (!stopped) {
        clearInterval(timer);
        take();
        stopped = true;
      }
      return { ...peak };
    },
  };
}

