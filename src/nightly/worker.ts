// `forge worker --queue redis://…`: takes build jobs off the nightly's queue, one (or --concurrency)
// at a time, and runs each as `forge build` would, in a child process (build-child.ts), reporting
// stage progress on the job and returning the build's summary as the job's result.
//
// Before it takes any job it checks what a build needs (preflight.ts): its Redis, its shared cache
// (read and write), its memory budget against the machine, free disk. It refuses to start otherwise.
//
// Memory: a job declares its peak (the matrix's memoryGB). A worker that cannot hold it hands it
// back with BullMQ's documented move-to-delayed (job.moveToDelayed + DelayedError): the job is not
// failed and uses no attempt, and after a short delay any worker may take it again — a bigger one
// runs it. One queue per memory class was the alternative, but a worker listening on several
// classes would run one job per class at once and could exceed its budget; handing back keeps one
// queue, one concurrency and an exact budget check. The build itself also gets the worker's budget
// as its --memory-budget, so its scheduler holds each stage to it as well.
//
// Infrastructure: a build that fails for the machine's reasons (build-job.ts: the shared cache
// unusable, a full disk, the build process killed) is handed back the same way, and this worker
// takes nothing more until its checks pass again, so a broken machine cannot eat the queue.
import { fork, type ChildProcess } from 'node:child_process';
import { hostname } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { DelayedError, UnrecoverableError, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import { cacheRoot, repoRoot } from '../paths.js';
import { formatBytes as gb } from '../units.js';
import { REMOTE_CACHE_ENV } from '../engine/remote-cache.js';
import { BuildSummarySchema, failedSummary, type BuildSummary } from './summary.js';
import { admission, connectRedis, envMs, isJobProgress, parseBuildJob, queueTimings, QUEUE_NAME, redactUrl, type JobProgress } from './queue.js';
import type { BuildChildMessage } from './build-child.js';
import { InfraFailure, type BuildChildRequest } from './build-job.js';
import { diskProblem, memoryBudgetProblem, notStarted, remoteCacheProblem } from './preflight.js';

/** Runs one job's build; the default forks build-child.ts (tests give one that builds nothing). */
export type BuildRunner = (req: BuildChildRequest, onMessage: (m: BuildChildMessage) => void, children: Set<ChildProcess>) => Promise<BuildSummary>;

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
  runBuild?: BuildRunner;
}

/** How long a handed-back job waits before any worker may take it again (FORGE_QUEUE_HAND_BACK_MS; tests shorten it). */
const handBackMs = () => envMs('FORGE_QUEUE_HAND_BACK_MS', 5_000);
/** How often a worker stopped by a failed check checks again (FORGE_WORKER_RECHECK_MS). */
const recheckMs = () => envMs('FORGE_WORKER_RECHECK_MS', 30_000);
/**
 * Infrastructure hand-backs a job may take before it is given up as not built (not as failed): a
 * job that kills its build process on every machine must end, not circle the farm.
 */
export const MAX_INFRA_HAND_BACKS = 3;

const childScript = () => join(repoRoot(), 'src', 'nightly', 'build-child.ts');
const tsxLoader = () => pathToFileURL(join(repoRoot(), 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;

/** Runs one build in its own process; resolves with its summary, rejects (InfraFailure) if the process dies without one. */
const runChild: BuildRunner = (req, onMessage, children) => new Promise((resolvePromise, reject) => {
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
    // Killed (the OOM killer, an operator) or crashed outside the build's own error handling.
    else reject(new InfraFailure(`the build process of ${req.recipe}/${req.arch} ended without a result (${signal ? `signal ${signal}` : `exit code ${code}`})`));
  });
  child.send(req);
});

export interface RunningWorker {
  name: string;
  /** Stops taking jobs and closes the connections (the running builds are left to their locks). */
  close(): Promise<void>;
}

