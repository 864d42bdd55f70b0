// The nightly's job queue (BullMQ on Redis): what a build job carries, how jobs are named, which
// worker may take one, and the Redis connection — shared by `forge nightly --queue`, `forge worker`
// and `forge nightly --status`. The scheduling itself (locks, stalled-job detection, retries,
// progress) is BullMQ's; this module only fixes the conventions all three sides agree on.
import { readFileSync } from 'node:fs';
import { Redis } from 'ioredis';
import { z } from 'zod';
import { RecipeError } from '../recipe/load.js';
import { fieldPath } from './matrix.js';
import { formatBytes as gb } from '../units.js';

/** One BullMQ queue for every build job; jobs of different nightlies are told apart by runId. */
export const QUEUE_NAME = 'forge-builds';

/** What a job carries: one matrix build, and the peak memory it declares. Versioned: old workers refuse new jobs. */
export const BuildJobSchema = z.object({
  format: z.literal('forge-build-job/1'),
  /** The nightly this build belongs to (its startedAt, or --run). */
  runId: z.string().min(1),
  /** Place in the matrix, so a nightly collects results in matrix order. */
  index: z.number().int().min(0),
  recipe: z.string().min(1),
  arch: z.string().min(1),
  /** The matrix entry's pinned toolchain (toolchains/<name>.txt), when it has one. */
  toolchain: z.string().min(1).optional(),
  /** Peak memory the build is declared to need (the matrix entry's memoryGB); 0 when not declared. */
  memoryBytes: z.number().min(0),
}).strict();
export type BuildJob = z.infer<typeof BuildJobSchema>;

/** A job payload from Redis, validated: one line naming the job and the field, never a half-run build. */
export function parseBuildJob(raw: unknown, jobId: string): BuildJob {
  const parsed = BuildJobSchema.safeParse(raw);
  if (!parsed.success) throw new RecipeError(`invalid build job ${jobId}: ${parsed.error.issues.map((i) => `${fieldPath(i.path)}: ${i.message}`).join('; ')}`);
  return parsed.data;
}

/**
 * `<runId>/<recipe>/<arch>[/<toolchain>]`: BullMQ ignores an add whose jobId already exists, so a nightly rerun
 * with the same --run attaches to its jobs instead of enqueuing the builds twice. (BullMQ refuses
 * ':' in custom ids: it is its own key separator; run ids are timestamps with ':' replaced.)
 */
export const jobIdOf = (runId: string, recipe: string, arch: string, toolchain?: string) => `${runId}/${recipe}/${arch}${toolchain ? `/${toolchain}` : ''}`;

/** A default run id from the nightly's start time, usable as a job id part. */
export const runIdOf = (startedAt: string) => startedAt.replace(/:/g, '-');

/**
 * Whether a worker may start this job now. A job declaring more than the worker's whole budget is
 * never run there; one that fits the budget but not what the worker's running builds leave free
 * waits. Either way the worker hands it back (see worker.ts), so it stays for a bigger or idler worker.
 */
export function admission(job: Pick<BuildJob, 'memoryBytes' | 'recipe' | 'arch'>, budgetBytes: number, reservedBytes: number): string | null {
  if (job.memoryBytes > budgetBytes) return `${job.recipe}/${job.arch} declares ${gb(job.memoryBytes)}, over this worker's memory budget of ${gb(budgetBytes)}`;
  if (job.memoryBytes > budgetBytes - reservedBytes) return `${job.recipe}/${job.arch} declares ${gb(job.memoryBytes)}; this worker's running builds leave ${gb(budgetBytes - reservedBytes)} of its ${gb(budgetBytes)}`;
  return null;
}

/** What a job reports through job.updateProgress while its build runs. */
export interface JobProgress {
  /** Worker name (host:pid) running it; absent while no worker has run it. */
  worker?: string;
  /** Stages started, with their status once ended (cached, ran, failed, …). */
  stages: Array<{ name: string; status: string }>;
  /** The stage that last reported progress, and how far it is. */
  current?: { stage: string; done: number; total: number; label?: string };
  /** Workers that handed the job back without running it, each with why (admission's words). */
  handedBack?: Record<string, string>;
  /** Failures of the machines', not the build's, each of which handed the job back (oldest first). */
  infra?: Array<{ worker: string; reason: string }>;
}

