// fetch's non-finite weight check, with the recipe's way out: `source.allowNonFinite.reason` skips
// the scan, and what happened (checked, or skipped and why) goes into the run record and the card.
// A local checkpoint's files were scanned as the content digest hashed them (local-digest.ts): their
// recorded results are taken while the file's stat still matches; every other file is scanned here.
import { relative, sep } from 'node:path';
import { openCheckpoint } from '../io/checkpoint.js';
import { checkFinite, FiniteScanner, FLOAT_DTYPES, nonFiniteError } from '../io/finite.js';
import type { Recipe } from '../recipe/schema.js';
import { recordedFinite } from './local-digest.js';

export type FiniteCheck =
  | { checked: true; tensors: number; bytes: number; seconds: number; filesFromDigest?: number }
  | { checked: false; reason: string };

export interface FiniteStageOptions {
  /** The standalone scan (tests watch which files it reads). @default checkFinite */
  scan?: typeof checkFinite;
}

export async function checkFiniteStage(source: Recipe['source'], dir: string, log: (m: string) => void, opts: FiniteStageOptions = {}): Promise<FiniteCheck> {
  if (source.allowNonFinite) {
    log(`NaN/Inf weight check skipped: the recipe allows non-finite weights (${source.allowNonFinite.reason})`);
    return { checked: false, reason: source.allowNonFinite.reason };
  }
  const t = performance.now();
  const ckpt = await openCheckpoint(dir);
  let files: readonly string[];
  /** Floating tensors and their bytes per file, for the totals of files whose scan was recorded. */
  const floating = new Map<string, { tensors: number; bytes: number }>();
  try {
    files = ckpt.files;
    for (const name of ckpt.names()) {
      const info = ckpt.info(name);
      if (!FLOAT_DTYPES.has(info.dtype)) continue;
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
    if (record === undefined) {
      const r = await scan([file], (scanner ??= new FiniteScanner()));
      tensors += r.tensors;
      bytes += r.bytes;
      bytesNow += r.bytes;
    } else if (record === 'ok') {
      fromDigest++;
      tensors += floating.get(file)?.tensors ?? 0;
      bytes += floating.get(file)?.bytes ?? 0;
    } else {
      log(`${file}: its NaN/Inf scan was made as the content digest read it (the file's stat is unchanged since)`);
      throw nonFiniteError(file, record);
    }
  }
  const seconds = (performance.now() - t) / 1000;
  const how = fromDigest === 0 ? '' : fromDigest === files.length ? ', all scanned as the content digest read them'
    : `, ${fromDigest} of ${files.length} files scanned as the content digest read them, ${(bytesNow / 1e9).toFixed(2)} GB now`;
  log(`no NaN/Inf in ${tensors} floating tensors (${(bytes / 1e9).toFixed(2)} GB in ${seconds.toFixed(1)} s${how})`);
  return { checked: true, tensors, bytes, seconds: Math.round(seconds * 1000) / 1000, ...(source.kind === 'local' ? { filesFromDigest: fromDigest } : {}) };
}
