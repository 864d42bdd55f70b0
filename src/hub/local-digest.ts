// A local checkpoint stays where it is (never copied into the cache), so its content has to enter
// the fetch key another way: the sha256 of every file. Hashing 8 GB on every build would cost tens
// of seconds, so a stat cache remembers each file's digest with its size, mtime, ctime and inode;
// while all four are unchanged the digest is reused. mtime alone can be set back (`touch -r`), ctime
// cannot: any write or metadata change moves it to "now", so no edit is missed.
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, readdirSync, renameSync, statSync, writeFileSync, type BigIntStats } from 'node:fs';
import { join, relative, resolve, sep } from 'node:path';
import { cacheRoot } from '../paths.js';
import { sha256OfFile } from '../engine/hash.js';
import { checkLocalSource } from '../recipe/load.js';
import type { Recipe } from '../recipe/schema.js';

/** Relative path → sha256 of every file under a local checkpoint directory. */
export type LocalDigest = Record<string, string>;

interface StatEntry { size: string; mtimeNs: string; ctimeNs: string; ino: string; dev: string; sha256: string }

/**
 * A digest computed within this long of the file's last change is not cached: an edit in the same
 * clock tick as the change we saw would leave all four stat fields as they were ("racy" entries).
 */
const RACY_NS = 2_000_000_000n;

export function statCacheFile(dir: string): string {
  const id = createHash('sha256').update(resolve(dir)).digest('hex').slice(0, 32);
  // Beside the stage entries (FORGE_CACHE moves it, `forge clean` drops it); only ever a speed-up.
  return join(cacheRoot(), '.stat-cache', `${id}.json`);
}

const statKey = (s: BigIntStats) => ({ size: String(s.size), mtimeNs: String(s.mtimeNs), ctimeNs: String(s.ctimeNs), ino: String(s.ino), dev: String(s.dev) });
const sameStat = (a: Omit<StatEntry, 'sha256'>, b: Omit<StatEntry, 'sha256'>) =>
  a.size === b.size && a.mtimeNs === b.mtimeNs && a.ctimeNs === b.ctimeNs && a.ino === b.ino && a.dev === b.dev;

function listRegularFiles(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out.push(relative(dir, p).split(sep).join('/'));
    }
  };
  walk(dir);
  return out.sort();
}

function readStatCache(file: string, dir: string): Record<string, StatEntry> {
  try {
    const raw = JSON.parse(readFileSync(file, 'utf8')) as { dir?: string; files?: Record<string, StatEntry> };
    return raw.dir === resolve(dir) && raw.files && typeof raw.files === 'object' ? raw.files : {};
  } catch {
    return {}; // absent or damaged: every file is hashed again, which is always correct
  }
}

/** Written whole beside, then renamed: concurrent builds each leave a complete file (last one wins). */
function writeStatCache(file: string, dir: string, files: Record<string, StatEntry>): void {
  try {
    mkdirSync(join(file, '..'), { recursive: true });
    const tmp = `${file}.${process.pid}.tmp`;
    writeFileSync(tmp, JSON.stringify({ dir: resolve(dir), files }));
    renameSync(tmp, file);
  } catch {
    // Only a speed-up: a cache that cannot be written (read-only or full disk) costs a re-hash next time.
  }
}

export interface DigestOptions {
  log?: (line: string) => void;
  /** How recent a change must be for its digest not to be cached (tests set 0). @default 2000 */
  racyMs?: number;
}

/** The content digest of a local checkpoint directory, re-hashing only files whose stat changed. */
export async function localCheckpointDigest(dir: string, opts: DigestOptions = {}): Promise<LocalDigest> {
  const cacheFile = statCacheFile(dir);
  const cached = readStatCache(cacheFile, dir);
  const next: Record<string, StatEntry> = {};
  const digest: LocalDigest = {};
  const racyNs = opts.racyMs === undefined ? RACY_NS : BigInt(opts.racyMs) * 1_000_000n;
  let announced = false;
  for (const rel of listRegularFiles(dir)) {
    const abs = join(dir, rel);
    const before = statKey(statSync(abs, { bigint: true }));
    const known = cached[rel];
    if (known && sameStat(known, before)) {
      digest[rel] = known.sha256;
      next[rel] = known;
      continue;
    }
    if (!announced) opts.log?.(`hashing the local checkpoint ${dir} (files new or changed since the last build)`);
    announced = true;
    const sha256 = await sha256OfFile(abs);
    const afterStats = statSync(abs, { bigint: true });
    const after = statKey(afterStats);
    if (!sameStat(before, after)) throw new Error(`${abs} changed while it was being hashed; run again once it is written`);
    digest[rel] = sha256;
    const nowNs = BigInt(Date.now()) * 1_000_000n;
    if (nowNs - afterStats.ctimeNs >= racyNs) next[rel] = { ...after, sha256 };
  }
  writeStatCache(cacheFile, dir, next);
  return digest;
}

/** For a recipe with a local source: its path checked (errors name `file` and source.path), then digested. */
export async function localSourceDigest(recipe: Recipe, file: string, log?: (line: string) => void): Promise<LocalDigest | undefined> {
  if (recipe.source.kind !== 'local') return undefined;
  checkLocalSource(recipe, file);
  return localCheckpointDigest(recipe.source.path, { ...(log ? { log } : {}) });
}
