// forge bisect: the fix search. For the layer found, each matmul weight is tried alone at the next
// precision up (w4 → w8, w8 → fp16, fp16 → fp32) as a recipe override, rebuilt through the oracle gate with the
// normal cached stages (only the stages the overrides reach re-run) and re-gated; when no single
// matrix restores the gate, the whole layer one step up. The fixes that restore it are ranked by the
// bytes they add (quant/bytes.ts, the plan's own count).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Equalize, PrecisionOverride, QuantScheme, Rescale } from '../recipe/schema.js';
import type { TensorSpec } from '../families/types.js';
import { storedBytes } from '../quant/bytes.js';
import { PrecisionChooser, type PrecisionMap } from '../quant/precision.js';
import type { OracleResult } from '../gates/oracle.js';
import { firstFailedRow, shippedFloor, SHIPPED_VARIANT } from './locate.js';

/**
 * The precision a matrix is tried at next: one rung up (the `auto` stage climbs w4 → w8; fp16 → fp32
 * is for a weight fp16 cannot hold: past 65504 it is Inf, under 6e-8 it is gone, where bf16 keeps both).
 */
export const NEXT: Partial<Record<QuantScheme, QuantScheme>> = { w4: 'w8', w8: 'fp16', fp16: 'fp32' };

export interface Candidate {
  /** `layer 2 mlp.down_proj`, or `layer 2 (7 matrices)` for the whole layer, or `lm-head lm_head w4→w8`. */
  label: string;
  /** The layer whose matrices it moves; absent for the lm-head. */
  layer?: number;
  tensors: Array<{ name: string; from: QuantScheme; to: QuantScheme }>;
  /** The override lines that make it (per rung: one pattern, the tensor names escaped and alternated). */
  overrides: PrecisionOverride[];
  /** Weight bytes it adds to the shipped graphs (storedBytes at the new precision less at the old). */
  addedBytes: number;
  /** An fp16 fix: exact op rescalings (recipe `rescale` lines) instead of precision pins. */
  rescale?: Rescale[];
  /** An expert fix: its channels rebalanced in the host tables (recipe `equalize` lines); no bytes or ops move. */
  equalize?: Equalize[];
  /** Ops the rescale adds to the graphs (its cost; weight bytes do not move). */
  addedOps?: number;
  /** A rescale pair's rewrite in words (`v_proj ÷ 2^4, o_proj × 2^4; …`), said beside the line. */
  what?: string;
  /** A hand-off fix: the recipe's residual hand-off dtype for the arch (`handoff: f32`) instead of precision pins. */
  handoff?: 'f32';
  /** Bytes it adds to the residual hand-offs per token (2 × hidden per hand-off going f16 → float32; weight bytes do not move). */
  handoffBytesPerToken?: number;
}

export interface Trial extends Candidate {
  /** The oracle gate with the override: passed or not. */
  ok: boolean;
  /** The shipped graphs' smallest cosine over every output (−1: a non-finite value). */
  minCosine?: number;
  /** Where the gate was still left, when it was. */
  stillFails?: string;
  /** The build's error when it failed before the gate gave a verdict. */
  error?: string;
  seconds: number;
}

const escapeRe = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
/** A name inside a layer, without its `model.layers.N.` prefix and `.weight`: `mlp.down_proj`. */
export const shortName = (name: string, layer: number) => name.replace(new RegExp(`^.*?layers\\.${layer}\\.`), '').replace(/\.weight$/, '');

/**
 * The candidates for `layer`: each movable matmul weight alone, then the whole layer. A matrix's
 * precision now is what the shipped export gave it (the recipe's overrides, then auto's map, then
 * the scheme); one already at fp32 has no rung up and is left out. `without`: what the gate
 * saw before, and `restores`: what judges the fix, for the lines' `why` (written as gated, so
 * --apply's recipe rebuilds from the cache).
 */
export function candidates(layer: number, tensors: TensorSpec[], scheme: QuantScheme, overrides: PrecisionOverride[], map?: PrecisionMap, without = '', restores = 'the oracle gate'): { single: Candidate[]; whole?: Candidate } {
  const moves = rungUp(tensors, scheme, overrides, map);
  const make = (label: string, ms: Move[]) => candidateOf(label, layer, ms, without, restores);
  const single = moves.map((m) => make(`layer ${layer} ${shortName(m.t.name, layer)} ${m.from}→${m.to}`, [m]));
  return { single, ...(moves.length > 1 ? { whole: make(`layer ${layer} whole (${moves.length} matrices)`, moves) } : {}) };
}

/**
 * Several layers' whole matrices together, `rungs` steps up from where each ships (each matrix at most
 * to fp32): the fix when more than one layer does damage (a gate left by two layers cannot pass while
 * either is left as it was). `layers` with the tensors each reads.
 */
