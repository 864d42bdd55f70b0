// The content-addressed stage cache: <root>/<stage id>/<key>/ with meta.json inside.
// An entry appears only by rename of a complete temporary directory, so a reader never sees half an
// entry; a per-entry lock lets concurrent builds share one cache without computing twice.
import { existsSync } from 'node:fs';
import { mkdir, readFile, readdir, rename, rm, writeFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { randomBytes } from 'node:crypto';
import { tryStageLock, withStageLock, type LockWaitOptions } from './lock.js';
import { hashTree, type FileDigest } from './hash.js';
import { knownDigest } from './known-digests.js';
import type { Json, MemoryPrediction } from './stage.js';

export const META = 'meta.json';

export interface EntryMeta {
  stage: string;
  module: string;
  version: string;
  key: string;
  contentHash: string;
  files: Record<string, FileDigest>;
  seconds: number;
  peakRssBytes: number;
  /** Peak private (RssAnon) and mapped (RssFile) bytes of the stage's process tree (null off Linux; absent in entries made before they were measured). */
  peakPrivateBytes?: number | null;
  peakMappedBytes?: number | null;
  /** What the stage was predicted to need when it ran, and whether it went over by more than 25%. */
  predicted?: MemoryPrediction;
  overPrediction?: string;
  /** Bytes its processes read from storage, and why that was too much when it was (predict.ts checkEvicted). */
  diskReadBytes?: number;
  evicted?: string;
  outcome: { summary?: Json; gate?: { name: string; ok: boolean } };
}

export class StageCache {
  constructor(readonly root: string) {}

  entryDir(stage: string, key: string): string {
    return join(this.root, stage, key);
  }

  async lookup(stage: string, key: string): Promise<EntryMeta | null> {
    const file = join(this.entryDir(stage, key), META);
    if (!existsSync(file)) return null;
    try {
      return JSON.parse(await readFile(file, 'utf8')) as EntryMeta;
    } catch {
      return null; // meta.json is written before the rename, so this is only outside tampering
    }
  }

  // proper-lockfile keeps one in-process record per locked path: each key is its own path (which
  // need not exist), so two keys of one stage locked by one process do not overwrite each other.
  /**
   * Holds the entry's lock while fn runs (lock.ts: a waiting build says whose lock it waits for).
   * Locks go stale when their holder stops refreshing them (a killed build), so a rerun takes over
   * instead of waiting forever.
   */
  withLock<T>(stage: string, key: string, fn: () => Promise<T>, opts: LockWaitOptions = {}): Promise<T> {
    return withStageLock(this.root, stage, key, fn, opts);
  }

  /** A fresh temporary directory for a stage run; leftovers of killed runs for this key are removed first. */
  async makeTemp(stage: string, key: string): Promise<string> {
    const tmpRoot = join(this.root, stage, '.tmp');
    await mkdir(tmpRoot, { recursive: true });
    // Only called while holding the entry's lock, so any other temp dir for this key is abandoned.
    for (const name of await readdir(tmpRoot)) {
      if (name.startsWith(`${key}.`)) await rm(join(tmpRoot, name), { recursive: true, force: true });
    }
    const dir = join(tmpRoot, `${key}.${process.pid}.${randomBytes(4).toString('hex')}`);
    await mkdir(dir);
    return dir;
  }

  /**
   * Removes a failed run's temp dir, first moving the logs in it (a compile log the error names)
   * to `keepLogsIn`, so no half entry stays behind and the error still points at a file that exists.
   * Returns the old → new path of each log moved.
   */
  async discardTemp(tmp: string, keepLogsIn: string): Promise<Map<string, string>> {
    const moved = new Map<string, string>();
    const walk = async (dir: string): Promise<void> => {
      for (const e of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
        const p = join(dir, e.name);
        if (e.isDirectory()) await walk(p);
        else if (e.name.endsWith('.log')) {
          const to = join(keepLogsIn, relative(tmp, p).replaceAll('/', '__'));
          await mkdir(keepLogsIn, { recursive: true });
          // A rename within one filesystem needs no free space, so this works on a full disk too.
          if (await rename(p, to).then(() => true, () => false)) moved.set(p, to);
        }
      }
    };
    await walk(tmp);
    await rm(tmp, { recursive: true, force: true });
    return moved;
  }

  /**
   * Removes temp dirs a killed build left behind (it had no chance to): those of every key whose
   * lock nobody holds. A live build holds its key's lock for as long as its temp dir exists, so its
   * dirs are left alone; a killed holder's lock goes stale and is taken over here.
   */
  async sweepStaleTemps(): Promise<number> {
    let removed = 0;
    for (const stage of await readdir(this.root).catch(() => [] as string[])) {
      const tmpRoot = join(this.root, stage, '.tmp');
      const names = await readdir(tmpRoot).catch(() => [] as string[]);
      const keys = new Set(names.map((n) => n.split('.')[0]));
      for (const key of keys) {
        const release = await tryStageLock(this.root, stage, key);
        if (!release) continue; // a live build is using it
        try {
          for (const n of names) {
            if (n.split('.')[0] !== key) continue;
            await rm(join(tmpRoot, n), { recursive: true, force: true });
            removed += 1;
          }
        } finally {
          await release().catch(() => undefined);
        }
      }
    }
    return removed;
  }

  /**
   * Hashes the finished temp dir (a file forge already hashed as itself, such as a hard link to a
   * local checkpoint's weights, by its recorded digest), writes meta.json into it and renames it into place.
   */
  async commit(tmp: string, meta: Omit<EntryMeta, 'contentHash' | 'files'>): Promise<EntryMeta> {
    const { contentHash, files } = await hashTree(tmp, new Set([META]), knownDigest);
    return this.adopt(tmp, { ...meta, contentHash, files });
  }

  /**
   * Writes meta.json into a complete temp dir whose digests the caller has already established
   * (commit hashed it; the remote cache verified a download against them) and renames it into place.
   */
  async adopt(tmp: string, full: EntryMeta): Promise<EntryMeta> {
    await writeFile(join(tmp, META), JSON.stringify(full, null, 2));
    const final = this.entryDir(full.stage, full.key);
    if (existsSync(final)) {
      // Forced rerun: move the old entry aside first; rename over a non-empty dir is not allowed.
      const trash = `${tmp}.old`;
      await rename(final, trash);
      await rename(tmp, final);
      await rm(trash, { recursive: true, force: true });
    } else {
      await rename(tmp, final);
    }
    return full;
  }

  async clear(): Promise<void> {
    await rm(this.root, { recursive: true, force: true });
  }
}
