// Hub downloads into the standard HF cache layout, shared with Python's huggingface_hub:
//   <HF_HUB_CACHE>/models--org--name/blobs/<etag>              content (etag: LFS sha256, else git blob id)
//   <HF_HUB_CACHE>/models--org--name/snapshots/<rev>/<path>     relative symlink to the blob
// The library's downloadFileToCacheDir neither resumes nor verifies, so the transfer is ours: a
// `.incomplete` file beside the blob grows with HTTP Range requests (as huggingface_hub does), and the
// finished bytes must hash to the id the hub's tree lists before they become a blob. A snapshot we
// finished is recorded in models--…/.forge-complete/<rev>.json (outside snapshots/, so the
// checkpoint directory holds only the repo's files); with it a pinned revision needs no network.
// HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE, HF_ENDPOINT and HF_TOKEN are honoured; the token is never printed.
import { createHash, type Hash } from 'node:crypto';
import { copyFile, lstat, mkdir, readFile, readdir, readlink, rename, rm, stat, symlink, truncate, writeFile } from 'node:fs/promises';
import { createReadStream, createWriteStream, statSync } from 'node:fs';
import { basename, dirname, join, relative } from 'node:path';
import { homedir } from 'node:os';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import lockfile from 'proper-lockfile';
import { fileDownloadInfo, listFiles } from '@huggingface/hub';
import { checkRelativePath, checkTokenShape, formatBytes, gitBlobHasher, hubError, hubToken, hubUrl, isOffline, redact } from './hub-client.js';
import { hashFile } from '../engine/hash.js';
import { rememberDigest, statKey } from '../engine/known-digests.js';

export interface HubFile {
  path: string;
  size: number;
  /** Git blob id, as the hub's tree lists it. */
  oid: string;
  /** For LFS files: the content's sha256 (the LFS oid). */
  sha256?: string;
}

export interface HubSnapshotListing {
  repo: string;
  revision: string;
  files: HubFile[];
}

export function hubCacheDir(): string {
  if (process.env.HF_HUB_CACHE) return process.env.HF_HUB_CACHE;
  if (process.env.HF_HOME) return join(process.env.HF_HOME, 'hub');
  return join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'huggingface', 'hub');
}

export function repoCacheDir(repo: string): string {
  return join(hubCacheDir(), `models--${repo.split('/').join('--')}`);
}

export function cachedSnapshotDir(repo: string, revision: string): string {
  return join(repoCacheDir(repo), 'snapshots', revision);
}

const markerPath = (repo: string, revision: string) => join(repoCacheDir(repo), '.forge-complete', `${revision}.json`);
const etagOf = (f: HubFile) => f.sha256 ?? f.oid;
const hasherFor = (f: HubFile): Hash => (f.sha256 ? createHash('sha256') : gitBlobHasher(f.size));

async function sizeOf(path: string): Promise<number | null> {
  try { return (await stat(path)).size; } catch { return null; }
}

async function readMarker(repo: string, revision: string): Promise<HubSnapshotListing | null> {
  try { return JSON.parse(await readFile(markerPath(repo, revision), 'utf8')) as HubSnapshotListing; } catch { return null; }
}

/** The first file of a listing that the snapshot lacks (or has at another size), or null. */
async function firstMissing(listing: HubSnapshotListing): Promise<string | null> {
  const snap = cachedSnapshotDir(listing.repo, listing.revision);
  for (const f of listing.files) if ((await sizeOf(join(snap, f.path))) !== f.size) return f.path;
  return null;
}

/** An LFS file's git blob id is that of its pointer, which the sha256 and size determine. */
function lfsPointerOid(sha256: string, size: number): string {
  const pointer = `version https://git-lfs.github.com/spec/v1\noid sha256:${sha256}\nsize ${size}\n`;
  return gitBlobHasher(Buffer.byteLength(pointer)).update(pointer).digest('hex');
}

/** A snapshot made by someone else (Python): its symlinks name the blobs, so they name the hashes. */
async function listingFromSnapshot(repo: string, revision: string): Promise<HubSnapshotListing> {
  const snap = cachedSnapshotDir(repo, revision);
  const files: HubFile[] = [];
  const walk = async (dir: string): Promise<void> => {
    for (const e of await readdir(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) { await walk(p); continue; }
      const path = relative(snap, p).split('\\').join('/');
      const size = (await stat(p)).size;
      const etag = (await lstat(p)).isSymbolicLink() ? basename(await readlink(p)) : await hashFile(p, gitBlobHasher(size));
      files.push(/^[0-9a-f]{64}$/.test(etag) ? { path, size, oid: lfsPointerOid(etag, size), sha256: etag } : { path, size, oid: etag });
    }
  };
  await walk(snap);
  return { repo, revision, files: files.sort((a, b) => a.path.localeCompare(b.path)) };
}