export function together(layers: Array<{ layer: number; tensors: TensorSpec[] }>, scheme: QuantScheme, overrides: PrecisionOverride[], map?: PrecisionMap, without = '', rungs = 1, restores = 'the oracle gate'): Candidate | undefined {
  const moves = layers.flatMap((l) => rungUp(l.tensors, scheme, overrides, map, rungs));
  if (!moves.length || layers.length < 2) return undefined;
  const names = layers.map((l) => l.layer);
  const list = `${names.slice(0, -1).join(', ')} and ${names[names.length - 1]}`;
  return candidateOf(`layers ${list} whole (${moves.length} matrices)${rungs > 1 ? `, ${rungs} rungs up` : ''}`, undefined, moves, without, restores);
}

/** Named matrices of several layers together, one rung up each (each faulty layer's worst matrix, from its op probe). */
export function matricesTogether(picks: Array<{ layer: number; tensor: TensorSpec }>, scheme: QuantScheme, overrides: PrecisionOverride[], map?: PrecisionMap, without = '', restores = 'the oracle gate'): Candidate | undefined {
  const moves = picks.flatMap((p) => rungUp([p.tensor], scheme, overrides, map).map((m) => ({ m, layer: p.layer })));
  if (moves.length < 2) return undefined;
  return candidateOf(`layers ${moves.map(({ m, layer }) => `${layer} ${shortName(m.t.name, layer)} ${m.from}→${m.to}`).join(' + ')}`, undefined, moves.map((x) => x.m), without, restores);
}

/**
 * The lm-head's candidates: each matrix it reads (its weight; a tied model's embedding) one rung up
 * from where the lm-head's scheme and the recipe's overrides put it. A fault the gate sees only in
 * the logits (every layer's probes within tolerance) is the lm-head's own.
 */
export function lmHeadCandidates(tensors: TensorSpec[], lmHeadScheme: QuantScheme, overrides: PrecisionOverride[], map?: PrecisionMap, without = ''): Candidate[] {
  return rungUp(tensors, lmHeadScheme, overrides, map).map((m) => candidateOf(`lm-head ${m.t.name.replace(/\.weight$/, '')} ${m.from}→${m.to}`, undefined, [m], without, 'the oracle gate'));
}

interface Move { t: TensorSpec; from: QuantScheme; to: QuantScheme }

/** Each movable matmul weight with the precision it ships at now and the one `rungs` above it (as far as there is one). */
function rungUp(tensors: TensorSpec[], scheme: QuantScheme, overrides: PrecisionOverride[], map?: PrecisionMap, rungs = 1): Move[] {
  const chooser = new PrecisionChooser(overrides, map);
  return tensors.filter((t) => t.role === 'matmul').flatMap((t) => {
    const from = chooser.choose(t.name, scheme).scheme;
    let to: QuantScheme | undefined;
    for (let i = 0, at: QuantScheme | undefined = from; i < rungs && at && NEXT[at]; i++) to = at = NEXT[at];
    return to ? [{ t, from, to }] : [];
  });
}

function candidateOf(label: string, layer: number | undefined, ms: Move[], without: string, restores: string): Candidate {
  // One quant per override line: matrices bound for different rungs (a whole layer whose matrices
  // stand on different ones) get a line per rung, each matrix one step up from where it is.
  const rungs = ms.map((m) => m.to).filter((x, i, a) => a.indexOf(x) === i);
  return {
    label, ...(layer !== undefined ? { layer } : {}),
    tensors: ms.map((m) => ({ name: m.t.name, from: m.from, to: m.to })),
    overrides: rungs.map((to) => ({ match: ms.filter((m) => m.to === to).map((m) => escapeRe(m.t.name)).join('|'), quant: to, why: `forge bisect: ${label} restores ${restores}${without ? ` (${without} without it)` : ''}` })),
    addedBytes: ms.reduce((a, m) => a + storedBytes(m.t, m.to) - storedBytes(m.t, m.from), 0),
  };
}

/** What one trial build's oracle result says about a candidate. */
export function judge(c: Candidate, result: OracleResult, seconds: number): Trial {
  const miss = firstFailedRow(result.rows, SHIPPED_VARIANT) ?? firstFailedRow(result.rows, 'export');
  const still = miss ? `${miss.variant} ${miss.graph} layer ${miss.layer} ${miss.output} ${miss.minCosine.toFixed(5)}` : 'a graph failed on logits top-1';
  return { ...c, ok: result.ok, minCosine: shippedFloor(result.rows), seconds, ...(result.ok ? {} : { stillFails: still }) };
}

/** The restoring trials, cheapest first (added weight bytes, then ops, then hand-off bytes per token, then the higher cosine, then the label). */
export function rank(trials: Trial[]): Trial[] {
  return trials.filter((t) => t.ok).sort((a, b) => a.addedBytes - b.addedBytes || (a.addedOps ?? 0) - (b.addedOps ?? 0) || (a.handoffBytesPerToken ?? 0) - (b.handoffBytesPerToken ?? 0)
    || (b.minCosine ?? -1) - (a.minCosine ?? -1) || a.label.localeCompare(b.label));
}

/** A cached stage's output directory, from a run record's stage list. */
export function stageDir(cache: string, stages: Array<{ name: string; key?: string }>, name: string): string | undefined {
  const key = stages.find((s) => s.name === name)?.key;
  return key ? join(cache, name, key) : undefined;
}

export const readJson = <T>(file: string): T => JSON.parse(readFileSync(file, 'utf8')) as T;
