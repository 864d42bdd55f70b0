// What publish and download share: where the hub is (HF_ENDPOINT), which token (HF_TOKEN), hashing
// in the hub's terms, and turning the library's errors into one clear line that never holds the
// token. The token is handed to @huggingface/hub and to our own fetches only; every message that
// leaves this module goes through redact().
import { createHash, type Hash } from 'node:crypto';
import { HubApiError } from '@huggingface/hub';

export const DEFAULT_HUB_URL = 'https://huggingface.co';

export function hubUrl(explicit?: string): string {
  return (explicit ?? process.env.HF_ENDPOINT ?? DEFAULT_HUB_URL).replace(/\/+$/, '');
}

export function hubToken(explicit?: string): string | undefined {
  const t = explicit ?? process.env.HF_TOKEN ?? process.env.HUGGING_FACE_HUB_TOKEN;
  return t ? t.trim() : undefined;
}

/** The library refuses a token without the hf_ prefix with a message of its own; say it our way. */
export function checkTokenShape(token: string | undefined): void {
  if (token !== undefined && !token.startsWith('hf_')) {
    throw new Error('the token in HF_TOKEN does not look like a hub token (it should start with hf_)');
  }
}

/** Removes the token (and anything that merely contains it) from a message. */
export function redact(text: string, token: string | undefined): string {
  if (!token) return text;
  return text.split(token).join('<token>');
}

export function isOffline(): boolean {
  return ['1', 'true', 'yes', 'on'].includes((process.env.HF_HUB_OFFLINE ?? '').toLowerCase());
}

export function statusOf(e: unknown): number | undefined {
  return e instanceof HubApiError ? e.statusCode : undefined;
}

const NETWORK_CODES = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'ENETUNREACH', 'EHOSTUNREACH', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_SOCKET', 'fetch failed']);

/**
 * The network code of a failure to reach the hub at all (refused, no route, no DNS …), as opposed
 * to an answer from it; null when the hub answered or the error is something else.
 */
export function unreachableCode(e: unknown): string | null {
  for (let c: unknown = e, depth = 0; c && depth < 5; c = (c as { cause?: unknown }).cause, depth++) {
    if (statusOf(c) !== undefined || (c as { status?: unknown }).status !== undefined) return null;
    const code = (c as { code?: unknown }).code;
    if (typeof code === 'string' && NETWORK_CODES.has(code)) return code;
    const inner = (c as { errors?: unknown }).errors; // AggregateError of a dual-stack connect
    if (Array.isArray(inner)) for (const i of inner) { const ic = unreachableCode(i); if (ic) return ic; }
    if (c instanceof TypeError && c.message === 'fetch failed' && !(c.cause instanceof Error)) return 'fetch failed';
  }
  return null;
}

/** One line for a failed hub call; `what` says what we were doing ("listing org/name"). */
export function hubError(e: unknown, what: string, token: string | undefined): Error {
  const status = statusOf(e);
  const network = unreachableCode(e);
  let msg: string;
  if (network) msg = `could not reach the hub while ${what} (${network}): check the network, or HF_ENDPOINT if it is set`;
  else if (status === 401) msg = `the hub refused the token (401) while ${what}: check HF_TOKEN${token ? '' : ' (none is set)'}`;
  else if (status === 403) msg = `the hub refused the token (403) while ${what}: it lacks write access to this repository`;
  else {
    const detail = e instanceof Error ? e.message : String(e);
    const cause = e instanceof Error && e.cause instanceof Error ? ` (${e.cause.message})` : '';
    msg = `${what} failed: ${detail}${cause}`;
  }
  const out = new Error(redact(msg, token));
  // The original is not kept as `cause` (its text is not redacted); the network code is enough.
  if (network) (out as Error & { code?: string }).code = network;
  if (status !== undefined) (out as Error & { status?: number }).status = status;
  return out;
}

/** A path from a listing or SHA256SUMS is joined onto a local directory: keep it inside. */
export function checkRelativePath(path: string): void {
  const parts = path.replace(/\\/g, '/').split('/');
  if (!path || path.startsWith('/') || /^[a-zA-Z]:/.test(path) || parts.some((p) => p === '..' || p === '')) {
    throw new Error(`refusing the unsafe file name ${JSON.stringify(path)}`);
  }
}

/** The git blob id the hub reports as `oid` for a regular (non-LFS) file. */
export function gitBlobHasher(size: number): Hash {
  return createHash('sha1').update(`blob ${size}\0`);
}

export function formatBytes(n: number): string {
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  let v = n;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return i === 0 ? `${n} B` : `${v.toFixed(1)} ${units[i]}`;
}
