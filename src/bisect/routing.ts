// forge bisect on a family that routes on the host (PhiMoE): when the runtime leaves HF and its
// graphs hand no residual from one to the next (so no layer can be weighed through the lm-head), the
// oracle's chain says where the shipped router picks other experts than HF's. A flip at the divergent
// step, or before it in the same prompt, is the likely cause; the fix tried is that layer's router
// one precision up, then the whole layer, each rebuilt through the parity gate (the runtime itself).
import { performance } from 'node:perf_hooks';
import { modelTensors } from '../families/tensors.js';
import type { RoutingFlip, RoutingTally } from '../families/types.js';
import type { PrecisionOverride, QuantScheme } from '../recipe/schema.js';
import type { PrecisionMap } from '../quant/precision.js';
import { familyConfig } from './family-config.js';
import { candidates, type Candidate, type Trial } from './fixes.js';
import { flipText } from '../gates/oracle.js';

/** The router's weight in a layer (phimoe.ts: `block_sparse_moe.gate`). */
const ROUTER = /\.block_sparse_moe\.gate\.weight$/;

/**
 * The flips that can explain a runtime divergence at `at` (a prompt and trace position): those of
 * that prompt at that position (they change its logits directly) first, then earlier ones, latest
 * first (they change the KV rows every later step reads).
 */
export function flipsBefore(tally: RoutingTally | undefined, at: { prompt: number; position: number }): RoutingFlip[] {
  return (tally?.flips ?? []).filter((f) => f.prompt === at.prompt && f.step <= at.position)
    .sort((a, b) => b.step - a.step || a.layer - b.layer);
}

export interface RoutingFixContext {
  family: string;
  checkpointDir: string;
  scheme: QuantScheme;
  overrides: PrecisionOverride[];
  precision?: PrecisionMap;
  /** Rebuilds through the parity gate with the override lines first: whether the runtime then holds. */
  rebuild: (overrides: PrecisionOverride[]) => Promise<{ oracleOk: boolean; error?: string; holds?: boolean; stillFails?: string }>;
  log: (m: string) => void;
}

/** The candidates for a flipped layer: its router one rung up, then the whole layer (the router reads what its attention gives). */
export function routingCandidates(layer: number, tensors: Parameters<typeof candidates>[1], c: Pick<RoutingFixContext, 'scheme' | 'overrides' | 'precision'>, flip: RoutingFlip): Candidate[] {
  const { single, whole } = candidates(layer, tensors, c.scheme, c.overrides, c.precision, `the router flips at ${flipText(flip)}`, 'the parity gate (the runtime follows HF)');
  return [...single.filter((s) => s.tensors.every((t) => ROUTER.test(t.name))), ...(whole ? [whole] : [])];
}

/** Tries the flipped layer's candidates through the parity gate, cheapest first; stops at the first that holds. */
export async function routingFixes(c: RoutingFixContext, flip: RoutingFlip): Promise<Trial[]> {
  const { family, config } = familyConfig(c.family, c.checkpointDir);
  const tensors = (await modelTensors(family, config)).layers[flip.layer];
  const trials: Trial[] = [];
  for (const cand of routingCandidates(flip.layer, tensors, c, flip)) {
    const t = performance.now();
    const r = await c.rebuild(cand.overrides);
    const ok = r.oracleOk && r.holds === true;
    const stillFails = ok ? undefined : !r.oracleOk ? r.error ?? 'the oracle gate' : r.stillFails ?? 'the parity gate';
    const trial: Trial = { ...cand, ok, seconds: (performance.now() - t) / 1000, ...(stillFails ? { stillFails } : {}) };
    c.log(`  ${cand.label}: ${ok ? 'the runtime follows HF' : `still leaves HF (${stillFails})`}, +${cand.addedBytes} bytes, ${trial.seconds.toFixed(1)} s`);
    trials.push(trial);
    if (ok) break;
  }
  return trials;
}
