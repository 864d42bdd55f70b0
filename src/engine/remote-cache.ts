// The shared stage cache: the local cache's content-addressed entries, also kept in S3-compatible
// object storage, read through on a local miss and written back after a stage ran.
//
// Layout under s3://bucket/prefix:
//   <stage>/<key>/meta.json             the entry's EntryMeta plus `remote.writer`: the commit marker
//   <stage>/<key>/<writer>/<file path>  the files, under the prefix of the writer that uploaded them
//
// A writer uploads every file under its own unique prefix first and meta.json last, and meta.json
// names that prefix. So an upload cut short leaves no meta.json (readers see no entry), and two
// machines writing the same key at once never mix: each meta.json PUT is atomic and points at one
// writer's complete set of files; the last PUT wins. (Conditional PUT, If-None-Match: *, would let
// the first win instead, but S3-compatible servers differ: s3proxy 2.6 ignores it, so it cannot be
// what correctness rests on.) Whatever the layout promises, a reader verifies every file's size and
// sha256 and the entry's contentHash before the entry enters the local cache.
import { randomBytes } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { hostname } from 'node:os';
import type { S3Client } from '@aws-sdk/client-s3';
import { META, type EntryMeta, type StageCache } from './cache.js';
import { sha256Hex, stableStringify } from './hash.js';
import {
  checkBucket, deleteKeys, probeReadWrite, exists, getFile, getText, listKeys, listObjects, parseS3Url, putFile, putText, s3Client, s3Reason, s3Url,
  type S3Location,
} from './s3.js';

/** The environment variable a build reads when no --cache is given (a worker's child builds inherit it). */
export const REMOTE_CACHE_ENV = 'FORGE_REMOTE_CACHE';

/** What meta.json holds remotely: the local entry's meta, and whose upload its files are. */
export type RemoteMeta = EntryMeta & { remote: { writer: string } };

export type FetchResult =
  | { meta: EntryMeta; bytes: number }
  | { meta: null; why: 'absent' }
  /** An entry exists remotely but could not be used (corrupt, incomplete, unreachable): the stage runs. */
  | { meta: null; why: 'unusable'; message: string };

export interface SweepResult {
  /** Entries (stage/key) seen under the prefix. */
  entries: number;
  /** `<stage>/<key>/<writer>` of every orphaned upload removed (or, dry run, to remove). */
  orphans: string[];
  objects: number;
  bytes: number;
  /** Orphan-looking uploads kept because some file is younger than the cutoff (maybe still uploading). */
  young: number;
  /** Entries left alone because their meta.json could not be read or checked. */
  unreadable: string[];
}

export interface UploadResult {
  outcome: 'uploaded' | 'present' | 'superseded';
  files: number;
  bytes: number;
}

export class RemoteCache {
  private constructor(readonly client: S3Client, readonly loc: S3Location) {}

  get url(): string {
    return s3Url(this.loc);
  }

  /** Parses the URL and checks the bucket is there and reachable: one clear error, before any stage runs. */
  static async open(url: string): Promise<RemoteCache> {
    const loc = parseS3Url(url);
    const client = await s3Client();
    await checkBucket(client, loc);
    return new RemoteCache(client, loc);
  }

  /** A write, a read and a delete of a small object under the prefix: the credentials can do what a build does. */
  probe(name: string): Promise<void> {
    return probeReadWrite(this.client, this.loc, name.replace(/[^A-Za-z0-9._-]/g, '-'));
  }

