// Digests forge has already computed, by file identity (device and inode), so bytes it has hashed
// once are not hashed again under another name. A local checkpoint's digest records each of its
// files here; the export stage hard-links the checkpoint's weights into its output (the same inode),
// and the cache's commit then takes their sha256 from here instead of reading gigabytes again.
// An entry holds while the file's stat is exactly as recorded, ctime and link count included (any
// write moves ctime, whatever is done to mtime). Making a hard link moves them too: the linker
// carries the entry across its own link (digestAcrossLink) when the file was unchanged up to it.
// A link made by anything else ends the entry: the file is read again, never trusted wrongly.
// `forge clean` drops the index with the cache.
import { mkdirSync, readFileSync, renameSync, statSync, writeFileSync, type BigIntStats } from 'node:fs';
import { join } from 'node:path';
import { cacheRoot } from '../paths.js';

export interface StatKey { size: string; mtimeNs: string; ctimeNs: string; ino: string; dev: string; nlink?: string }

export const statKey = (s: BigIntStats): StatKey => ({ size: String(s.size), mtimeNs: String(s.mtimeNs), ctimeNs: String(s.ctimeNs), ino: String(s.ino), dev: String(s.dev), nlink: String(s.nlink) });

/** Same bytes as when `a` was taken: all stat fields equal, or only ctime moved together with the link count (a hard link made or removed). */
export const sameStat = (a: StatKey, b: StatKey) =>
  a.size === b.size && a.mtimeNs === b.mtimeNs && a.ino === b.ino && a.dev === b.dev &&
  (a.ctimeNs === b.ctimeNs || (a.nlink !== undefined && b.nlink !== undefined && a.nlink !== b.nlink));

const indexFile = (k: Pick<StatKey, 'dev' | 'ino'>) => join(cacheRoot(), '.stat-cache', 'by-inode', `${k.dev}-${k.ino}.json`);

/** Records `sha256` as the content of the file whose stat was `k` when it was hashed. Only a speed-up: a failed write is ignored. */
export function rememberDigest(k: StatKey, sha256: string): void {
  try {
    const file = indexFile(k);
    mkdirSync(join(file, '..'), { recursive: true });
    const tmp = `${file}.${process.pid}.tmp`;
    writeFileSync(tmp, JSON.stringify({ ...k, sha256 }));
    renameSync(tmp, file);
  } catch {
    // read-only or full: the file is hashed again next time
  }
}

/** The entry recorded for exactly the stat `k` (every field, ctime and link count included), or undefined. */
function entryFor(k: StatKey): string | undefined {
  try {
    const e = JSON.parse(readFileSync(indexFile(k), 'utf8')) as StatKey & { sha256?: unknown };
    const exact = sameStat(e, k) && e.ctimeNs === k.ctimeNs && e.nlink === k.nlink;
    return typeof e.sha256 === 'string' && /^[0-9a-f]{64}$/.test(e.sha256) && exact ? e.sha256 : undefined;
  } catch {
    return undefined; // none recorded, or unreadable: hash it
  }
}

/** The sha256 recorded for the file at `path` when it is still the same file with the same bytes; undefined otherwise. */
export function knownDigest(path: string): string | undefined {
  try {
    return entryFor(statKey(statSync(path, { bigint: true })));
  } catch {
    return undefined; // gone
  }
}

/**
 * After this process hard-linked a file whose stat was `before` (taken just before the link) as
 * `linked`: a digest recorded for exactly `before` now holds for the file's new stat.
 */
export function digestAcrossLink(before: StatKey, linked: string): void {
  const sha256 = entryFor(before);
  if (!sha256) return; // none recorded: the commit reads the file
  try {
    rememberDigest(statKey(statSync(linked, { bigint: true })), sha256);
  } catch {
    // the link is gone again: nothing to vouch for
  }
}
