// A local checkpoint stays where it is (never copied into the cache), so its content has to enter
// the fetch key another way: the sha256 of every file. Hashing 8 GB on every build would cost tens
// of seconds, so a stat cache remembers each file's digest with its size, mtime, ctime and inode;
// while all four are unchanged the digest is reused. mtime alone can be set back (`touch -r`), ctime
// cannot: any write or metadata change moves it to "now". One metadata change is forge's own: the
// fp32 reference export and the gates' scratch copies hard-link the checkpoint's files (weights read
// in place), which moves ctime too. A ctime that moved while the link count changed, with size,
// mtime, inode and device as they were, is taken as that and not as an edit. The price: an edit
// that also restores the mtime (`touch -r`) AND happens together with a link made or removed
// elsewhere is missed until the next change; `forge clean` drops the stat cache.
// One read, two uses: a .safetensors file's bytes also go through fetch's NaN/Inf scan as they are
// hashed, and the result is kept beside the digest, so fetch need not read the weights again. Each
// digest is also kept by inode (engine/known-digests.ts): the export's hard links to the weights are
// committed to the cache without a third read.
import { createHash } from 'node:crypto';
import { z } from 'zod';
import { open } from 'node:fs/promises';
import { mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { rememberDigest, sameStat, statKey, type StatKey } from '../engine/known-digests.js';
import { join, resolve } from 'node:path';
import { cacheRoot } from '../paths.js';
import { sha256OfFile } from '../engine/hash.js';
import { fileChunks, FiniteScanner, type NonFinite } from '../io/finite.js';
import { isDType } from '../io/dtype.js';
import { openSafetensors, readFully, type SafetensorsFile } from '../io/safetensors.js';
import { checkLocalSource } from '../recipe/load.js';
import { listFilesBelow } from '../io/files.js';
import type { Recipe } from '../recipe/schema.js';

/** Relative path → sha256 of every file under a local checkpoint directory. */
export type LocalDigest = Record<string, string>;

/** A .safetensors file's NaN/Inf scan as the digest read it: every floating tensor finite, or the first bad element. */
export type FiniteRecord = 'ok' | NonFinite;

/**
 * `finite` is there for every .safetensors file: its scan, or 'unparsed' when its header did not
 * parse (nothing scanned; fetch's own checks name the problem). Absent: an entry from before the scan.
 */
interface StatEntry extends StatKey { sha256: string; finite?: FiniteRecord | 'unparsed' }

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
  /** After each file it hashes: bytes hashed so far of the bytes it has to hash (the files new or changed). */
  progress?: (doneBytes: number, totalBytes: number, file: string) => void;
  /** Filled with what it did: files hashed and reused, bytes read, seconds (the run record's `checkpointDigest`). */
  stats?: DigestStats;
  /** How recent a change must be for its digest not to be cached (tests set 0). @default 2000 */
  racyMs?: number;
}

/** What one digest did: the porter's wait before any stage, kept in the run record. */
export interface DigestStats { dir: string; files: number; hashedFiles: number; hashedBytes: number; seconds: number }

