// How an output is compared with the oracle: cosine similarity and max abs error over the entries
// the oracle defines (NaN marks padding rows that are not compared), and top-1 agreement of logits
// row by row.
import { parseStateOutput } from '../families/state-io.js';

export interface Comparison {
  cosine: number;
  maxAbs: number;
}

export function compare(actual: ArrayLike<number>, expected: ArrayLike<number>): Comparison {
  if (actual.length !== expected.length) throw new Error(`length ${actual.length} vs oracle ${expected.length}`);
  let dot = 0, na = 0, nb = 0, maxAbs = 0;
  for (let i = 0; i < expected.length; i++) {
    const b = expected[i];
    if (Number.isNaN(b)) continue;
    const a = actual[i];
    dot += a * b;
    na += a * a;
    nb += b * b;
    const d = Math.abs(a - b);
    if (!(d <= maxAbs)) maxAbs = d; // NaN in `actual` propagates as a failure
  }
  const cosine = na === 0 && nb === 0 ? 1 : dot / Math.sqrt(na * nb);
  return { cosine: Number.isNaN(cosine) ? -1 : cosine, maxAbs };
}

/** For logits [rows, vocab]: how many compared rows have the same argmax. */
export function top1(actual: ArrayLike<number>, expected: ArrayLike<number>, vocab: number): { agree: number; rows: number } {
  let agree = 0, rows = 0;
  for (let r = 0; r * vocab < expected.length; r++) {
    if (Number.isNaN(expected[r * vocab])) continue;
    rows++;
    let ia = 0, ib = 0;
    for (let i = 1; i < vocab; i++) {
      if (actual[r * vocab + i] > actual[r * vocab + ia]) ia = i;
      if (expected[r * vocab + i] > expected[r * vocab + ib]) ib = i;
    }
    if (ia === ib) agree++;
  }
  return { agree, rows };
}

/** Which layer a graph output (new_k_3, new_rec_state_3, hidden_out) or probe (h.4) belongs to, for the per-layer table. */
export function layerOf(name: string, last?: number): { layer: string; what: string } {
  const io = parseStateOutput(name);
  if (io) return { layer: String(io.layer), what: io.kind === 'conv' ? 'conv state' : io.kind === 'rec' ? 'recurrent state' : `${io.kind} cache row` };
  const m = /^h\.(\d+)$/.exec(name);
  if (m) return { layer: String(Number(m[1]) - 1), what: 'residual out' };
  if (name === 'hidden_out') return { layer: last !== undefined ? String(last) : '-', what: 'shard output' };
  return { layer: '-', what: name };
}

export interface OutputTally {
  minCosine: number;
  maxAbs: number;
  /** The case with the lowest cosine. */
  worst: string;
}

/** A gate's comparisons over its teacher-forced cases: per output the worst cosine (and where), the largest error, and logits top-1. */
export class GateTally {
  readonly outputs = new Map<string, OutputTally>();
  readonly top1 = { agree: 0, rows: 0 };

  constructor(private readonly vocab: number) {}

  add(name: string, actual: ArrayLike<number>, expected: ArrayLike<number>, where: string): void {
    const r = compare(actual, expected);
    const a = this.outputs.get(name) ?? { minCosine: Infinity, maxAbs: 0, worst: '' };
    if (r.cosine < a.minCosine) {
      a.minCosine = r.cosine;
      a.worst = where;
    }
    a.maxAbs = Math.max(a.maxAbs, r.maxAbs);
    this.outputs.set(name, a);
    if (name === 'logits') {
      const t = top1(actual, expected, this.vocab);
      this.top1.agree += t.agree;
      this.top1.rows += t.rows;
    }
  }
}
