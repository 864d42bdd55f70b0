// The few S3 operations the shared stage cache needs, over any S3-compatible server.
// Credentials, region and endpoint come from the SDK's default chain (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, ~/.aws …); nothing
// here ever prints them.
import { createReadStream, createWriteStream } from 'node:fs';
import { createHash } from 'node:crypto';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { Readable } from 'node:stream';
import {
  S3Client, HeadBucketCommand, HeadObjectCommand, GetObjectCommand, PutObjectCommand,
  DeleteObjectCommand, ListObjectsV2Command, type S3ServiceException,
} from '@aws-sdk/client-s3';
import { Upload } from '@aws-sdk/lib-storage';

export interface S3Location {
  bucket: string;
  /** Key prefix without leading or trailing '/' ('' for the bucket's root). */
  prefix: string;
}

/** `s3://bucket/prefix` → bucket and prefix; anything else is one clear error. */
export function parseS3Url(url: string): S3Location {
  const m = /^s3:\/\/([^/]+)(?:\/(.*))?$/.exec(url.trim());
  if (!m) throw new Error(`remote cache '${url}' is not an s3://bucket/prefix URL`);
  // Bucket names: 3-63 lowercase letters, digits, dots and hyphens (S3's rule, which s3proxy also applies).
  if (!/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/.test(m[1])) throw new Error(`remote cache '${url}': '${m[1]}' is not a valid bucket name`);
  return { bucket: m[1], prefix: (m[2] ?? '').replace(/^\/+|\/+$/g, '') };
}

export const s3Url = (l: S3Location) => `s3://${l.bucket}${l.prefix ? `/${l.prefix}` : ''}`;

/** Parts of 16 MiB, four in flight: an upload of a GB entry holds about 64 MiB, whatever its size. */
const PART_BYTES = 16 << 20;
const PARTS_IN_FLIGHT = 4;

/**
 * A client from the SDK's usual chain (environment, then the shared config file's profile: region,
 * endpoint, credentials). Only when that chain names no region is it us-east-1: S3-compatible servers
 * (MinIO, s3proxy) accept any, and a user with none configured should not have to invent one.
 */
export async function s3Client(): Promise<S3Client> {
  // The SDK warns on every process under Node 20 that future releases need Node 22: noise in a build log.
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
  const client = makeClient({});
  try {
    await client.config.region();
    return client;
  } catch {
    client.destroy();
    return makeClient({ region: 'us-east-1' });
  }
}

function makeClient(extra: { region?: string }): S3Client {
  return new S3Client({
    // Path-style (http://host/bucket/key) works on every S3-compatible server; virtual-host style
    // needs wildcard DNS that a local MinIO or s3proxy does not have.
    forcePathStyle: true,
    // The SDK's default CRC32 trailing checksums are refused by some servers (s3proxy 2.6: 501
    // NotImplemented). The entry's own sha256 digests are what a reader trusts anyway.
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
    // A server that stops answering fails the request rather than hanging the build.
    requestHandler: { connectionTimeout: 10_000, requestTimeout: 120_000 },
    ...extra,
  });
}

const status = (e: unknown) => (e as S3ServiceException).$metadata?.httpStatusCode;
export const isNotFound = (e: unknown) => status(e) === 404 || (e as Error).name === 'NoSuchKey' || (e as Error).name === 'NotFound';

/** A short reason for an S3 failure (the SDK's own message is often just "UnknownError"). */
export function s3Reason(e: unknown): string {
  const err = e as S3ServiceException & { code?: string };
  const code = status(e);
  const name = err.name && err.name !== 'Unknown' && err.name !== 'Error' ? err.name : err.code;
  const msg = err.message && err.message !== 'UnknownError' ? err.message : '';
  return [code ? `HTTP ${code}` : '', name ?? '', msg].filter(Boolean).join(' ') || String(e);
}

/**
 * The shared cache cannot be used at all (bucket missing, credentials refused, server unreachable):
 * a fault of the machine's setup, not of the build, so a farm worker hands the job back on it.
 */
export class RemoteCacheError extends Error {
  override name = 'RemoteCacheError';
}

/** The endpoint the SDK is pointed at, when the environment names one (printed in errors; it holds no secret). */
export const s3Endpoint = (): string | undefined => process.env.AWS_ENDPOINT_URL_S3 ?? process.env.AWS_ENDPOINT_URL;

/** Why an S3 call on this bucket failed, in a person's words (the bucket named, never the credentials). */
export function bucketProblem(e: unknown, loc: S3Location): string {
  const code = status(e);
  return (e as Error).name === 'CredentialsProviderError' ? `no AWS credentials found for bucket '${loc.bucket}' (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)`
    : code === 404 || (e as Error).name === 'NoSuchBucket' ? `bucket '${loc.bucket}' does not exist`
    : code === 403 ? `access to bucket '${loc.bucket}' denied (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)`
    : code === 301 ? `bucket '${loc.bucket}' is in another region (set AWS_REGION)`
    : `bucket '${loc.bucket}' cannot be reached: ${s3Reason(e)}`;
}

const cacheError = (loc: S3Location, why: string) => {
  const where = s3Endpoint();
  return new RemoteCacheError(`remote cache ${s3Url(loc)}: ${why}${where ? ` (endpoint ${where})` : ''}`);
};

