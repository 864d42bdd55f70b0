// fetch's non-finite weight check. It covers every floating tensor forge reads: the tensors the
// family's graphs and host tables read for the checkpoint's config (families/tensors.ts, the list
// validateCheckpoint checks the shapes of). A tensor nothing reads (a tower forge does not build, a
// clip bound stored as ±inf) is not scanned, and the result says how many were left so and where.
// Without a list (`reads` undefined or empty) every floating tensor is scanned: the check fails safe.
// The recipe's way out, `source.allowNonFinite.reason`, skips the scan for weights forge does read
// and are non-finite by design; what happened (checked, or skipped and why) goes into the run record
// and the card. A local checkpoint's files were scanned as the content digest hashed them
// (local-digest.ts): their recorded results are taken while the file's stat still matches; every
// other file is scanned here.
import { relative, sep } from 'node:path';
import { openCheckpoint } from '../io/checkpoint.js';
import { checkFinite, FiniteScanner, FLOAT_DTYPES, nonFiniteError } from '../io/finite.js';
import type { Recipe } from '../recipe/schema.js';
import { recordedFinite } from './local-digest.js';

/** Floating tensors nothing reads, not scanned: how many, their bytes, and how many under each name prefix. */
export type NotRead = { tensors: number; bytes: number; under: Record<string, number> };

export type FiniteCheck =
  | {
    checked: true;
    /** Floating tensors scanned (all of them when `notRead` is absent) and their bytes. */
    tensors: number; bytes: number; seconds: number; filesFromDigest?: number;
    /** Present when the check covered the tensors forge reads: those it left out. */
    notRead?: NotRead;
  }
  | { checked: false; reason: string };

export interface FiniteStageOptions {
  /** The standalone scan (tests watch which files it reads). @default checkFinite */
  scan?: typeof checkFinite;
  /**
   * The names of the tensors forge reads (validateCheckpoint's `reads`): only their floating ones
   * are scanned. Undefined or empty: every floating tensor is.
   */
  reads?: readonly string[];
}

/**
 * Where a tensor nothing reads is counted: its first two dotted parts and `.*`
 * ("model.audio_tower.*"); a prefix that holds one such tensor is shown by its full name.
 */
export function groupNotRead(names: readonly string[]): Record<string, number> {
  const prefix = (n: string) => n.split('.').slice(0, 2).join('.');
  const count = new Map<string, string[]>();
  for (const n of names) count.set(prefix(n), [...(count.get(prefix(n)) ?? []), n]);
  const out: Record<string, number> = {};
  for (const [p, ns] of [...count].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
    if (ns.length === 1) out[ns[0]] = 1;
    else out[`${p}.*`] = ns.length;
  }
  return out;
}

export async function checkFiniteStage(source: Recipe['source'], dir: string, log: (m: string) => void, opts: FiniteStageOptions = {}): Promise<FiniteCheck> {
  if (source.allowNonFinite) {
    log(`NaN/Inf weight check skipped: the recipe allows non-finite weights (${source.allowNonFinite.reason})`);
    return { checked: false, reason: source.allowNonFinite.reason };
  }
  const t = performance.now();
  // An empty list is no list: a family that names nothing it reads gets every tensor scanned.
  const reads = opts.reads === undefined || opts.reads.length === 0 ? undefined : new Set(opts.reads);
  const isRead = (name: string) => reads === undefined || reads.has(name);
  const ckpt = await openCheckpoint(dir);
  let files: readonly string[];
  /** Floating tensors forge reads and their bytes per file, for the totals of files whose scan was recorded. */
  const floating = new Map<string, { tensors: number; bytes: number }>();
  const unread: string[] = [];
  let unreadBytes = 0;
  try {
    files = ckpt.files;
    for (const name of ckpt.names()) {
      const info = ckpt.info(name);
      if (!FLOAT_DTYPES.has(info.dtype)) continue;
      if (!isRead(name)) {
        unread.push(name);
        unreadBytes += info.byteLength;
        continue;
      }
      const f = floating.get(info.file) ?? { tensors: 0, bytes: 0 };
      floating.set(info.file, { tensors: f.tensors + 1, bytes: f.bytes + info.byteLength });
    }
  } finally {
    await ckpt.close();
  }
  const recorded = source.kind === 'local' ? recordedFinite(dir) : new Map();
  const scan = opts.scan ?? checkFinite;
  // File order, so the error names the first bad file whichever way each was scanned.
  let scanner: FiniteScanner | undefined;
  let tensors = 0, bytes = 0, fromDigest = 0, bytesNow = 0;
  for (const file of files) {
    const record = recorded.get(relative(dir, file).split(sep).join('/'));
    if (record !== undefined && record !== 'ok' && isRead(record.tensor)) {
      log(`${file}: its NaN/Inf scan was made as the content digest read it (the file's stat is unchanged since)`);
      throw nonFiniteError(file, record);
    }
    if (record === 'ok') {
      fromDigest++;
      tensors += floating.get(file)?.tensors ?? 0;
      bytes += floating.get(file)?.bytes ?? 0;
      continue;
    }
    if (record !== undefined) {
      // The digest stops at a file's first bad element: one in a tensor nothing reads says nothing of the rest.
      log(`${file}: the content digest found ${record.value} in ${record.tensor}, which nothing reads; scanning the tensors forge reads in it`);
    }
    if (!floating.has(file) && reads !== undefined) continue; // nothing read in this file
    const r = await scan([file], (scanner ??= new FiniteScanner()), reads);
    tensors += r.tensors;
    bytes += r.bytes;
    bytesNow += r.bytes;
  }
  const seconds = (performance.now() - t) / 1000;
  const how = fromDigest === 0 ? '' : fromDigest === files.length ? ', all scanned as the content digest read them'
    : `, ${fromDigest} of ${files.length} files scanned as the content digest read them, ${(bytesNow / 1e9).toFixed(2)} GB now`;
  const notRead: NotRead | undefined = reads === undefined ? undefined : { tensors: unread.length, bytes: unreadBytes, under: groupNotRead(unread) };
  const which = reads === undefined ? 'floating tensors (every one: no list of the tensors forge reads was given)' : 'floating tensors the graphs and host tables read';
  log(`no NaN/Inf in ${tensors} ${which} (${(bytes / 1e9).toFixed(2)} GB in ${seconds.toFixed(1)} s${how})`);
  if (notRead && notRead.tensors > 0) {
    const where = Object.entries(notRead.under).map(([p, n]) => (n === 1 ? p : `${p} (${n})`)).join(', ');
    log(`not checked: ${notRead.tensors} floating tensors nothing reads (${(notRead.bytes / 1e6).toFixed(2)} MB): ${where}`);
  }
  return {
    checked: true, tensors, bytes, seconds: Math.round(seconds * 1000) / 1000,
    ...(source.kind === 'local' ? { filesFromDigest: fromDigest } : {}),
    ...(notRead ? { notRead } : {}),
  };
}