/** The content digest of a local checkpoint directory, re-hashing only files whose stat changed. */
export async function localCheckpointDigest(dir: string, opts: DigestOptions = {}): Promise<LocalDigest> {
  const t0 = performance.now();
  const cacheFile = statCacheFile(dir);
  const cached = readStatCache(cacheFile, dir);
  const next: Record<string, StatEntry> = {};
  const digest: LocalDigest = {};
  const racyNs = opts.racyMs === undefined ? RACY_NS : BigInt(opts.racyMs) * 1_000_000n;
  let scanner: FiniteScanner | undefined;
  const files = listFilesBelow(dir).map((rel) => ({ rel, before: statKey(statSync(join(dir, rel), { bigint: true })) }));
  // An entry from before the fused scan (no `finite`) is read again once, to record the scan too.
  const reusable = (rel: string, before: StatKey) => {
    const known = cached[rel];
    return known !== undefined && sameStat(known, before) && (known.finite !== undefined || !isSafetensors(rel));
  };
  const toHash = files.filter((f) => !reusable(f.rel, f.before));
  const totalBytes = toHash.reduce((a, f) => a + Number(f.before.size), 0);
  let doneBytes = 0;
  if (toHash.length) opts.log?.(`hashing the local checkpoint ${dir}: ${toHash.length} of ${files.length} files new or changed since the last build (${(totalBytes / 1e9).toFixed(2)} GB)`);
  for (const { rel, before } of files) {
    const abs = join(dir, rel);
    const known = cached[rel];
    if (reusable(rel, before)) {
      digest[rel] = known.sha256;
      // Re-keyed to the stat seen now, so a later link change is measured from here.
      next[rel] = { ...known, ...before };
      continue;
    }
    const { sha256, finite } = isSafetensors(rel) ? await hashAndScan(abs, (scanner ??= new FiniteScanner())) : { sha256: await sha256OfFile(abs), finite: undefined };
    // The racy rule below holds for the scan too: it covers exactly the bytes the digest covers.
    const afterStats = statSync(abs, { bigint: true });
    const after = statKey(afterStats);
    if (!sameStat(before, after)) throw new Error(`${abs} changed while it was being hashed; run again once it is written`);
    digest[rel] = sha256;
    const nowNs = BigInt(Date.now()) * 1_000_000n;
    if (nowNs - afterStats.ctimeNs >= racyNs) next[rel] = { ...after, sha256, ...(finite ? { finite } : {}) };
    doneBytes += Number(before.size);
    opts.progress?.(doneBytes, totalBytes, rel);
  }
  writeStatCache(cacheFile, dir, next);
  // By inode too: the export's hard links to these files are then committed without reading them again.
  for (const e of Object.values(next)) rememberDigest(e, e.sha256);
  if (opts.stats) Object.assign(opts.stats, { dir, files: files.length, hashedFiles: toHash.length, hashedBytes: totalBytes, seconds: (performance.now() - t0) / 1000 });
  return digest;
}

const isSafetensors = (rel: string) => rel.endsWith('.safetensors');

/**
 * sha256 of a .safetensors file and its NaN/Inf scan, from one read: header, then every tensor in
 * file order (they tile the rest, so every byte is hashed once, in order). A file whose header does
 * not parse is only hashed; fetch's checks name its problem.
 */
async function hashAndScan(path: string, scanner: FiniteScanner): Promise<{ sha256: string; finite: FiniteRecord | 'unparsed' }> {
  let layout: SafetensorsFile;
  try {
    layout = await openSafetensors(path);
  } catch {
    return { sha256: await sha256OfFile(path), finite: 'unparsed' };
  }
  await layout.close();
  const chunks = fileChunks(layout, { withHeader: true, floatOnly: false });
  const hash = createHash('sha256');
  let finite: FiniteRecord = 'ok';
  const fh = await open(path, 'r');
  try {
    await scanner.readChunks(chunks, (c, target) => readFully(fh, target, c.position, path), (c, data) => {
      hash.update(data);
      if (finite === 'ok') finite = scanner.test(c, data) ?? 'ok';
    });
  } finally {
    await fh.close();
  }
  return { sha256: hash.digest('hex'), finite };
}

/** A recorded result as it must read back; a damaged stat cache fails this and the file is scanned. */
const finiteRecordSchema = z.union([z.literal('ok'), z.object({
  tensor: z.string(), dtype: z.string().refine(isDType), index: z.number().int().nonnegative(),
  count: z.number().int().positive(), value: z.enum(['NaN', '+Inf', '-Inf']),
})]);

/**
 * The NaN/Inf scan results the digest recorded for files under `dir`, keyed by relative path: only
 * those whose size, mtime, ctime, inode and device still match the entry (so the result covers the
 * bytes there now).
 */
export function recordedFinite(dir: string): Map<string, FiniteRecord> {
  const out = new Map<string, FiniteRecord>();
  for (const [rel, entry] of Object.entries(readStatCache(statCacheFile(dir), dir))) {
    const finite = finiteRecordSchema.safeParse(entry.finite);
    if (!finite.success) continue; // absent, 'unparsed', or a damaged cache: fetch scans that file
    try {
      if (sameStat(entry, statKey(statSync(join(dir, rel), { bigint: true })))) out.set(rel, finite.data as FiniteRecord);
    } catch {
      // gone since: nothing recorded for it
    }
  }
  return out;
}

/** For a recipe with a local source: its path checked (errors name `file` and source.path), then digested. */
export async function localSourceDigest(recipe: Recipe, file: string, opts: Pick<DigestOptions, 'log' | 'progress' | 'stats'> = {}): Promise<LocalDigest | undefined> {
  if (recipe.source.kind !== 'local') return undefined;
  checkLocalSource(recipe, file);
  return localCheckpointDigest(recipe.source.path, opts);
}