/**
 * The files of repo@revision with their hashes: what fetchHubSnapshot downloads and verifies. From
 * the cache when this revision was completed before (or HF_HUB_OFFLINE is set), else from the hub's tree.
 */
export async function hubSnapshotFiles(repo: string, revision: string): Promise<HubSnapshotListing> {
  const done = await readMarker(repo, revision);
  if (done) return done;
  if (isOffline()) {
    if (await sizeOf(cachedSnapshotDir(repo, revision)) === null) throw offlineMissing(repo, revision);
    return listingFromSnapshot(repo, revision);
  }
  const token = hubToken();
  checkTokenShape(token);
  const files: HubFile[] = [];
  try {
    for await (const e of listFiles({ repo: { type: 'model', name: repo }, revision, recursive: true, hubUrl: hubUrl(), ...(token ? { accessToken: token } : {}) })) {
      if (e.type !== 'file') continue;
      checkRelativePath(e.path);
      files.push({ path: e.path, size: e.size, oid: e.oid ?? '', ...(e.lfs ? { sha256: e.lfs.oid } : {}) });
    }
  } catch (e) {
    throw hubError(e, `listing ${repo}@${revision}`, token);
  }
  return { repo, revision, files: files.sort((a, b) => a.path.localeCompare(b.path)) };
}

function offlineMissing(repo: string, revision: string): Error {
  return new Error(`HF_HUB_OFFLINE is set and ${repo}@${revision} is not in the HF cache (${cachedSnapshotDir(repo, revision)}); unset HF_HUB_OFFLINE to download it`);
}

export async function fetchHubSnapshot(repo: string, revision: string, log: (m: string) => void): Promise<string> {
  const snap = cachedSnapshotDir(repo, revision);
  const marked = await readMarker(repo, revision);
  const missing = marked ? await firstMissing(marked) : null;
  if (marked && missing === null) {
    log(`${repo}@${revision.slice(0, 10)} is in the HF cache (${snap})`);
    return snap;
  }
  if (isOffline()) {
    if (marked) throw new Error(`HF_HUB_OFFLINE is set and ${missing} of ${repo}@${revision} is missing from the HF cache (${snap})`);
    if (await sizeOf(snap) === null) throw offlineMissing(repo, revision);
    log(`HF_HUB_OFFLINE: using ${snap} as it is (not fetched by forge, so not checked for completeness)`);
    return snap;
  }
  const token = hubToken();
  const listing = marked ?? await hubSnapshotFiles(repo, revision);
  const total = listing.files.reduce((a, f) => a + f.size, 0);
  log(`fetching ${repo}@${revision.slice(0, 10)}: ${listing.files.length} files, ${formatBytes(total)} into ${hubCacheDir()}`);
  const queue = [...listing.files];
  let failure: unknown = null;
  // A few at a time: shards are big and the CDN serves them in parallel well.
  await Promise.all(Array.from({ length: Math.min(4, queue.length) }, async () => {
    for (let f = queue.shift(); f && !failure; f = queue.shift()) {
      try { await ensureFile(repo, revision, f, token, log); } catch (e) { failure ??= e; }
    }
  }));
  if (failure) {
    const msg = failure instanceof Error ? failure.message : String(failure);
    throw new Error(redact(`could not download ${repo}@${revision}: ${msg}`, token));
  }
  await mkdir(dirname(markerPath(repo, revision)), { recursive: true });
  const tmp = `${markerPath(repo, revision)}.${process.pid}.tmp`;
  await writeFile(tmp, JSON.stringify(listing, null, 1));
  await rename(tmp, markerPath(repo, revision));
  return snap;
}

async function link(blob: string, pointer: string): Promise<void> {
  await mkdir(dirname(pointer), { recursive: true });
  await rm(pointer, { force: true });
  try {
    await symlink(relative(dirname(pointer), blob), pointer);
  } catch {
    await copyFile(blob, pointer); // no symlinks here (Windows without developer mode): a copy, as huggingface_hub does
  }
}

/** A checked LFS blob's sha256, kept by inode: the export's hard links to it are committed without reading it again. */
function rememberLfsDigest(f: HubFile, blob: string): void {
  if (f.sha256) rememberDigest(statKey(statSync(blob, { bigint: true })), f.sha256);
}