  /** `--cache` if given, else FORGE_REMOTE_CACHE, else none. */
  static async fromOption(url: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<RemoteCache | undefined> {
    const chosen = url ?? env[REMOTE_CACHE_ENV];
    return chosen ? RemoteCache.open(chosen) : undefined;
  }

  private entryPrefix(stage: string, key: string): string {
    return [this.loc.prefix, stage, key].filter(Boolean).join('/');
  }

  metaKey(stage: string, key: string): string {
    return `${this.entryPrefix(stage, key)}/${META}`;
  }

  fileKey(stage: string, key: string, writer: string, rel: string): string {
    return `${this.entryPrefix(stage, key)}/${writer}/${rel}`;
  }

  /** Whether a committed entry is there (its meta.json); its files are only checked when fetched. */
  has(stage: string, key: string): Promise<boolean> {
    return exists(this.client, this.loc.bucket, this.metaKey(stage, key));
  }

  /**
   * Downloads the entry into `tmp` (a fresh temp dir of the local cache, the caller holding the
   * entry's lock), verifies it, and only then moves it into the local cache. Anything short of a
   * complete, matching entry leaves the local cache as it was.
   */
  async fetchInto(cache: StageCache, stage: string, key: string, tmp: string, signal?: AbortSignal): Promise<FetchResult> {
    let text: string | null;
    try {
      text = await getText(this.client, this.loc.bucket, this.metaKey(stage, key));
    } catch (e) {
      return { meta: null, why: 'unusable', message: `cannot read ${this.metaKey(stage, key)}: ${s3Reason(e)}` };
    }
    if (text === null) return { meta: null, why: 'absent' };
    const fail = (message: string): FetchResult => ({ meta: null, why: 'unusable', message: `${this.url}/${stage}/${key}: ${message}` });
    let remote: RemoteMeta;
    try {
      remote = JSON.parse(text) as RemoteMeta;
    } catch {
      return fail(`${META} is not JSON`);
    }
    const problem = checkMeta(remote, stage, key);
    if (problem) return fail(problem);
    let bytes = 0;
    for (const [rel, want] of Object.entries(remote.files)) {
      const objectKey = this.fileKey(stage, key, remote.remote.writer, rel);
      const path = join(tmp, rel);
      try {
        await mkdir(dirname(path), { recursive: true });
        const got = await getFile(this.client, this.loc.bucket, objectKey, path, signal);
        if (got.size !== want.size) return fail(`${rel} is ${got.size} bytes, meta.json says ${want.size}`);
        if (got.sha256 !== want.sha256) return fail(`${rel} does not match its sha256 in meta.json`);
        bytes += got.size;
      } catch (e) {
        return fail(`cannot download ${rel}: ${s3Reason(e)}`);
      }
    }
    // The digests verified above are the files; the contentHash over them must be the one recorded
    // (it is what downstream keys are made of).
    if (sha256Hex(stableStringify(remote.files)) !== remote.contentHash) return fail('its contentHash does not match its files');
    const { remote: _writer, ...meta } = remote;
    await cache.adopt(tmp, meta);
    return { meta, bytes };
  }

  /**
   * Uploads a committed local entry: its files under a prefix of this writer's own, then meta.json
   * naming that prefix. `replace` overwrites a remote entry found unusable; otherwise one already
   * there is kept (its content is what this key produces).
   */
  async upload(dir: string, meta: EntryMeta, opts: { replace?: boolean; signal?: AbortSignal } = {}): Promise<UploadResult> {
    const { stage, key } = meta;
    const files = Object.keys(meta.files);
    const bytes = Object.values(meta.files).reduce((s, f) => s + f.size, 0);
    if (!opts.replace && (await this.has(stage, key))) return { outcome: 'present', files: 0, bytes: 0 };
    // Time first so a listing reads oldest → newest; host and random bytes make it unique per upload.
    const writer = `w-${Date.now().toString(36)}-${hostname().replace(/[^A-Za-z0-9-]/g, '').slice(0, 20)}-${randomBytes(6).toString('hex')}`;
    const uploaded: string[] = [];
    try {
      for (const rel of files) {
        const objectKey = this.fileKey(stage, key, writer, rel);
        await putFile(this.client, this.loc.bucket, objectKey, join(dir, rel), opts.signal);
        uploaded.push(objectKey);
      }
      opts.signal?.throwIfAborted(); // an interrupted build commits no entry it did not finish uploading
      const remote: RemoteMeta = { ...meta, remote: { writer } };
      await putText(this.client, this.loc.bucket, this.metaKey(stage, key), JSON.stringify(remote, null, 2));
    } catch (e) {
      // Without meta.json the files are invisible to readers; removing them only saves space.
      await deleteKeys(this.client, this.loc.bucket, uploaded).catch(() => undefined);
      throw e;
    }
    // Another machine may have committed the same key just after: its meta.json won, so these files
    // are named by nothing. A reader that already read our meta.json may lose them mid-download; it
    // then finds them missing and runs the stage, which is safe.
    const now = await getText(this.client, this.loc.bucket, this.metaKey(stage, key)).catch(() => null);
    const winner = now ? (JSON.parse(now) as RemoteMeta).remote?.writer : undefined;
    if (winner && winner !== writer) {
      await deleteKeys(this.client, this.loc.bucket, uploaded).catch(() => undefined);
      return { outcome: 'superseded', files: files.length, bytes };
    }
    return { outcome: 'uploaded', files: files.length, bytes };
  }

  /**
   * Removes the files no meta.json names: uploads cut short (no meta.json), writers that lost a race,
   * the files of a bad entry that a good one replaced. Readers never see them; only the bucket's size
   * does. A writer's files go only when every one of them is older than `olderThanMs` (an upload in
   * progress is young), and a committed entry — its meta.json and its writer's files — is never
   * touched, nor any entry whose meta.json cannot be read (the next upload replaces it).
   */
  async sweep(o: { olderThanMs: number; dryRun?: boolean; now?: number }): Promise<SweepResult> {
    const base = this.loc.prefix ? `${this.loc.prefix}/` : '';
    const cutoff = (o.now ?? Date.now()) - o.olderThanMs;
    // <stage>/<key> → its meta.json (if any) and its objects by writer.
    const entries = new Map<string, { meta: boolean; writers: Map<string, Array<{ key: string; size: number; lastModified: number }>> }>();
    for (const obj of await listObjects(this.client, this.loc.bucket, base)) {
      const parts = obj.key.slice(base.length).split('/');
      // Not an entry's object: not forge's to remove. (A key ending in '/' is a directory marker,
      // which filesystem-backed servers such as s3proxy list; forge writes none.)
      if (parts.length < 3 || parts.includes('')) continue;
      const id = `${parts[0]}/${parts[1]}`;
      const e = entries.get(id) ?? { meta: false, writers: new Map() };
      if (parts.length === 3 && parts[2] === META) e.meta = true;
      else e.writers.set(parts[2], [...(e.writers.get(parts[2]) ?? []), obj]);
      entries.set(id, e);
    }
    const r: SweepResult = { entries: entries.size, orphans: [], objects: 0, bytes: 0, young: 0, unreadable: [] };
    for (const [id, e] of entries) {
      let committed: string | null = null;
      if (e.meta) {
        const [stage, key] = id.split('/');
        try {
          const m = JSON.parse((await getText(this.client, this.loc.bucket, this.metaKey(stage, key))) ?? 'null') as RemoteMeta | null;
          committed = m && checkMeta(m, stage, key) === null ? m.remote.writer : null;
        } catch {
          committed = null;
        }
        if (committed === null) {
          r.unreadable.push(id);
          continue;
        }
      }
      for (const [writer, objs] of e.writers) {
        if (writer === committed) continue;
        if (objs.some((x) => x.lastModified > cutoff)) {
          r.young++;
          continue;
        }
        r.orphans.push(`${id}/${writer}`);
        r.objects += objs.length;
        r.bytes += objs.reduce((s, x) => s + x.size, 0);
        if (!o.dryRun) await deleteKeys(this.client, this.loc.bucket, objs.map((x) => x.key));
      }
    }
    return r;
  }

  /** Every object key of an entry (meta.json and all writers' files): for tests and inspection. */
  entryKeys(stage: string, key: string): Promise<string[]> {
    return listKeys(this.client, this.loc.bucket, `${this.entryPrefix(stage, key)}/`);
  }
}

/** Why a remote meta.json cannot describe this entry (null when it can). */
function checkMeta(m: RemoteMeta, stage: string, key: string): string | null {
  if (m.stage !== stage || m.key !== key) return `${META} is for ${m.stage}/${m.key}`;
  if (typeof m.remote?.writer !== 'string' || !/^[A-Za-z0-9-]+$/.test(m.remote.writer)) return `${META} names no writer`;
  if (typeof m.contentHash !== 'string' || !m.files || typeof m.files !== 'object') return `${META} lists no files`;
  for (const [rel, f] of Object.entries(m.files)) {
    // The paths become local paths: nothing may climb out of the entry or shadow its meta.json.
    if (rel === META || rel.startsWith('/') || rel.split('/').some((p) => p === '..' || p === '.' || p === '')) return `${META} lists an unsafe path '${rel}'`;
    if (!Number.isSafeInteger(f?.size) || typeof f?.sha256 !== 'string') return `${META} has no digest for '${rel}'`;
  }
  return null;
}
