// fetch's non-finite weight check, with the recipe's way out: `source.allowNonFinite.reason` skips
// the scan, and what happened (checked, or skipped and why) goes into the run record and the card.
import { openCheckpoint } from '../io/checkpoint.js';
import { checkFinite } from '../io/finite.js';
import type { Recipe } from '../recipe/schema.js';

export type FiniteCheck = { checked: true; tensors: number; bytes: number; seconds: number } | { checked: false; reason: string };

export async function checkFiniteStage(source: Recipe['source'], dir: string, log: (m: string) => void): Promise<FiniteCheck> {
  if (source.allowNonFinite) {
    log(`NaN/Inf weight check skipped: the recipe allows non-finite weights (${source.allowNonFinite.reason})`);
    return { checked: false, reason: source.allowNonFinite.reason };
  }
  const t = performance.now();
  const ckpt = await openCheckpoint(dir);
  let files: readonly string[];
  try {
    files = ckpt.files;
  } finally {
    await ckpt.close();
  }
  const scan = await checkFinite(files);
  const seconds = (performance.now() - t) / 1000;
  log(`no NaN/Inf in ${scan.tensors} floating tensors (${(scan.bytes / 1e9).toFixed(2)} GB in ${seconds.toFixed(1)} s)`);
  return { checked: true, ...scan, seconds: Math.round(seconds * 1000) / 1000 };
}