async function ensureFile(repo: string, revision: string, f: HubFile, token: string | undefined, log: (m: string) => void): Promise<void> {
  checkRelativePath(f.path);
  const folder = repoCacheDir(repo);
  const blob = join(folder, 'blobs', etagOf(f));
  const pointer = join(cachedSnapshotDir(repo, revision), f.path);
  await mkdir(dirname(blob), { recursive: true });
  const lockPath = join(hubCacheDir(), '.locks', basename(folder), `${etagOf(f)}.forge-lock`);
  await mkdir(dirname(lockPath), { recursive: true });
  // Another build may be fetching the same blob; appending to one .incomplete from two places would corrupt it.
  const release = await lockfile.lock(blob, { realpath: false, lockfilePath: lockPath, stale: 30_000, retries: { forever: true, minTimeout: 200, maxTimeout: 2000 },
    onCompromised: (e) => log(`lock on ${f.path} was lost (${e.message}); carrying on`) });
  try {
    if ((await sizeOf(blob)) !== null) {
      // Not covered by a completion record, so possibly written by someone else: check before trusting.
      if ((await sizeOf(blob)) === f.size && (await hashFile(blob, hasherFor(f))) === etagOf(f)) {
        rememberLfsDigest(f, blob);
        return await link(blob, pointer);
      }
      log(`cached blob of ${f.path} does not match its hash; fetching it again`);
      await rm(blob, { force: true });
    }
    await downloadBlob(repo, revision, f, blob, token, log);
    rememberLfsDigest(f, blob);
    await link(blob, pointer);
  } finally {
    await release();
  }
}

async function downloadBlob(repo: string, revision: string, f: HubFile, blob: string, token: string | undefined, log: (m: string) => void): Promise<void> {
  const base = hubUrl();
  let info;
  try {
    info = await fileDownloadInfo({ repo: { type: 'model', name: repo }, path: f.path, revision, hubUrl: base, ...(token ? { accessToken: token } : {}) });
  } catch (e) {
    throw hubError(e, `resolving ${f.path}`, token);
  }
  if (!info) throw new Error(`${f.path}: listed at this revision but the hub has no such file`);
  if (info.size !== f.size) throw new Error(`${f.path}: the hub serves ${info.size} bytes but lists ${f.size}`);

  const incomplete = `${blob}.incomplete`;
  let have = (await sizeOf(incomplete)) ?? 0;
  if (have > f.size) { await truncate(incomplete, 0); have = 0; }
  let hash = hasherFor(f);
  if (have > 0) {
    for await (const c of createReadStream(incomplete)) hash.update(c as Buffer);
    log(`resuming ${f.path} at ${formatBytes(have)} of ${formatBytes(f.size)}`);
  } else {
    log(`downloading ${f.path} (${formatBytes(f.size)})`);
  }
  if (have < f.size) {
    const headers: Record<string, string> = {};
    if (have > 0) headers.Range = `bytes=${have}-`;
    // The token goes to the hub only; a CDN URL is already signed (fetch drops it on cross-origin redirects too).
    if (token && new URL(info.url).origin === new URL(base).origin) headers.Authorization = `Bearer ${token}`;
    const res = await fetch(info.url, { headers });
    if (res.status === 200 && have > 0) {
      log(`${f.path}: the server ignored the range request; starting over`);
      await truncate(incomplete, 0);
      have = 0;
      hash = hasherFor(f);
    } else if (res.status === 206) {
      const start = /^bytes (\d+)-/.exec(res.headers.get('content-range') ?? '')?.[1];
      if (Number(start) !== have) throw new Error(`${f.path}: asked for bytes from ${have}, the server sent from ${start}`);
    } else if (!res.ok) {
      throw new Error(`${f.path}: the hub answered ${res.status} ${res.statusText}`);
    }
    if (!res.body) throw new Error(`${f.path}: empty response`);
    const h = hash;
    const tee = new Transform({ transform(chunk: Buffer, _enc, cb) { h.update(chunk); cb(null, chunk); } });
    try {
      await pipeline(Readable.fromWeb(res.body as WebReadableStream), tee, createWriteStream(incomplete, { flags: have > 0 ? 'a' : 'w' }));
    } catch (e) {
      const got = (await sizeOf(incomplete)) ?? 0;
      throw new Error(`${f.path}: the transfer broke at ${formatBytes(got)} of ${formatBytes(f.size)} (${(e as Error).message}); run again to resume`);
    }
  }
  const got = (await sizeOf(incomplete)) ?? 0;
  if (got !== f.size) {
    if (got > f.size) await rm(incomplete, { force: true });
    throw new Error(`${f.path}: got ${got} bytes, the hub lists ${f.size}`);
  }
  const digest = hash.digest('hex');
  if (digest !== etagOf(f)) {
    await rm(incomplete, { force: true });
    const kind = f.sha256 ? 'sha256 (LFS oid)' : 'git blob id';
    throw new Error(`${f.path} does not match the hub's ${kind}: expected ${etagOf(f)}, got ${digest}; the download was discarded`);
  }
  await rename(incomplete, blob);
}