/** Checks what builds need; resolves once the worker takes jobs, or rejects with every problem found. */
export async function startWorker(req: WorkerRequest): Promise<RunningWorker> {
  const log = req.log ?? ((l: string) => process.stderr.write(`[worker] ${l}\n`));
  const name = `${hostname()}:${process.pid}`;
  const out = resolve(req.out ?? join('out', 'worker'));
  const cacheUrl = req.remoteCache ?? process.env[REMOTE_CACHE_ENV];
  const { lockMs, stalledMs, maxStalled } = queueTimings();
  const concurrency = req.concurrency ?? 1;
  const runBuild = req.runBuild ?? runChild;
  const children = new Set<ChildProcess>();
  let reserved = 0;

  /** What stops this machine building now (the shared cache, the disk); empty when it can build. */
  const machineProblems = async (): Promise<string[]> => [
    ...(cacheUrl ? [await remoteCacheProblem(cacheUrl, name)] : []),
    diskProblem([out, cacheRoot()]),
  ].filter((p): p is string => p !== null);

  const problems: string[] = [];
  const memory = memoryBudgetProblem(req.memoryBudgetBytes);
  if (memory) problems.push(memory);
  let connection: Redis | undefined;
  try {
    connection = await connectRedis(req.queue);
  } catch (e) {
    problems.push((e as Error).message);
  }
  problems.push(...(await machineProblems()));
  if (problems.length || !connection) {
    connection?.disconnect();
    throw notStarted(problems);
  }

  let worker: Worker | undefined;
  // After an infrastructure failure: no job is taken until the checks pass again.
  let rechecking: NodeJS.Timeout | undefined;
  let closed = false;
  const holdUntilHealthy = () => {
    if (rechecking || closed || !worker) return;
    void worker.pause(true); // not waiting for the running jobs: one of them is the caller
    let said = '';
    const check = async () => {
      const now = await machineProblems();
      if (closed) return;
      if (!now.length) {
        rechecking = undefined;
        log('checks pass again: taking jobs');
        worker!.resume();
        return;
      }
      if (now.join() !== said) log(`taking no jobs until this is fixed (checked again every ${recheckMs() / 1000} s): ${now.join('; ')}`);
      said = now.join();
      rechecking = setTimeout(() => void check(), recheckMs());
    };
    rechecking = setTimeout(() => void check(), 0);
  };

  const processor = async (job: Job, token?: string): Promise<BuildSummary> => {
    let data;
    try {
      data = parseBuildJob(job.data, job.id ?? '?');
    } catch (e) {
      // A payload no worker can run (another forge version's, hand-made): fail it now, no retries.
      throw new UnrecoverableError((e as Error).message);
    }
    const before: JobProgress = isJobProgress(job.progress) ? job.progress : { stages: [] };
    const refused = admission(data, req.memoryBudgetBytes, reserved);
    if (refused) {
      log(`handing back ${job.id}: ${refused}`);
      // Recorded on the job, so --status and the waiting nightly can say why nobody runs it. A lost
      // record must not fail the job (that would use an attempt): the hand-back goes on without it.
      await job.updateProgress({ ...before, handedBack: { ...before.handedBack, [name]: refused } }).catch(() => undefined);
      await job.moveToDelayed(Date.now() + handBackMs(), token);
      throw new DelayedError();
    }
    reserved += data.memoryBytes;
    const progress: JobProgress = { worker: name, stages: [], ...(before.infra ? { infra: before.infra } : {}) };
    // Progress updates go to Redis one at a time, in order; a lost one is not worth failing a build.
    let pending = job.updateProgress({ ...progress }).catch(() => undefined);
    const push = () => { const p = structuredClone(progress); pending = pending.then(() => job.updateProgress(p)).catch(() => undefined); };
    log(`${job.id}: building ${data.recipe}/${data.arch} (attempt ${job.attemptsStarted}${job.stalledCounter ? `, after ${job.stalledCounter} stalled` : ''})`);
    let summary: BuildSummary | undefined;
    let infra: string | undefined;
    try {
      summary = await runBuild(
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
      infra = summary.infra;
    } catch (e) {
      if (!(e instanceof InfraFailure)) throw e;
      infra = e.message;
    } finally {
      reserved -= data.memoryBytes;
    }
    await pending;
    const queueInfo = { worker: name, attempts: job.attemptsStarted, stalled: job.stalledCounter };
    if (infra) {
      const history = [...(before.infra ?? []), { worker: name, reason: infra }];
      await job.updateProgress({ ...progress, current: undefined, infra: history }).catch(() => undefined);
      holdUntilHealthy();
      if (history.length < MAX_INFRA_HAND_BACKS) {
        log(`handing back ${job.id} (a failure of this machine's, not the build's): ${infra}`);
        await job.moveToDelayed(Date.now() + handBackMs(), token);
        throw new DelayedError();
      }
      // Given up, as not built: the nightly shows it, and reports no regression for it.
      const why = `not built after ${history.length} failures of the machines': ${history.map((h) => `${h.worker}: ${h.reason}`).join('; ')}`;
      log(`${job.id}: ${why}`);
      return BuildSummarySchema.parse({ ...(summary ?? failedSummary(data, infra, 0)), infra: why, queue: queueInfo });
    }
    log(`${job.id}: ${summary!.ok ? 'ok' : `FAILED (${summary!.error ?? summary!.status})`} in ${summary!.seconds.toFixed(1)} s`);
    return BuildSummarySchema.parse({ ...summary, queue: queueInfo });
  };

  worker = new Worker(QUEUE_NAME, processor, {
    connection, concurrency, name, lockDuration: lockMs, stalledInterval: stalledMs, maxStalledCount: maxStalled,
    // Results stay a week for --status and for a nightly that reattaches (--run); then they go.
    removeOnComplete: { age: 7 * 24 * 3600 }, removeOnFail: { age: 7 * 24 * 3600 },
  });
  worker.on('error', (e) => log(`queue error: ${e.message}`));
  worker.on('failed', (job, e) => log(`${job?.id}: job failed: ${e.message}`));
  await worker.waitUntilReady();
  log(`${name} taking jobs from ${redactUrl(req.queue)} (memory budget ${gb(req.memoryBudgetBytes)}, concurrency ${concurrency}${cacheUrl ? `, shared cache ${cacheUrl}` : ''})`);
  return {
    name,
    close: async () => {
      closed = true;
      clearTimeout(rechecking);
      await worker!.close(true);
      connection!.disconnect();
    },
  };
}

export async function runWorker(req: WorkerRequest): Promise<void> {
  const log = req.log ?? ((l: string) => process.stderr.write(`[worker] ${l}\n`));
  await startWorker({ ...req, log });
  // Ctrl-C / SIGTERM: leave as a crash would, on purpose. The running builds' processes go with this
  // one (their IPC channel closes); their jobs are not failed: the locks lapse and the stalled check
  // hands them to another worker, which resumes them from the stage cache.
  await new Promise<never>(() => {
    const stop = (signal: NodeJS.Signals) => {
      log(`${signal}: stopping; the running jobs (if any) go back to the queue once their locks lapse`);
      process.exit(signal === 'SIGINT' ? 130 : 143);
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
}
