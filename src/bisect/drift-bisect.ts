// forge bisect, when every teacher-forced gate holds: does the shipped chain still leave HF's greedy
// continuation (drift.ts)? If it does: the first divergent token, both tokens' margins along the
// way, the layers whose errors move the logit difference most, and a fix — the top layer's matrices
// one precision up, rebuilt through the oracle gate and the chain scanned again.
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { modelTensors } from '../families/tensors.js';
import { openCheckpoint } from '../io/checkpoint.js';
import type { FamilyId, PrecisionOverride, QuantScheme } from '../recipe/schema.js';
import { runExport } from '../export/stage.js';
import { perLayerPlan, type AloneParams } from './alone.js';
import type { PrecisionMap } from '../quant/precision.js';
import { scanDrift, type AttributionStep, type DriftResult } from './drift.js';
import { candidates, type Trial } from './fixes.js';
import { familyConfig } from './family-config.js';

export interface DriftContext {
  family: string;
  checkpointDir: string;
  traceDir: string;
  quantizeDir: string;
  scheme: QuantScheme;
  overrides: PrecisionOverride[];
  precision?: PrecisionMap;
  /**
   * Rebuilds through the oracle with the override lines first; the quantize dir and whether the gate
   * held. A rebuild that judges the fix itself (the runtime link: through the parity gate) says so in
   * `holds` (and `stillFails`); otherwise the shipped chain is scanned again.
   */
  rebuild: (overrides: PrecisionOverride[]) => Promise<{ quantizeDir?: string; oracleOk: boolean; error?: string; holds?: boolean; stillFails?: string }>;
  log: (m: string) => void;
}

/** The names drift's attribution reads: the final norm's weight, the lm-head rows (a tied model's embedding), ε. */
async function lmNames(checkpointDir: string): Promise<{ finalNorm: string; lmHead: string; eps: number }> {
  const cfg = JSON.parse(readFileSync(join(checkpointDir, 'config.json'), 'utf8')) as { rms_norm_eps?: number; text_config?: { rms_norm_eps?: number } };
  const ck = await openCheckpoint(checkpointDir);
  try {
    const names = new Set(ck.names());
    const pick = (xs: string[]) => xs.find((x) => names.has(x));
    const finalNorm = pick(['model.norm.weight', 'model.language_model.norm.weight']);
    const lmHead = pick(['lm_head.weight', 'model.embed_tokens.weight', 'model.language_model.embed_tokens.weight']);
    if (!finalNorm || !lmHead) throw new Error(`${checkpointDir}: no final norm or lm-head weight under the names drift reads`);
    return { finalNorm, lmHead, eps: cfg.rms_norm_eps ?? cfg.text_config?.rms_norm_eps ?? 1e-6 };
  } finally {
    await ck.close();
  }
}

/**
 * The drift scan of a shipped export; with `alone` (the shipped precision), a divergence is also
 * weighed layer by layer alone: each layer exported as its own graph (alone.ts's plan), fed HF's inputs.
 */