export const isJobProgress = (p: unknown): p is JobProgress => typeof p === 'object' && p !== null && Array.isArray((p as JobProgress).stages);

/**
 * The names (host:pid) of the workers connected to the queue now. BullMQ names each worker's Redis
 * connections `<prefix>:<queue>:w:<worker name>` (CLIENT SETNAME); a worker holds several.
 */
export async function connectedWorkers(queue: { getWorkers(): Promise<Array<Record<string, string>>> }): Promise<string[]> {
  const names = (await queue.getWorkers()).map((c) => {
    const raw = c.rawname ?? '';
    const at = raw.indexOf(':w:');
    return at < 0 ? '' : raw.slice(at + 3);
  }).filter((n) => n);
  return [...new Set(names)].sort();
}

/**
 * A job every connected worker has handed back: what to tell the person waiting on the nightly, or
 * null while some connected worker has not yet refused it (or none is connected: said separately).
 */
export function unholdable(progress: unknown, connected: string[]): string | null {
  const back = isJobProgress(progress) ? progress.handedBack ?? {} : {};
  if (!connected.length || !connected.every((w) => back[w])) return null;
  return `no connected worker can hold it: ${connected.map((w) => `${w} (${back[w]})`).join('; ')}; it waits for a worker with a larger --memory-budget`;
}

/**
 * Lock and stalled-check timings. BullMQ renews a running job's lock every lockMs/2 for as long as
 * the worker process lives (its event loop stays free: the build runs in a child process), so an
 * hour-long compile is never taken for stalled; only a dead worker's lock expires, and the next
 * stalled check (every stalledMs, by any worker) puts its job back for another worker. The defaults
 * are BullMQ's (30 s); FORGE_QUEUE_LOCK_MS / FORGE_QUEUE_STALLED_MS shorten them (tests).
 */
export function queueTimings(env = process.env): { lockMs: number; stalledMs: number; maxStalled: number } {
  const ms = (name: string, dflt: number) => envMs(name, dflt, env);
  // A job whose worker died twice goes back twice; a third death fails it (a build that kills its
  // machine each time should show up as failed, not loop through the farm).
  return { lockMs: ms('FORGE_QUEUE_LOCK_MS', 30_000), stalledMs: ms('FORGE_QUEUE_STALLED_MS', 30_000), maxStalled: 2 };
}

/** A millisecond setting from the environment (tests shorten the queue's waits), else `dflt`; anything but a whole number ≥ 100 is refused naming it. */
export function envMs(name: string, dflt: number, env = process.env): number {
  const v = env[name];
  if (v === undefined || v === '') return dflt;
  if (!/^\d+$/.test(v) || Number(v) < 100) throw new Error(`${name} wants a whole number of milliseconds of at least 100, got '${v}'`);
  return Number(v);
}

/** The URL as it may be printed: a password (or a lone user token) replaced by '***'. */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    else if (u.username) u.username = '***';
    return u.toString();
  } catch {
    return '(an unparsable --queue URL)';
  }
}

/** The URL with no user or password at all: what a message may tell a person to type. */
export function bareUrl(url: string): string {
  try {
    const u = new URL(url);
    u.username = '';
    u.password = '';
    return u.toString();
  } catch {
    return redactUrl(url);
  }
}

/** Checks a --queue URL's form: redis:// or rediss://, with a host. */
export function checkQueueUrl(url: string): URL {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new Error(`--queue wants a redis://host:port URL, got ${redactUrl(url)}`);
  }
  if (u.protocol !== 'redis:' && u.protocol !== 'rediss:') throw new Error(`--queue wants a redis:// or rediss:// URL, got ${redactUrl(url)}`);
  if (!u.hostname) throw new Error(`--queue wants a host in its URL, got ${redactUrl(url)}`);
  return u;
}

