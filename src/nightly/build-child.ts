// The process one queued build runs in, forked by `forge worker`. Its own process keeps the worker's
// event loop free (BullMQ renews the job's lock from it, so a long build is never taken for
// stalled) and ties the build's life to the worker's: when the worker dies, even under kill -9, the
// IPC channel closes and this process kills what it started and leaves at once — no orphan build
// goes on writing into the worker's out dir while another worker redoes the job. The stage cache
// needs nothing more: entries appear by rename, and a dead holder's lock goes stale (engine/cache.ts).
// Which local cache the build uses comes with the worker's environment (FORGE_CACHE, inherited by
// fork); the shared one is the worker's --cache (else FORGE_REMOTE_CACHE, inherited too).
import { killOwnedGroups } from '../engine/subprocess.js';
import { lineProgress, type Progress } from '../engine/progress.js';
import type { BuildSummary } from './summary.js';
import { runBuildJob, type BuildChildRequest } from './build-job.js';

export type { BuildChildRequest } from './build-job.js';
export type BuildChildMessage =
  | { type: 'stage'; stage: string; status: string }
  | { type: 'progress'; stage: string; done: number; total: number; label?: string }
  | { type: 'done'; summary: BuildSummary };

const send = (m: BuildChildMessage) => new Promise<void>((r) => process.send!(m, () => r()));

/** The usual progress lines on stderr (the worker's log), and each event to the worker too. */
function reporting(verbose: boolean): Progress {
  const lines = lineProgress(process.stderr, verbose);
  return {
    start: (s) => { lines.start(s); void send({ type: 'stage', stage: s, status: 'running' }); },
    update: (s, done, total, label) => { lines.update(s, done, total, label); void send({ type: 'progress', stage: s, done, total, label }); },
    log: lines.log,
    warn: lines.warn,
    note: lines.note,
    end: (s, status, seconds) => { lines.end(s, status, seconds); void send({ type: 'stage', stage: s, status }); },
    close: lines.close,
  };
}

async function main(req: BuildChildRequest): Promise<void> {
  const summary = await runBuildJob(req, reporting(Boolean(req.verbose)));
  await send({ type: 'done', summary });
  process.disconnect();
}

process.on('disconnect', () => {
  killOwnedGroups();
  process.exit(0);
});
process.once('message', (req) => void main(req as BuildChildRequest));
