// p-queue bounds how many stages run at once; the memory budget bounds what they may use together.
// Each stage reserves its predicted working set (private bytes plus the mapped pages it keeps
// touching: see MemoryPrediction) for as long as it runs, and starts only when that also fits in what
// the machine has left beside other processes (MemAvailable): a stage started into memory others
// hold would have its mapped weights evicted and read again and again. A stage predicted over the limit alone is
// never started: the engine refuses it (refusal()) as soon as its prediction is known.
import { readFileSync } from 'node:fs';
import { totalmem } from 'node:os';
import PQueue from 'p-queue';
import { workingSet, type MemoryPrediction } from './stage.js';
import { formatBytes as gb } from '../units.js';

/** What a build leaves the system, its own process and the page cache: 10% of the machine, at least 2 GB. */
const reserve = (total: number) => Math.max(2e9, 0.1 * total);

/**
 * The machine's memory less a reserve for the system, the build's own process and the page cache:
 * 10%, at least 2 GB. (It was 75% while stage peaks were guesses; predictions are now calibrated and
 * every run checks them, warning past 25% over.)
 */
export function defaultMemoryBudget(total: number): number {
  return Math.floor(total - reserve(total));
}

/** The smallest machine whose default budget holds `need` bytes: the inverse of total − reserve(total). */
export function machineFor(need: number): number {
  return Math.max(need / 0.9, need + 2e9);
}


export interface SchedulerOptions {
  concurrency: number;
  memoryBudgetBytes: number;
  /** The machine's memory (default: os.totalmem()); a budget above it is capped to it. */
  machineBytes?: number;
  /** Memory the kernel could give new work now (default: /proc/meminfo's MemAvailable; unbounded elsewhere). */
  available?: () => number;
  /** Said once when a stage waits because other processes on the machine hold memory its working set needs. */
  onShort?: (message: string) => void;
}

/** MemAvailable from /proc/meminfo, or Infinity where there is none (not Linux): then only the budget bounds. */
export function memAvailable(): number {
  try {
    const m = /^MemAvailable:\s+(\d+) kB$/m.exec(readFileSync('/proc/meminfo', 'utf8'));
    return m ? Number(m[1]) * 1024 : Infinity;
  } catch {
    return Infinity;
  }
}

/** While a stage waits on other processes' memory, how often the machine is looked at again. */
const RECHECK_MS = 2000;


export class Scheduler {
  private readonly queue: PQueue;
  private reserved = 0;
  /** The private part of `reserved`: what running stages hold that MemAvailable no longer counts. */
  private reservedPrivate = 0;
  private waiters: Array<() => void> = [];
  /** Highest sum of reserved working sets that ran at once; tests read it to check the budget held. */
  maxReserved = 0;
  /** What running stages may reserve together: the budget, or the machine when that is smaller. */
  readonly limitBytes: number;

  constructor(readonly options: SchedulerOptions) {
    this.queue = new PQueue({ concurrency: Math.max(1, options.concurrency) });
    this.limitBytes = Math.min(options.memoryBudgetBytes, options.machineBytes ?? totalmem());
  }

  /** Why a stage with this prediction may not run at all (it alone exceeds the limit), or null. */
  refusal(stage: string, p: MemoryPrediction, remedy?: (limitBytes: number) => string): string | null {
    const need = workingSet(p);
    if (need <= this.limitBytes) return null;
    const machine = this.options.machineBytes ?? totalmem();
    const limit = this.options.memoryBudgetBytes <= machine
      ? `the memory budget of ${gb(this.options.memoryBudgetBytes)} (--memory-budget; this machine has ${gb(machine)})`
      : `this machine's ${gb(machine)} of memory (--memory-budget ${gb(this.options.memoryBudgetBytes)} is more than it has)`;
    const split = p.mappedBytes > 0 ? ` (${gb(p.privateBytes)} private + ${gb(p.mappedBytes)} mapped)` : '';
    const options = remedy ? `; ${remedy(this.limitBytes)}` : '';
    return `refused before it started: ${stage} is predicted to need ${gb(need)}${split}, over ${limit}; predicted from ${p.how}${options}`;
  }

  /**
   * What running stages may reserve together now: the limit, less what other processes on the
   * machine hold (its memory in use, less the private memory this build's own stages reserved;
   * mapped pages are page cache, which MemAvailable counts as free).
   */
  limitNow(): { bytes: number; others: number } {
    const machine = this.options.machineBytes ?? totalmem();
    const available = (this.options.available ?? memAvailable)();
    if (!Number.isFinite(available)) return { bytes: this.limitBytes, others: 0 };
    const others = Math.max(0, machine - available - this.reservedPrivate);
    return { bytes: this.limitBytes - others, others };
  }

  private async reserve(bytes: number, privateBytes: number, stage: string): Promise<void> {
    let said = false;
    for (;;) {
      if (this.reserved + bytes <= this.limitBytes) {
        const now = this.limitNow();
        // With nothing of its own running a build starts its stage whatever else the machine does.
        if (this.reserved === 0 || this.reserved + bytes <= now.bytes) break;
        if (!said) this.options.onShort?.(`${stage} waits: it needs ${gb(bytes)} beside the ${gb(this.reserved)} this build's stages hold, and other processes on this machine use ${gb(now.others)}`);
        said = true;
        // Nothing of ours may end soon: look at the machine again.
        await new Promise<void>((r) => {
          const t = setTimeout(r, RECHECK_MS);
          this.waiters.push(() => { clearTimeout(t); r(); });
        });
        continue;
      }
      await new Promise<void>((r) => this.waiters.push(r));
    }
    this.reserved += bytes;
    this.reservedPrivate += privateBytes;
    this.maxReserved = Math.max(this.maxReserved, this.reserved);
  }

  private release(bytes: number, privateBytes: number): void {
    this.reserved -= bytes;
    this.reservedPrivate -= privateBytes;
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w();
  }

  /**
   * Runs fn when a slot is free and its predicted working set (`bytes`, of which `privateBytes`
   * private) fits beside what is running, and beside what other processes on the machine hold.
   */
  run<T>(bytes: number, fn: () => Promise<T>, privateBytes = bytes, stage = 'a stage'): Promise<T> {
    // The engine refuses such a stage first; waiting here would be forever.
    if (bytes > this.limitBytes) return Promise.reject(new Error(`a stage needing ${gb(bytes)} cannot run under a ${gb(this.limitBytes)} limit`));
    return this.queue.add(async () => {
      await this.reserve(bytes, privateBytes, stage);
      try {
        return await fn();
      } finally {
        this.release(bytes, privateBytes);
      }
    }) as Promise<T>;
  }
}
