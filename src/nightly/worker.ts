// `forge worker --queue redis://…`: takes build jobs off the nightly's queue, one (or --concurrency)
// at a time, and runs each as `forge build` would, in a child process (build-child.ts), reporting
// stage progress on the job and returning the build's summary as the job's result.
//
// Memory: a job declares its peak (the matrix's memoryGB). A worker that cannot hold it hands it
// back with BullMQ's documented move-to-delayed (job.moveToDelayed + DelayedError): the job is not
// failed and uses no attempt, and after a short delay any worker may take it again — a bigger one
// runs it. One queue per memory class was the alternative, but a worker listening on several
// classes would run one job per class at once and could exceed its budget; handing back keeps one
// queue, one concurrency and an exact budget check. The build itself also gets the worker's budget
// as its --memory-budget, so its scheduler holds each stage to it as well.
import { fork, type ChildProcess } from 'node:child_process';
import { hostname } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { DelayedError, UnrecoverableError, Worker, type Job } from 'bullmq';
import { repoRoot } from '../paths.js';
import { formatBytes as gb } from '../units.js';
import { BuildSummarySchema, type BuildSummary } from './summary.js';
import { admission, connectRedis, isJobProgress, parseBuildJob, queueTimings, QUEUE_NAME, redactUrl, type JobProgress } from './queue.js';
import type { BuildChildMessage, BuildChildRequest } from './build-child.js';

export interface WorkerRequest {
  queue: string;
  /** Largest peak a job may declare, and the builds' own --memory-budget. */
  memoryBudgetBytes: number;
  concurrency?: number;
  /** Where builds are written: <out>/<recipe>/<arch>[@<toolchain>] (default out/worker). */
  out?: string;
  /** s3://bucket/prefix: the shared stage cache every build reads and writes (else FORGE_REMOTE_CACHE). */
  remoteCache?: string;
  verbose?: boolean;
  log?: (line: string) => void;
}

/** How long a handed-back job waits before any worker may take it again. */
const HAND_BACK_MS = 5_000;

const childScript = () => join(repoRoot(), 'src', 'nightly', 'build-child.ts');
const tsxLoader = () => pathToFileURL(join(repoRoot(), 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;

/** Runs one build in its own process; resolves with its summary, rejects if the process dies without one. */
function runChild(req: BuildChildRequest, onMessage: (m: BuildChildMessage) => void, children: Set<ChildProcess>): Promise<BuildSummary> {
  return new Promise((resolvePromise, reject) => {
    const child = fork(childScript(), [], { execArgv: ['--import', tsxLoader()], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    children.add(child);
    let summary: BuildSummary | undefined;
    child.on('message', (m: BuildChildMessage) => {
      if (m.type === 'done') summary = m.summary;
      else onMessage(m);
    });
    child.once('error', reject);
    child.once('exit', (code, signal) => {
      children.delete(child);
      if (summary) resolvePromise(summary);
      else reject(new Error(`the build process of ${req.recipe}/${req.arch} ended without a result (${signal ? `signal ${signal}` : `exit code ${code}`})`));
    });
    child.send(req);
  });
}

export async function runWorker(req: WorkerRequest): Promise<void> {
  const log = req.log ?? ((l: string) => process.stderr.write(`[worker] ${l}\n`));
  const connection = await connectRedis(req.queue);
  const name = `${hostname()}:${process.pid}`;
  const out = resolve(req.out ?? join('out', 'worker'));
  const { lockMs, stalledMs, maxStalled } = queueTimings();
  const concurrency = req.concurrency ?? 1;
  const children = new Set<ChildProcess>();
  let reserved = 0;

  const processor = async (job: Job, token?: string): Promise<BuildSummary> => {
    let data;
    try {
      data = parseBuildJob(job.data, job.id ?? '?');
    } catch (e) {
      // A payload no worker can run (another forge version's, hand-made): fail it now, no retries.
      throw new UnrecoverableError((e as Error).message);
    }
    const refused = admission(data, req.memoryBudgetBytes, reserved);
    if (refused) {
      log(`handing back ${job.id}: ${refused}`);
      // Recorded on the job, so --status and the waiting nightly can say why nobody runs it. A lost
      // record must not fail the job (that would use an attempt): the hand-back goes on without it.
      const before = isJobProgress(job.progress) ? job.progress : { stages: [] };
      await job.updateProgress({ ...before, handedBack: { ...before.handedBack, [name]: refused } }).catch(() => undefined);
      await job.moveToDelayed(Date.now() + HAND_BACK_MS, token);
      throw new DelayedError();
    }
    reserved += data.memoryBytes;
    const progress: JobProgress = { worker: name, stages: [] };
    // Progress updates go to Redis one at a time, in order; a lost one is not worth failing a build.
    let pending = job.updateProgress({ ...progress }).catch(() => undefined);
    const push = () => { const p = structuredClone(progress); pending = pending.then(() => job.updateProgress(p)).catch(() => undefined); };
    log(`${job.id}: building ${data.recipe}/${data.arch} (attempt ${job.attemptsStarted}${job.stalledCounter ? `, after ${job.stalledCounter} stalled` : ''})`);
    try {
      const summary = await runChild(
        {
          recipe: data.recipe, arch: data.arch, ...(data.toolchain ? { toolchain: data.toolchain } : {}), ...(req.remoteCache ? { remoteCache: req.remoteCache } : {}),
          out: join(out, data.recipe, data.toolchain ? `${data.arch}@${data.toolchain}` : data.arch), memoryBudgetBytes: req.memoryBudgetBytes, verbose: req.verbose,
        },
        (m) => {
          if (m.type === 'stage') {
            const s = progress.stages.find((x) => x.name === m.stage);
            if (s) s.status = m.status;
            else progress.stages.push({ name: m.stage, status: m.status });
          } else if (m.type === 'progress') progress.current = { stage: m.stage, done: m.done, total: m.total, ...(m.label ? { label: m.label } : {}) };
          push();
        },
        children,
      );
      await pending;
      log(`${job.id}: ${summary.ok ? 'ok' : `FAILED (${summary.error ?? summary.status})`} in ${summary.seconds.toFixed(1)} s`);
      return BuildSummarySchema.parse({ ...summary, queue: { worker: name, attempts: job.attemptsStarted, stalled: job.stalledCounter } });
    } finally {
      reserved -= data.memoryBytes;
    }
  };

  const worker = new Worker(QUEUE_NAME, processor, {
    connection, concurrency, name, lockDuration: lockMs, stalledInterval: stalledMs, maxStalledCount: maxStalled,
    // Results stay a week for --status and for a nightly that reattaches (--run); then they go.
    removeOnComplete: { age: 7 * 24 * 3600 }, removeOnFail: { age: 7 * 24 * 3600 },
  });
  worker.on('error', (e) => log(`queue error: ${e.message}`));
  worker.on('failed', (job, e) => log(`${job?.id}: job failed: ${e.message}`));
  await worker.waitUntilReady();
  log(`${name} taking jobs from ${redactUrl(req.queue)} (memory budget ${gb(req.memoryBudgetBytes)}, concurrency ${concurrency})`);

  // Ctrl-C / SIGTERM: leave as a crash would, on purpose. The running builds' processes go with this
  // one (their IPC channel closes); their jobs are not failed: the locks lapse and the stalled check
  // hands them to another worker, which resumes them from the stage cache.
  await new Promise<never>(() => {
    const stop = (signal: NodeJS.Signals) => {
      log(`${signal}: stopping; ${children.size ? 'the running jobs go back to the queue once their locks lapse' : 'no job was running'}`);
      process.exit(signal === 'SIGINT' ? 130 : 143);
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
}
