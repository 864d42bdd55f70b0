// `forge nightly --status --queue redis://…`: every job of the latest nightly (or of --run), read
// from BullMQ: waiting, active (on which worker, at which stage), completed, failed (the build, or the
// job) or not built (the machines failed, not the build), and how many
// times it was started and how often its worker went away under it.
import { Queue, type Job, type JobType } from 'bullmq';
import { connectRedis, isJobProgress, QUEUE_NAME, type JobProgress } from './queue.js';
import type { BuildSummary } from './summary.js';

export interface JobStatus {
  id: string;
  build: string;
  state: string;
  /** Times a worker started it (a handed-back or stalled job is started again). */
  attempts: number;
  /** Times its worker went away under it (BullMQ's stalled-job detection put it back). */
  stalled: number;
  worker?: string;
  /** Stage progress while it runs, or the stages of its result once done. */
  stages: Array<{ name: string; status: string }>;
  current?: JobProgress['current'];
  /** The build's result: ok, or why not; a failed job's reason. */
  result?: string;
  /** Workers that handed it back unrun, and why (while it waits). */
  handedBack?: Record<string, string>;
  /** Failures of the machines' (not the build's) that handed it back, oldest first. */
  infra?: Array<{ worker: string; reason: string }>;
}

export interface QueueStatus {
  runId: string | null;
  jobs: JobStatus[];
}

const STATES: JobType[] = ['active', 'waiting', 'prioritized', 'delayed', 'waiting-children', 'completed', 'failed'];

function describe(job: Job, state: string): JobStatus & { index: number; runId: string; timestamp: number } {
  const data = job.data as { runId?: string; index?: number; recipe?: string; arch?: string };
  const progress = isJobProgress(job.progress) ? job.progress : undefined;
  const summary = state === 'completed' ? (job.returnvalue as BuildSummary | undefined) : undefined;
  // BullMQ completes the job of a build that failed (the build ran; its summary says how): shown as
  // failed, and one the machines could not build as such.
  const shown = summary && !summary.ok ? (summary.infra ? 'not built' : 'failed') : state;
  return {
    id: String(job.id),
    runId: String(data.runId ?? ''),
    index: Number(data.index ?? 0),
    timestamp: job.timestamp,
    build: `${data.recipe}/${data.arch}`,
    state: shown,
    attempts: job.attemptsStarted,
    stalled: job.stalledCounter,
    ...(summary?.queue?.worker ?? progress?.worker ?? job.processedBy ? { worker: summary?.queue?.worker ?? progress?.worker ?? job.processedBy } : {}),
    // The build's own stage statuses say 'cached' for both caches; 'cached (remote)' as its progress said it.
    stages: summary?.stages.map((s) => ({ name: s.name, status: s.source === 'remote' ? 'cached (remote)' : s.status })) ?? progress?.stages ?? [],
    ...(state === 'active' && progress?.current ? { current: progress.current } : {}),
    ...(summary ? { result: summary.ok ? 'ok' : summary.infra ? `NOT BUILT: ${summary.infra}` : `FAILED: ${summary.error ?? summary.status}` } : {}),
    ...(state === 'failed' ? { result: `job failed: ${job.failedReason}` } : {}),
    ...(progress?.handedBack && !['active', 'completed', 'failed'].includes(state) ? { handedBack: progress.handedBack } : {}),
    ...(progress?.infra?.length && !summary?.infra ? { infra: progress.infra } : {}),
  };
}

/** The jobs of run `runId`, or of the run whose job was added last; in matrix order. */
export async function queueStatus(url: string, runId?: string): Promise<QueueStatus> {
  const connection = await connectRedis(url);
  const queue = new Queue(QUEUE_NAME, { connection });
  try {
    const all = [];
    for (const state of STATES) for (const job of await queue.getJobs(state, 0, -1)) if (job) all.push(describe(job, state));
    const run = runId ?? all.reduce<{ runId: string; timestamp: number } | null>((a, j) => (!a || j.timestamp > a.timestamp ? j : a), null)?.runId ?? null;
    const jobs = all.filter((j) => j.runId === run).sort((a, b) => a.index - b.index);
    return { runId: run, jobs: jobs.map(({ index: _i, runId: _r, timestamp: _t, ...j }) => j) };
  } finally {
    await queue.close();
    connection.disconnect();
  }
}

/** One line per job: build, state, attempts, worker, stages done and the one running. */
export function formatStatus(s: QueueStatus): string {
  if (!s.runId) return 'no nightly jobs on this queue';
  const width = Math.max(12, ...s.jobs.map((j) => j.build.length));
  const lines = s.jobs.map((j) => {
    // A job back in the queue after its worker died still carries that worker's last progress:
    // shown as where it was, not as running.
    const live = j.state === 'active';
    const done = j.stages.filter((x) => x.status !== 'running');
    const running = live ? j.stages.filter((x) => x.status === 'running').map((x) => x.name) : [];
    const c = j.current;
    const at = (name: string) => (c && c.stage === name ? `${name} ${c.done}/${c.total}${c.label ? ` ${c.label}` : ''}` : name);
    // Cached is cached, from this machine's cache or the shared one ('cached (remote)').
    const cached = done.filter((x) => x.status.startsWith('cached'));
    const remote = cached.filter((x) => x.status === 'cached (remote)').length;
    const stages = j.stages.length ? `; stages ${done.length} done (${cached.length} cached${remote ? `, ${remote} of them from the shared cache` : ''})${running.length ? `, running ${running.map(at).join(', ')}` : ''}` : '';
    const back = j.handedBack ? `; handed back by ${Object.entries(j.handedBack).map(([w, why]) => `${w} (${why})`).join(', ')}` : '';
    const infra = j.infra ? `; handed back after ${j.infra.length === 1 ? 'a failure' : `${j.infra.length} failures`} of the machine, not the build: ${j.infra.map((f) => `${f.worker} (${f.reason})`).join(', ')}` : '';
    const ran = live || ['completed', 'failed', 'not built'].includes(j.state);
    return `${j.build.padEnd(width)} ${j.state.padEnd(9)} attempts ${j.attempts}${j.stalled ? ` (stalled ${j.stalled})` : ''}${j.worker ? ` ${ran ? 'on' : 'last on'} ${j.worker}` : ''}${stages}${j.result ? `; ${j.result}` : ''}${back}${infra}`;
  });
  return [`run ${s.runId}: ${s.jobs.length} jobs`, ...lines].join('\n');
}
