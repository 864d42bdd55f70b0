// forge bisect: each layer's own loss at the shipped precision. The oracle gate feeds HF's inputs
// at the start of each graph, so a probe deep in a shard carries every earlier layer's error too:
// on the W4-hostile tiny-qwen3 twin the gate is first left at layer 3's K row (0.8406 < 0.85) while
// the layer that does the damage is 2 (its residual drops from 0.953 to 0.882). As the `auto`
// stage does (quant/auto.ts), every layer is exported as a graph of its own and gated alone, fed HF's
// inputs: its cosine is what that layer alone loses, which is what a precision change can win back.
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { FamilyId, PrecisionOverride, QuantScheme } from '../recipe/schema.js';
import type { ExportPlan } from '../export/graphs.js';
import { runExport } from '../export/stage.js';
import { runOracleGate } from '../gates/oracle.js';
import type { PrecisionMap } from '../quant/precision.js';
import { familyConfig } from './family-config.js';

export interface AloneParams {
  family: FamilyId;
  scheme: QuantScheme;
  lmHeadScheme: QuantScheme;
  maxContext: number;
  overrides: PrecisionOverride[];
  /** quant 'auto': the precision stage's map, which the shipped graphs were exported with. */
  precision?: PrecisionMap;
  minTop1: number;
}

/** Per layer, the smallest cosine of its one-layer graph (every output, every traced decode step), and a non-finite value if any. */
export interface AloneFigure {
  layer: number;
  cosine: number;
  nonFinite?: string;
}

/** One layer per graph, the lm-head alone (quant/auto.ts's plan). */
export const perLayerPlan = (n: number): ExportPlan => ({ shards: Array.from({ length: n }, (_, i) => ({ first: i, last: i })), lmHead: { placement: 'separate' } });

/**
 * Exports every layer alone in the shipped precision (decode graphs only: prefillLength 0, as
 * auto does) under `work`, gates each against the trace and removes the files.
 */
export async function layersAlone(p: AloneParams, checkpointDir: string, traceDir: string, work: string): Promise<AloneFigure[]> {
  const { family, config } = familyConfig(p.family, checkpointDir);
  const n = family.numLayers(config);
  const dir = join(work, 'alone');
  mkdirSync(dir, { recursive: true });
  try {
    await runExport({ family: p.family, scheme: p.scheme, lmHeadScheme: p.lmHeadScheme, maxContext: p.maxContext, prefillLength: 0, hostTables: false, overrides: p.overrides },
      checkpointDir, perLayerPlan(n), dir, { log: () => {}, progress: () => {} }, p.precision);
    // The threshold does not matter here (the figures are compared with each other); 0 keeps the gate quiet.
    const r = await runOracleGate(p.family, checkpointDir, traceDir, [{ label: 'alone', dir, minCosine: 0 }], p.minTop1, join(work, 'scratch'));
    const figures: AloneFigure[] = Array.from({ length: n }, (_, layer) => ({ layer, cosine: Infinity }));
    // Every row the gate gave a layer: a one-layer graph's outputs are its layer's, a graph every layer
    // shares (PhiMoE's experts) has a row per layer it served; the lm-head's rows have none.
    for (const x of r.rows) {
      if (x.layer === '-') continue;
      const f = figures[Number(x.layer)];
      f.cosine = Math.min(f.cosine, x.minCosine);
      if (x.nonFinite && !f.nonFinite) f.nonFinite = x.nonFinite;
    }
    return figures;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
