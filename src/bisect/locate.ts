// forge bisect, step one: where along the chain fp32 ONNX (export) → shipped precision (quantize)
// the oracle gate's figures first leave the recipe's tolerance. The gate already compares every
// graph output and every per-layer probe (h.i, each layer's K/V rows) with HF, teacher-forced per
// graph; this module reads its result (oracle.json) and names the link that moved the numbers: the
// export when the fp32 graphs themselves fail (the graph builder disagrees with HF: no precision
// change can fix that), quantization when fp32 holds and the shipped graphs do not.
import type { OracleResult, OracleRow } from '../gates/oracle.js';

export type Link = 'export' | 'quantization';

/** The oracle's export inputs, as its rows' variant labels start (`export:fp32`, `quantize:w4`). */
export const FP32_VARIANT = 'export';
export const SHIPPED_VARIANT = 'quantize';

export interface Miss {
  link: Link;
  /** The row's variant label (`quantize:w4`). */
  variant: string;
  graph: string;
  /** The layer the output belongs to (h.i is layer i−1's residual out, new_k_i layer i's K row); null for the lm-head and the like. */
  layer: number | null;
  output: string;
  what: string;
  cosine: number;
  /** The threshold the row was held to (the recipe's, for that variant's precision). */
  threshold: number;
  /** The case with the lowest cosine, as the gate recorded it. */
  worst: string;
  nonFinite?: string;
  /** Set when the graph failed on logits' top-1 agreement rather than on a cosine. */
  top1?: string;
}

export interface LayerFigures {
  layer: number;
  /** Each variant's smallest cosine over the layer's outputs, every graph that holds the layer (teacher-forced per graph). */
  fp32?: number;
  shipped?: number;
  /** The output that gave the shipped figure, with its graph. */
  shippedWorst?: string;
}

const variantOf = (r: OracleRow) => r.variant.split(':')[0];
export const layerNumber = (r: OracleRow): number | null => (r.layer === '-' ? null : Number(r.layer));

/**
 * The first failed row of one variant in model order: the lowest layer (the lm-head and other
 * layerless outputs after every layer), a non-finite value before a low cosine at the same layer.
 * Rows are ordered by graph and output within a layer, so the same result comes every run.
 */
export function firstFailedRow(rows: OracleRow[], variant: string): OracleRow | undefined {
  const order = (r: OracleRow) => layerNumber(r) ?? Infinity;
  return rows
    .filter((r) => variantOf(r) === variant && !r.ok)
    .sort((a, b) => order(a) - order(b) || Number(!a.nonFinite) - Number(!b.nonFinite) || a.graph.localeCompare(b.graph) || a.output.localeCompare(b.output))[0];
}

/**
 * Where the chain first leaves tolerance, or undefined when every graph of both variants is within
 * it. `thresholds`: the cosine each variant was gated at (the recipe's fp32 and shipped bounds).
 */
export function locateMiss(result: OracleResult, thresholds: { fp32: number; shipped: number }): Miss | undefined {
  if (result.ok) return undefined;
  for (const [variant, link, threshold] of [[FP32_VARIANT, 'export', thresholds.fp32], [SHIPPED_VARIANT, 'quantization', thresholds.shipped]] as const) {
    const row = firstFailedRow(result.rows, variant);
    if (row) {
      return {
        link, variant: row.variant, graph: row.graph, layer: layerNumber(row), output: row.output, what: row.what, cosine: row.minCosine, threshold, worst: row.worst,
        ...(row.nonFinite ? { nonFinite: row.nonFinite } : {}),
      };
    }
    // Every row within its cosine, yet a graph failed: its logits' top-1 agreement (minTop1).
    const graph = Object.entries(result.graphs).find(([k, g]) => k.startsWith(`${variant}:`) && !g.ok);
    if (graph) {
      const [label, g] = graph;
      const slash = label.indexOf('/');
      return { link, variant: label.slice(0, slash), graph: label.slice(slash + 1), layer: null, output: 'logits', what: 'top-1 agreement', cosine: g.minCosine, threshold, worst: '', ...(g.top1 ? { top1: g.top1 } : {}) };
    }
  }
  throw new Error('the oracle gate failed, yet no row or graph of its result is marked failed: oracle.json is inconsistent');
}

/** Per layer, each variant's smallest cosine: the picture along the chain the report draws. */
export function layerFigures(rows: OracleRow[]): LayerFigures[] {
  const by = new Map<number, LayerFigures>();
  for (const r of rows) {
    const l = layerNumber(r);
    if (l === null) continue;
    const f = by.get(l) ?? { layer: l };
    const v = variantOf(r);
    if (v === FP32_VARIANT) f.fp32 = Math.min(f.fp32 ?? Infinity, r.minCosine);
    if (v === SHIPPED_VARIANT && r.minCosine < (f.shipped ?? Infinity)) {
      f.shipped = r.minCosine;
      f.shippedWorst = `${r.graph} ${r.output}`;
    }
    by.set(l, f);
  }
  return [...by.values()].sort((a, b) => a.layer - b.layer);
}

/** The shipped variant's smallest cosine over every row (a trial fix's headline figure). */
export function shippedFloor(rows: OracleRow[]): number {
  return Math.min(...rows.filter((r) => variantOf(r) === SHIPPED_VARIANT).map((r) => (r.nonFinite ? -1 : r.minCosine)));
}