export async function scanShipped(familyId: string, checkpointDir: string, traceDir: string, quantizeDir: string, alone?: Omit<AloneParams, 'family' | 'minTop1'>, at?: AttributionStep): Promise<DriftResult> {
  const { family, config } = familyConfig(familyId, checkpointDir);
  const names = await lmNames(checkpointDir);
  const scratch = mkdtempSync(join(tmpdir(), 'forge-bisect-drift-'));
  const first = await scanDrift(family, config, checkpointDir, traceDir, quantizeDir, join(scratch, 'chain'), { ...names, ...(at ? { at } : {}) });
  if (!(first.first || first.attributedAt) || !alone) {
    rmSync(scratch, { recursive: true, force: true });
    return first;
  }
  try {
    const dir = join(scratch, 'alone');
    mkdirSync(dir, { recursive: true });
    await runExport({ family: familyId as FamilyId, scheme: alone.scheme, lmHeadScheme: alone.lmHeadScheme, maxContext: alone.maxContext, prefillLength: 0, hostTables: false, overrides: alone.overrides },
      checkpointDir, perLayerPlan(family.numLayers(config)), dir, { log: () => {}, progress: () => {} }, alone.precision);
    return await scanDrift(family, config, checkpointDir, traceDir, quantizeDir, join(scratch, 'chain2'), { ...names, alone: dir, ...(at ? { at } : {}) });
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

const f = (x: number) => x.toFixed(4);

export function driftMessage(d: DriftResult): string {
  const s = d.first!;
  const top = d.layers!.slice(0, 2).map((l) => `layer ${l.layer} (${l.contribution > 0 ? '+' : ''}${f(l.contribution)}${l.carried !== undefined ? ` alone, ${f(l.carried)} along the chain` : ''})`).join(', ');
  return `free-running drift: every teacher-forced gate holds, yet the shipped chain leaves HF's greedy continuation at prompt ${s.prompt} step ${s.step}: HF picks ${s.hf.token} by a margin of ${f(s.hf.margin)} over ${s.hf.runnerUp}, the shipped chain picks ${s.shippedToken} (its margin for HF's token ${f(s.shippedMargin)}); logit[${s.hf.token}] − logit[${s.shippedToken}] moved ${f(d.logitDelta!.actual)}, the layers' errors through the lm-head ${f(d.logitDelta!.attributed)}: most from ${top}`;
}

/** The fix search: the layer contributing most (by size, pushing away from HF's token) gets its matrices one rung up. */
export async function driftFixes(c: DriftContext, d: DriftResult): Promise<Trial[]> {
  const { family, config } = familyConfig(c.family, c.checkpointDir);
  const tensors = (await modelTensors(family, config)).layers;
  const against = d.layers!.filter((l) => l.contribution < 0);
  const layer = (against[0] ?? d.layers![0]).layer;
  const at = d.attributedAt ?? d.first!;
  const { single, whole } = candidates(layer, tensors[layer], c.scheme, c.overrides, c.precision, `the greedy ${d.attributedAt ? 'runtime' : 'chain'} flips at prompt ${at.prompt} step ${at.step}`,
    d.attributedAt ? 'the parity gate (the runtime follows HF)' : "HF's greedy continuation (the chained shipped graphs follow it)");
  const trials: Trial[] = [];
  // The whole layer first (one rebuild answers whether precision fixes it at all), then single matrices while they are cheaper.
  for (const cand of [whole, ...single].filter((x): x is NonNullable<typeof x> => !!x)) {
    const t = performance.now();
    const r = await c.rebuild(cand.overrides);
    let ok = false, stillFails: string | undefined;
    if (!r.oracleOk || !r.quantizeDir) stillFails = r.error ?? 'the oracle gate';
    else if (r.holds !== undefined) {
      ok = r.holds;
      if (!ok) stillFails = r.stillFails ?? 'the parity gate';
    } else {
      const again = await scanShipped(c.family, c.checkpointDir, c.traceDir, r.quantizeDir);
      ok = !again.first;
      if (again.first) stillFails = `flips at prompt ${again.first.prompt} step ${again.first.step}`;
    }
    const trial: Trial = { ...cand, ok, seconds: (performance.now() - t) / 1000, ...(stillFails ? { stillFails } : {}) };
    c.log(`  ${cand.label}: ${ok ? `the ${r.holds !== undefined ? 'runtime' : 'chain'} follows HF` : `still ${r.holds !== undefined ? 'leaves HF' : 'drifts'} (${stillFails})`}, +${cand.addedBytes} bytes, ${trial.seconds.toFixed(1)} s`);
    trials.push(trial);
    if (trial === trials[0] && !ok) break; // the whole layer does not fix it: no single matrix will
    if (trials.length >= 3) break;
  }
  return trials;
}
