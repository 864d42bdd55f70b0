// Progress: bars on a TTY, plain lines elsewhere (CI logs), nothing in tests that ask for silence.
import { took } from '../units.js';
import cliProgress from 'cli-progress';

export interface Progress {
  start(stage: string): void;
  update(stage: string, done: number, total: number, label?: string): void;
  log(stage: string, message: string): void;
  /** Shown whatever the verbosity: something the user should act on (a shared-cache upload failed …). */
  warn(stage: string, message: string): void;
  /** Shown whatever the verbosity, as it is: what the build is doing that the user would otherwise wonder about (waiting on another build's lock …). */
  note(stage: string, message: string): void;
  /** `seconds` the stage's own; `queuedSeconds` what it waited before it started (a slot, a lock). */
  end(stage: string, status: string, seconds: number, queuedSeconds?: number): void;
  close(): void;
}

export const silentProgress: Progress = { start() {}, update() {}, log() {}, warn() {}, note() {}, end() {}, close() {} };

/** One line per event on a stream (stderr by default, so `--json` keeps stdout clean). */
export function lineProgress(stream: NodeJS.WritableStream = process.stderr, verbose = false): Progress {
  const lastPct = new Map<string, number>();
  return {
    start: (s) => stream.write(`[forge] ${s}: running\n`),
    update: (s, done, total, label) => {
      // Plain logs get a line per 25%, not one per tick.
      const pct = total > 0 ? Math.floor((100 * done) / total / 25) * 25 : 0;
      if (lastPct.get(s) === pct) return;
      lastPct.set(s, pct);
      stream.write(`[forge] ${s}: ${pct}%${label ? ` ${label}` : ''}\n`);
    },
    log: (s, m) => verbose && stream.write(`[forge] ${s}: ${m}\n`),
    warn: (s, m) => stream.write(`[forge] ${s}: warning: ${m}\n`),
    note: (s, m) => stream.write(`[forge] ${s}: ${m}\n`),
    end: (s, status, seconds, queued) => stream.write(`[forge] ${s}: ${status} (${took(seconds, queued)})\n`),
    close: () => {},
  };
}

export function barProgress(verbose = false): Progress {
  const multi = new cliProgress.MultiBar(
    { format: ' {stage} |{bar}| {percentage}% {label}', hideCursor: true, clearOnComplete: false, stream: process.stderr },
    cliProgress.Presets.shades_classic,
  );
  const bars = new Map<string, cliProgress.SingleBar>();
  const bar = (s: string) => {
    let b = bars.get(s);
    if (!b) {
      b = multi.create(1, 0, { stage: s.padEnd(12), label: '' });
      bars.set(s, b);
    }
    return b;
  };
  return {
    start: (s) => void bar(s),
    update: (s, done, total, label) => {
      const b = bar(s);
      b.setTotal(Math.max(1, total));
      b.update(done, { label: label ?? '' });
    },
    log: (s, m) => verbose && multi.log(`${s}: ${m}\n`),
    warn: (s, m) => multi.log(`${s}: warning: ${m}\n`),
    note: (s, m) => multi.log(`${s}: ${m}\n`),
    end: (s, status, seconds, queued) => {
      const b = bar(s);
      b.setTotal(1);
      b.update(1, { label: `${status} (${took(seconds, queued)})` });
    },
    close: () => multi.stop(),
  };
}

export function defaultProgress(verbose = false): Progress {
  return process.stderr.isTTY && !process.env.CI ? barProgress(verbose) : lineProgress(process.stderr, verbose);
}
