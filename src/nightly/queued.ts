// `forge nightly --queue redis://…`: the matrix's builds as BullMQ jobs for `forge worker`s on any
// number of machines, and their summaries back in matrix order. Everything after that (compare,
// reports, history) is the sequential nightly's own path (run.ts).
import { Queue, QueueEvents, type Job } from 'bullmq';
import { buildId, type Matrix } from './matrix.js';
import { BuildSummarySchema, failedSummary, type BuildSummary } from './summary.js';
import { bareUrl, connectedWorkers, connectRedis, envMs, jobIdOf, QUEUE_NAME, REDIS_PASSWORD_ENV, redactUrl, unholdable, type BuildJob } from './queue.js';

export interface QueuedRequest {
  matrix: Matrix;
  queue: string;
  runId: string;
  log: (line: string) => void;
}

/**
 * Enqueues one job per build (a job that already exists — a nightly rerun with the same --run — is
 * attached to, not added twice) and waits for every one. A job that fails (its build process died
 * twice, or three workers died under it) is a failed build of the nightly, like a build that throws.
 */
/** How often the waiting nightly looks for jobs nobody can run (FORGE_QUEUE_WATCH_MS; tests shorten it). */
const watchMs = () => envMs('FORGE_QUEUE_WATCH_MS', 30_000);

/**
 * A nightly would otherwise wait in silence for a job that no connected worker can hold (every one
 * has handed it back: its declared memory is over their budgets) or for workers that never came:
 * each is said once. It keeps waiting: a bigger worker may still join.
 */
async function watchWaiting(queue: Queue<BuildJob>, ids: Set<string | undefined>, url: string, log: (line: string) => void, said: Set<string>): Promise<void> {
  const connected = await connectedWorkers(queue);
  if (!connected.length) {
    if (!said.has('none')) log(`no worker is connected to ${redactUrl(url)}: start one with forge worker --queue ${bareUrl(url)}${bareUrl(url) !== url ? ` (the password in $${REDIS_PASSWORD_ENV})` : ''}`);
    said.add('none');
    return;
  }
  for (const job of await queue.getJobs(['delayed', 'waiting', 'prioritized'], 0, -1)) {
    if (!job || !ids.has(job.id)) continue;
    const why = unholdable(job.progress, connected);
    if (why && !said.has(`${job.id}@${connected.join(',')}`)) {
      said.add(`${job.id}@${connected.join(',')}`);
      log(`${job.id}: ${why}`);
    }
  }
}

export async function buildOnQueue({ matrix, queue: url, runId, log }: QueuedRequest): Promise<BuildSummary[]> {
  const connection = await connectRedis(url);
  const queue = new Queue<BuildJob>(QUEUE_NAME, { connection });
  // QueueEvents reads a Redis stream with blocking calls: a connection of its own.
  // BullMQ never closes a connection it was handed: both are closed below, or the process would stay.
  const eventsConnection = connection.duplicate();
  const events = new QueueEvents(QUEUE_NAME, { connection: eventsConnection });
  let watch: NodeJS.Timeout | undefined;
  try {
    await events.waitUntilReady();
    const jobs = (await queue.addBulk(matrix.builds.map((b, index) => ({
      name: buildId(b),
      data: { format: 'forge-build-job/1' as const, runId, index, recipe: b.recipe, arch: b.arch, ...(b.toolchain ? { toolchain: b.toolchain } : {}), memoryBytes: Math.round((b.memoryGB ?? 0) * 1e9) },
      opts: {
        jobId: jobIdOf(runId, b.recipe, b.arch, b.toolchain),
        // One retry when the build process itself dies (killed for memory…); a worker that dies is
        // BullMQ's stalled-job path instead (queue.ts queueTimings), which uses no attempt.
        attempts: 2,
        removeOnComplete: { age: 7 * 24 * 3600 },
        removeOnFail: { age: 7 * 24 * 3600 },
      },
    })))) as Job<BuildJob, BuildSummary>[];
    log(`run ${runId}: ${jobs.length} build jobs on ${redactUrl(url)} (forge nightly --status --queue … shows them; rerun with --run ${runId} to wait for them again)`);

    const ids = new Set(jobs.map((j) => j.id));
    const onEvent = (what: string) => ({ jobId }: { jobId: string }) => { if (ids.has(jobId)) log(`${jobId}: ${what}`); };
    events.on('active', onEvent('taken by a worker'));
    events.on('stalled', onEvent('stalled (its worker went away): back in the queue for another worker'));
    // What was said already, for this nightly: each waiting job (per set of connected workers) once.
    const said = new Set<string>();
    watch = setInterval(() => void watchWaiting(queue, ids, url, log, said).catch(() => undefined), watchMs());

    return await Promise.all(matrix.builds.map(async (b, n) => {
      const job = jobs[n];
      const t0 = Date.now();
      try {
        const raw = await job.waitUntilFinished(events);
        const parsed = BuildSummarySchema.safeParse(raw);
        if (!parsed.success) return failedSummary(b, `job ${job.id} returned no valid build summary: ${parsed.error.issues[0]?.message}`, (Date.now() - t0) / 1000);
        const s = parsed.data;
        log(`${job.id}: ${s.ok ? 'ok' : s.infra ? `NOT BUILT (${s.infra})` : `FAILED (${s.error ?? s.status})`} on ${s.queue?.worker ?? '?'}, ${s.stages.filter((x) => x.status === 'cached').length}/${s.stages.length} stages cached`);
        return s;
      } catch (e) {
        log(`${job.id}: job failed: ${(e as Error).message}`);
        return failedSummary(b, `job ${job.id} failed: ${(e as Error).message}`, (Date.now() - t0) / 1000);
      }
    }));
  } finally {
    clearInterval(watch);
    await events.close();
    await queue.close();
    eventsConnection.disconnect();
    connection.disconnect();
  }
}