/**
 * Checks at start that the bucket exists and these credentials can reach it, so a wrong bucket or
 * key fails the command once, before any stage runs, naming the bucket (never the credentials).
 */
export async function checkBucket(client: S3Client, loc: S3Location): Promise<void> {
  try {
    await client.send(new HeadBucketCommand({ Bucket: loc.bucket }));
  } catch (e) {
    throw cacheError(loc, bucketProblem(e, loc));
  }
}

/**
 * Writes, reads back and deletes one small object under the prefix: what a farm worker checks
 * before it takes a job, since a bucket that answers HEAD may still refuse these credentials a
 * write (a read-only key) and every build would then fail on it. The probe's key has fewer parts
 * than an entry's, so the sweep never counts it as one.
 */
export async function probeReadWrite(client: S3Client, loc: S3Location, name: string): Promise<void> {
  const key = [loc.prefix, '.forge-probe', name].filter(Boolean).join('/');
  const text = `forge worker check ${name} ${new Date().toISOString()}`;
  let step = 'write';
  try {
    await putText(client, loc.bucket, key, text);
    step = 'read';
    const back = await getText(client, loc.bucket, key);
    if (back !== text) throw new Error(back === null ? 'the object just written is not there' : 'the object read back differs from the one written');
    step = 'delete';
    await client.send(new DeleteObjectCommand({ Bucket: loc.bucket, Key: key }));
  } catch (e) {
    const why = (e as S3ServiceException).$metadata ? bucketProblem(e, loc) : (e as Error).message;
    throw cacheError(loc, `cannot ${step} a test object ${key}: ${why}`);
  }
}

export async function exists(client: S3Client, bucket: string, key: string): Promise<boolean> {
  try {
    await client.send(new HeadObjectCommand({ Bucket: bucket, Key: key }));
    return true;
  } catch (e) {
    if (isNotFound(e)) return false;
    throw e;
  }
}

/** A small object's text, or null when there is none. */
export async function getText(client: S3Client, bucket: string, key: string): Promise<string | null> {
  try {
    const r = await client.send(new GetObjectCommand({ Bucket: bucket, Key: key }));
    return await r.Body!.transformToString();
  } catch (e) {
    if (isNotFound(e)) return null;
    throw e;
  }
}

export async function putText(client: S3Client, bucket: string, key: string, text: string): Promise<void> {
  await client.send(new PutObjectCommand({ Bucket: bucket, Key: key, Body: text, ContentType: 'application/json' }));
}

/** Streams a file up (multipart above one part), never holding more than a few parts in memory. */
export async function putFile(client: S3Client, bucket: string, key: string, path: string, signal?: AbortSignal): Promise<void> {
  signal?.throwIfAborted();
  const up = new Upload({
    client, params: { Bucket: bucket, Key: key, Body: createReadStream(path, { highWaterMark: 4 << 20 }) },
    partSize: PART_BYTES, queueSize: PARTS_IN_FLIGHT,
    // A failed multipart upload is aborted, so no invisible parts are left billed in the bucket.
    leavePartsOnError: false,
  });
  const abort = () => void up.abort().catch(() => undefined);
  signal?.addEventListener('abort', abort, { once: true });
  try {
    await up.done();
  } finally {
    signal?.removeEventListener('abort', abort);
  }
}

/** Streams an object into `path`, returning its size and sha256 as read (what the caller verifies). */
export async function getFile(client: S3Client, bucket: string, key: string, path: string, signal?: AbortSignal): Promise<{ size: number; sha256: string }> {
  const r = await client.send(new GetObjectCommand({ Bucket: bucket, Key: key }), { abortSignal: signal });
  const hash = createHash('sha256');
  let size = 0;
  const tap = new Transform({
    transform(chunk: Buffer, _enc, done) {
      hash.update(chunk);
      size += chunk.length;
      done(null, chunk);
    },
  });
  await pipeline(r.Body as Readable, tap, createWriteStream(path), { signal });
  return { size, sha256: hash.digest('hex') };
}

/** Every object under a prefix: key, size, last modified (ms since the epoch). */
export async function listObjects(client: S3Client, bucket: string, prefix: string): Promise<Array<{ key: string; size: number; lastModified: number }>> {
  const out: Array<{ key: string; size: number; lastModified: number }> = [];
  let token: string | undefined;
  do {
    const r = await client.send(new ListObjectsV2Command({ Bucket: bucket, Prefix: prefix, ContinuationToken: token }));
    for (const o of r.Contents ?? []) if (o.Key) out.push({ key: o.Key, size: o.Size ?? 0, lastModified: o.LastModified?.getTime() ?? 0 });
    token = r.IsTruncated ? r.NextContinuationToken : undefined;
  } while (token);
  return out;
}

/** Every key under a prefix. */
export const listKeys = async (client: S3Client, bucket: string, prefix: string): Promise<string[]> => (await listObjects(client, bucket, prefix)).map((o) => o.key);

/**
 * One DeleteObject per key: the batch DeleteObjects needs a body checksum header that some servers
 * refuse (s3proxy 2.6 answers 501 to the SDK's CRC32), and an entry has tens of files, not thousands.
 */
export async function deleteKeys(client: S3Client, bucket: string, keys: string[]): Promise<void> {
  for (const Key of keys) await client.send(new DeleteObjectCommand({ Bucket: bucket, Key }));
}
