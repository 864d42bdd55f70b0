// p-queue bounds how many stages run at once; the memory budget bounds what they may use together.
// A stage that alone exceeds the budget still runs, but only when nothing else is running.
import PQueue from 'p-queue';

export interface SchedulerOptions {
  concurrency: number;
  memoryBudgetBytes: number;
}

export class Scheduler {
  private readonly queue: PQueue;
  private reserved = 0;
  private running = 0;
  private waiters: Array<() => void> = [];
  /** Highest sum of declared peaks that ran at once; tests read it to check the budget held. */
  maxReserved = 0;

  constructor(readonly options: SchedulerOptions) {
    this.queue = new PQueue({ concurrency: Math.max(1, options.concurrency) });
  }

  private fits(bytes: number): boolean {
    return this.running === 0 || this.reserved + bytes <= this.options.memoryBudgetBytes;
  }

  private async reserve(bytes: number): Promise<void> {
    while (!this.fits(bytes)) await new Promise<void>((r) => this.waiters.push(r));
    this.reserved += bytes;
    this.running += 1;
    this.maxReserved = Math.max(this.maxReserved, this.reserved);
  }

  private release(bytes: number): void {
    this.reserved -= bytes;
    this.running -= 1;
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w();
  }

  /** Runs fn when a slot is free and its declared peak memory fits beside what is running. */
  run<T>(peakMemoryBytes: number, fn: () => Promise<T>): Promise<T> {
    return this.queue.add(async () => {
      await this.reserve(peakMemoryBytes);
      try {
        return await fn();
      } finally {
        this.release(peakMemoryBytes);
      }
    }) as Promise<T>;
  }
}
