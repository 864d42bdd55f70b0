// forge bisect, when the oracle gate is first left at the logits while every layer's outputs (the
// residual probes h.i, the K/V rows) hold: the lm-head's own matrices. Each is tried one rung up
// (w4 → w8 → fp16 → fp32) as a recipe override, rebuilt through the oracle gate and judged, as the
// layers' matrices are (fixes.ts).
import { join } from 'node:path';
import { headTensors } from '../families/tensors.js';
import type { PrecisionOverride, QuantScheme } from '../recipe/schema.js';
import type { PrecisionMap } from '../quant/precision.js';
import { lmHeadCandidates, type Candidate, type Trial } from './fixes.js';
import { familyConfig } from './family-config.js';

export interface LmHeadSearch {
  family: string;
  checkpointDir: string;
  lmHeadScheme: QuantScheme;
  overrides: PrecisionOverride[];
  precision?: PrecisionMap;
  /** What the gate saw without a fix (for the override's `why`). */
  why: string;
  log: (m: string) => void;
  /** Rebuilds with the candidate and judges it (run.ts's trial, recorded in the result). */
  tryOne: (c: Candidate) => Promise<Trial>;
}

/** Tries every lm-head candidate; false when there was none to try (every matrix at fp32 already). */
export async function searchLmHead(s: LmHeadSearch): Promise<boolean> {
  const { family, config } = familyConfig(s.family, s.checkpointDir);
  const { lmHead } = await headTensors(family, config);
  const cands = lmHeadCandidates(lmHead, s.lmHeadScheme, s.overrides, s.precision, s.why);
  if (!cands.length) return false;
  s.log(`the lm-head (${cands.map((c) => c.tensors[0].name).join(', ')}): each matrix one precision up`);
  for (const c of cands) await s.tryOne(c);
  return true;
}
