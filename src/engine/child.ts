// The process a stage runs in. Its own process gives each stage a true peak RSS, frees its memory
// when it ends, and lets the parent kill a hung stage. It dies with its parent (IPC disconnect) or
// when told to stop (SIGTERM), and takes the subprocess groups it started with it, so a
// killed build leaves no orphan writing into the cache or holding a lock.
import { pathToFileURL } from 'node:url';
import { killOwnedGroups } from './subprocess.js';
import { describeFailure } from './io-failure.js';
import type { Json, StageContext, StageModule } from './stage.js';

export interface ChildRequest {
  module: string;
  params: Json;
  inputs: Record<string, string>;
  out: string;
  tools: Record<string, string>;
}

export type ChildMessage =
  | { type: 'log'; message: string }
  | { type: 'progress'; done: number; total: number; label?: string }
  | { type: 'done'; outcome: unknown; peakRssBytes: number }
  | { type: 'failed'; message: string; stack?: string; peakRssBytes: number };

const send = (m: ChildMessage) => new Promise<void>((r) => process.send!(m, () => r()));

async function main(req: ChildRequest): Promise<void> {
  let subprocessPeak = 0;
  const peak = () => Math.max(process.resourceUsage().maxRSS * 1024, subprocessPeak);
  try {
    const mod = (await import(pathToFileURL(req.module).href)) as { stage?: StageModule };
    if (!mod.stage) throw new Error(`${req.module} does not export 'stage'`);
    const ctx: StageContext = {
      params: req.params,
      inputs: req.inputs,
      out: req.out,
      tools: req.tools,
      log: (message) => void send({ type: 'log', message }),
      progress: (done, total, label) => void send({ type: 'progress', done, total, label }),
      notePeakRss: (bytes) => { subprocessPeak = Math.max(subprocessPeak, bytes); },
    };
    const outcome = (await mod.stage.run(ctx)) ?? {};
    await send({ type: 'done', outcome, peakRssBytes: peak() });
  } catch (e) {
    const err = e as Error;
    await send({ type: 'failed', message: describeFailure(err, req.out), stack: err.stack, peakRssBytes: peak() });
  }
  process.disconnect();
}

// The build went away (its end of the IPC channel closed, even under kill -9) or asks this stage to
// stop: kill what this stage started, then leave.
const stop = (code: number) => () => {
  killOwnedGroups();
  process.exit(code);
};
process.on('disconnect', stop(0));
process.on('SIGTERM', stop(143));
// Ctrl-C reaches the whole foreground process group, this stage too: the build decides (it stops its
// stages with SIGTERM and records them cancelled), so a stage exiting first is not taken for a failure.
process.on('SIGINT', () => undefined);
process.once('message', (req) => void main(req as ChildRequest));
