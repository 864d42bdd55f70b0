// How an output is compared with the oracle: cosine similarity and max abs error over the compared
// entries, and top-1 agreement of logits row by row. Which entries are compared is explicit (a mask
// carried with the case, for the padding rows of a short prefill chunk); every compared entry must be
// finite on both sides, and a non-finite one is a failure of its own, never skipped or averaged away.
import { parseStateOutput } from '../families/state-io.js';

/** Non-finite (NaN, ±Inf) entries on one side of a comparison: how many and the first flat index. */
export interface NonFinite {
  count: number;
  first: number;
}

export interface Comparison {
  /** -1 when a compared entry is non-finite (the cosine would be meaningless). */
  cosine: number;
  maxAbs: number;
  /** Set when a compared entry is non-finite in forge's output (`forge`) or in the oracle (`oracle`). */
  nonFinite?: { forge?: NonFinite; oracle?: NonFinite };
}

/** `mask[i] !== 0` marks entry i as compared; without a mask every entry is. */
export type CompareMask = Uint8Array;

function note(nf: NonFinite | undefined, i: number): NonFinite {
  if (!nf) return { count: 1, first: i };
  nf.count++;
  return nf;
}

export function compare(actual: ArrayLike<number>, expected: ArrayLike<number>, mask?: CompareMask): Comparison {
  if (actual.length !== expected.length) throw new Error(`length ${actual.length} vs oracle ${expected.length}`);
  if (mask && mask.length !== expected.length) throw new Error(`compare mask of ${mask.length} entries for ${expected.length} values`);
  let dot = 0, na = 0, nb = 0, maxAbs = 0;
  let forge: NonFinite | undefined, oracle: NonFinite | undefined;
  for (let i = 0; i < expected.length; i++) {
    if (mask && mask[i] === 0) continue;
    const a = actual[i], b = expected[i];
    // a - a is 0 for finite a, NaN for NaN and ±Inf: one test covers both.
    if (a - a !== 0) forge = note(forge, i);
    if (b - b !== 0) oracle = note(oracle, i);
    dot += a * b;
    na += a * a;
    nb += b * b;
    const d = Math.abs(a - b);
    if (d > maxAbs) maxAbs = d;
  }
  if (forge || oracle) return { cosine: -1, maxAbs: Infinity, nonFinite: { ...(forge ? { forge } : {}), ...(oracle ? { oracle } : {}) } };
  const cosine = na === 0 && nb === 0 ? 1 : dot / Math.sqrt(na * nb);
  return { cosine: Number.isFinite(cosine) ? cosine : -1, maxAbs };
}

/** "4 non-finite values in forge's output (first at index 17)", both sides when both have some. */
export function describeNonFinite(nf: NonNullable<Comparison['nonFinite']>): string {
  const one = (n: NonFinite, side: string) => `${n.count} non-finite value${n.count === 1 ? '' : 's'} in ${side} (first at index ${n.first})`;
  return [nf.forge && one(nf.forge, "forge's output"), nf.oracle && one(nf.oracle, 'the oracle')].filter(Boolean).join('; ');
}

/**
 * For logits [rows, vocab]: how many compared rows (mask at the row's first entry) have the same
 * argmax. A row with a non-finite logit on either side never agrees (its argmax means nothing).
 */
export function top1(actual: ArrayLike<number>, expected: ArrayLike<number>, vocab: number, mask?: CompareMask): { agree: number; rows: number } {
  let agree = 0, rows = 0;
  for (let r = 0; r * vocab < expected.length; r++) {
    const o = r * vocab;
    if (mask && mask[o] === 0) continue;
    rows++;
    let ia = 0, ib = 0, finite = true;
    for (let i = 0; i < vocab; i++) {
      const a = actual[o + i], b = expected[o + i];
      if (a - a !== 0 || b - b !== 0) { finite = false; break; }
      if (a > actual[o + ia]) ia = i;
      if (b > expected[o + ib]) ib = i;
    }
    if (finite && ia === ib) agree++;
  }
  return { agree, rows };
}

/**
 * Which layer a graph output (new_k_3, new_rec_state_3 → 'rec state', hidden_out) or probe (h.4) belongs to, for the per-layer table;
 * `own`: the layer of a one-layer graph (first = last), which its other outputs belong to.
 */
export function layerOf(name: string, last?: number, own?: number): { layer: string; what: string } {
  const io = parseStateOutput(name);
  if (io) return { layer: String(io.layer), what: io.recurrent ? `${io.kind} state` : `${io.kind} cache row` };
  const m = /^h\.(\d+)$/.exec(name);
  if (m) return { layer: String(Number(m[1]) - 1), what: 'residual out' };
  if (name === 'hidden_out') return { layer: last !== undefined ? String(last) : '-', what: 'shard output' };
  // A one-layer graph's other outputs (PhiMoE's attn_res, moe_in, router_logits) are its layer's.
  return { layer: own !== undefined ? String(own) : '-', what: name };
}

export interface OutputTally {
  minCosine: number;
  maxAbs: number;
  /** The case with the lowest cosine. */
  worst: string;
  /** The first case with a non-finite value on either side, and what was found: a failure whatever the cosine. */
  nonFinite?: string;
}

/** A gate's comparisons over its teacher-forced cases: per output the worst cosine (and where), the largest error, and logits top-1. */
export class GateTally {
  readonly outputs = new Map<string, OutputTally>();
  readonly top1 = { agree: 0, rows: 0 };

  constructor(private readonly vocab: number) {}

  /** `top1`: whether these logits count in top-1 (not where they predict a placeholder: GateCase.placeholder). */
  add(name: string, actual: ArrayLike<number>, expected: ArrayLike<number>, where: string, mask?: CompareMask, countTop1 = true): void {
    const r = compare(actual, expected, mask);
    const a: OutputTally = this.outputs.get(name) ?? { minCosine: Infinity, maxAbs: 0, worst: '' };
    if (r.nonFinite && !a.nonFinite) a.nonFinite = `${where} output ${name}: ${describeNonFinite(r.nonFinite)}`;
    if (r.cosine < a.minCosine) {
      a.minCosine = r.cosine;
      a.worst = where;
    }
    a.maxAbs = Math.max(a.maxAbs, r.maxAbs);
    this.outputs.set(name, a);
    if (name === 'logits' && countTop1) {
      const t = top1(actual, expected, this.vocab, mask);
      this.top1.agree += t.agree;
      this.top1.rows += t.rows;
    }
  }
}