/** Where a worker or nightly reads the Redis password from instead of argv (`ps` shows argv to every user). */
export const REDIS_PASSWORD_ENV = 'FORGE_REDIS_PASSWORD';

/**
 * The --queue URL with its password filled in from --redis-password-file, else FORGE_REDIS_PASSWORD,
 * else as given (a password in the URL itself still works, with a warning from the CLI). The
 * result holds the secret: only ever printed through redactUrl.
 */
export function queueUrl(url: string, o: { passwordFile?: string; env?: NodeJS.ProcessEnv } = {}): string {
  const u = checkQueueUrl(url);
  let password = (o.env ?? process.env)[REDIS_PASSWORD_ENV] || undefined;
  if (o.passwordFile) {
    try {
      // One line, as `echo pw > file` writes it: the trailing newline is not part of the password.
      password = readFileSync(o.passwordFile, 'utf8').replace(/\r?\n$/, '');
    } catch (e) {
      throw new Error(`--redis-password-file ${o.passwordFile} cannot be read: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
    }
    if (!password) throw new Error(`--redis-password-file ${o.passwordFile} is empty`);
  }
  if (!password) return url;
  u.password = password; // percent-encoded by URL; ioredis decodes it
  return u.toString();
}

/** Whether a URL given on the command line carries a password (then the CLI says to move it out of argv). */
export const urlHasPassword = (url: string): boolean => {
  try {
    return Boolean(new URL(url).password);
  } catch {
    return false;
  }
};

/** A message with the URL and its password (raw or percent-encoded) taken out. */
function scrub(text: string, url: string): string {
  let out = text.replaceAll(url, redactUrl(url));
  try {
    const pw = new URL(url).password;
    if (pw) for (const form of new Set([pw, decodeURIComponent(pw)])) out = out.replaceAll(form, '***');
  } catch { /* an unparsable URL was refused before */ }
  return out;
}

/**
 * Why Redis refused this connection, in a person's words: a wrong or missing password reads as
 * such (ioredis only reports "Connection is closed" once the server has dropped it), distinct
 * from a server that cannot be reached.
 */
export function redisRefusal(url: string, errors: string[], final: string): string {
  const where = redactUrl(url);
  const said = errors.find((m) => /^(WRONGPASS|NOAUTH)\b|invalid password/i.test(m));
  if (said && /^NOAUTH\b/.test(said)) return `Redis at ${where} wants a password and was given none: set ${REDIS_PASSWORD_ENV} or give --redis-password-file`;
  if (said) return `Redis at ${where} refused the password (${said.split(' ')[0]}): check ${REDIS_PASSWORD_ENV} or --redis-password-file`;
  const why = errors.find((m) => m !== final) ?? final;
  return `cannot reach Redis at ${where}: ${scrub(why, url)}`;
}

/**
 * A Redis connection for BullMQ (maxRetriesPerRequest null: a Worker's blocking calls must not
 * give up), opened only after one probe has answered: an unreachable or misspelt URL, or a wrong
 * password, is one error naming it (password left out), not ioredis retrying forever in the background.
 */
export async function connectRedis(url: string): Promise<Redis> {
  checkQueueUrl(url);
  const probe = new Redis(url, { lazyConnect: true, connectTimeout: 5000, maxRetriesPerRequest: 0, retryStrategy: () => null, enableOfflineQueue: false });
  const errors: string[] = [];
  probe.on('error', (e: Error) => errors.push(e.message)); // read below: the rejection itself is often just "Connection is closed."
  try {
    await probe.connect();
    await probe.ping();
  } catch (e) {
    throw new Error(redisRefusal(url, errors, (e as Error).message));
  } finally {
    probe.disconnect();
  }
  const conn = new Redis(url, { maxRetriesPerRequest: null });
  // After the probe, a dropped connection is retried by ioredis; say so once per error, without the URL's secrets.
  conn.on('error', (e) => process.stderr.write(`[forge] redis ${redactUrl(url)}: ${scrub(e.message, url)}\n`));
  return conn;
}
