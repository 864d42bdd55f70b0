// Finds processes by an environment marker: every process forge starts inherits its environment,
// so a marker set on the build finds the build's whole tree, however it was re-parented.
import { readdirSync, readFileSync } from 'node:fs';

/** Pids (other than this process) whose environment has name=value. */
export function pidsWithEnv(name: string, value: string): number[] {
  const want = `${name}=${value}`;
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${entry}/environ`, 'latin1').split('\0').includes(want)) pids.push(Number(entry));
    } catch { /* gone, or not ours to read */ }
  }
  return pids;
}

/** One line per process: pid and command line, for a failure message that says what survived. */
export function describePids(pids: number[]): string {
  return pids.map((p) => {
    try {
      return `${p} ${readFileSync(`/proc/${p}/cmdline`, 'latin1').replaceAll('\0', ' ').trim()}`;
    } catch {
      return `${p} (gone)`;
    }
  }).join('\n');
}

/** Whether pid is alive and not a zombie. */
export function alive(pid: number): boolean {
  try {
    return !/^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, 'utf8'));
  } catch {
    return false;
  }
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export async function waitFor(cond: () => boolean, what: string, ms = 60_000): Promise<void> {
  const t = Date.now();
  while (!cond()) {
    if (Date.now() - t > ms) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}
