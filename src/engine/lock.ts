// A stage entry's lock, taken out loud: a build that finds another build holding it says whose it is
// (pid and host, from the holder's owner file), on which stage, and keeps saying so while it waits,
// instead of sitting silent for as long as the other build's stage takes (issue 36: a second build
// on a shared cache waited 40 minutes and printed nothing).
//
// The lock is proper-lockfile's <key>.lock directory, refreshed by its holder, stale after
// WAITING_LOCK.stale when the holder died (StageCache.withLock takes it through here). Who
// holds it is a small JSON file beside it, <key>.lock.owner: not inside the lock directory, whose
// removal by rmdir (on release, and on taking over a stale lock) needs it empty.
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';
import lockfile from 'proper-lockfile';

/** A lock its holder has not refreshed for this long belongs to a killed build. */
const LOCK_STALE_MS = 10_000;
/** A lock that waits for its holder (refreshed every 2 s, stale after LOCK_STALE_MS when the holder died). */
export const WAITING_LOCK = {
  stale: LOCK_STALE_MS,
  update: 2_000,
  retries: { retries: 100_000, minTimeout: 200, maxTimeout: 2_000, factor: 1.5 },
} as const;

/** How often a waiting build repeats that it is still waiting (a CI log gets a line this often). */
export const LOCK_NOTICE_MS = 30_000;

export interface LockOwner {
  pid: number;
  host: string;
  /** ISO time the holder took the lock. */
  since: string;
  stage: string;
}

export interface LockWaitOptions {
  /** Told once when the lock is found held, then every `noticeMs` while it still is. */
  onWait?: (message: string) => void;
  /** @default LOCK_NOTICE_MS */
  noticeMs?: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The owner file of a stage entry's lock, in the cache at `root`. */
export function ownerFile(root: string, stage: string, key: string): string {
  return join(root, stage, `${key}.lock.owner`);
}

/** The entry's lock if nobody holds it (or its holder died: a stale lock is taken over), else null. */
export async function tryStageLock(root: string, stage: string, key: string): Promise<(() => Promise<void>) | null> {
  return lockfile.lock(join(root, stage, key), { realpath: false, lockfilePath: join(root, stage, `${key}.lock`), stale: LOCK_STALE_MS, retries: 0 }).catch(() => null);
}

/**
 * Holds the entry's lock in the cache at `root` while fn runs, recording this process as its owner;
 * while another build holds it, says so through opts.onWait.
 */
export async function withStageLock<T>(root: string, stage: string, key: string, fn: () => Promise<T>, opts: LockWaitOptions = {}): Promise<T> {
  const dir = join(root, stage);
  await mkdir(dir, { recursive: true });
  const owner = ownerFile(root, stage, key);
  const release = await acquire(join(dir, key), join(dir, `${key}.lock`), owner, stage, opts);
  const me: LockOwner = { pid: process.pid, host: hostname(), since: new Date().toISOString(), stage };
  // Who holds it is for the messages only: a file that cannot be written costs a name, not the build.
  await writeFile(owner, JSON.stringify(me)).catch(() => undefined);
  try {
    return await fn();
  } finally {
    await rm(owner, { force: true }).catch(() => undefined);
    await release().catch(() => undefined);
  }
}

/** Tries the lock, then again with backoff (WAITING_LOCK's schedule), saying who holds it as it waits. */
async function acquire(file: string, lockfilePath: string, owner: string, stage: string, opts: LockWaitOptions): Promise<() => Promise<void>> {
  const { stale, update, retries } = WAITING_LOCK;
  const noticeMs = opts.noticeMs ?? LOCK_NOTICE_MS;
  const t0 = Date.now();
  let nextNotice = 0;
  let notices = 0;
  let delay: number = retries.minTimeout;
  for (let attempt = 0; ; attempt++) {
    try {
      // A stale lock (its holder died) is taken over here, as the waiting lock does.
      return await lockfile.lock(file, { realpath: false, lockfilePath, stale, update, retries: 0 });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ELOCKED' || attempt >= retries.retries) throw e;
    }
    const now = Date.now();
    if (opts.onWait && now >= nextNotice) {
      opts.onWait(waitingMessage(await readOwner(owner), stage, notices++ === 0 ? null : now - t0, lockfilePath));
      nextNotice = now + noticeMs;
    }
    await sleep(delay);
    delay = Math.min(retries.maxTimeout, delay * retries.factor);
  }
}

async function readOwner(file: string): Promise<LockOwner | null> {
  try {
    const o = JSON.parse(await readFile(file, 'utf8')) as Partial<LockOwner>;
    return typeof o.pid === 'number' && typeof o.host === 'string' ? (o as LockOwner) : null;
  } catch {
    return null; // not written yet, or just removed: the holder is between taking and recording it
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

const duration = (ms: number) => {
  const s = Math.round(ms / 1000);
  return s < 60 ? `${s} s` : s < 3600 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
};

/**
 * The line a waiting build prints: whose lock, on which stage, since when, and what ends the wait.
 * waitedMs: null for the first line, then how long this build has waited.
 */
export function waitingMessage(o: LockOwner | null, stage: string, waitedMs: number | null, lockfilePath: string): string {
  const who = o ? `build pid ${o.pid} on ${o.host} (holding it since ${o.since})` : 'another build (it has not recorded its pid)';
  const gone = o && o.host === hostname() && o.pid !== process.pid && !alive(o.pid)
    ? `; that process is gone, so its lock is taken over once it is ${WAITING_LOCK.stale / 1000} s stale`
    : '';
  if (waitedMs !== null) return `still waiting (${duration(waitedMs)}) for ${who}, which holds the ${stage} stage's lock${gone}`;
  return `waiting for ${who}, which holds the ${stage} stage's lock (${lockfilePath}): this build goes on when that one is done with the stage, using its result when it made one${gone}`;
}
