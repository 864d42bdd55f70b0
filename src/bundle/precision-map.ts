// The precision map, per layer: which matrix got which precision and why, from what the shipped
// export stored (graphs.json `matrices`) and, under quant 'auto', what the precision stage measured
// (precision.json). The card, the report and the run record show it; the manifest lists the
// matrices per context (the runtime does not read it).
import type { ExportManifest } from '../export/graphs.js';
import type { MatrixEntry } from '../quant/weights.js';
import type { PrecisionResult } from '../quant/auto.js';

export interface PrecisionRow {
  /** `3` for model.layers.3.*, `-` for the matrices outside the layers (the lm-head). */
  layer: string;
  /** Matrices per precision, e.g. { w4: 5, w8: 2 }. */
  counts: Record<string, number>;
  /** Why any of them is not in the scheme asked for (distinct reasons). */
  why: string[];
  /** Under auto: the layer alone at w4, and in its chosen precision (smallest cosine of its graph). */
  w4Cosine?: number;
  cosine?: number;
}

/** The layer a tensor belongs to, from the layer index in its name (`….layers.12.…`). */
export function tensorLayer(name: string): number | undefined {
  const m = /\.layers\.(\d+)\./.exec(name);
  return m ? Number(m[1]) : undefined;
}

export function exportMatrices(exp: ExportManifest): MatrixEntry[] {
  const seen = new Set<string>();
  return exp.contexts.flatMap((c) => c.matrices ?? []).filter((m) => !seen.has(m.tensor) && seen.add(m.tensor));
}

export function precisionRows(matrices: MatrixEntry[], auto?: Pick<PrecisionResult, 'layers' | 'lmHead'>): PrecisionRow[] {
  const rows = new Map<string, PrecisionRow>();
  for (const m of matrices) {
    const l = tensorLayer(m.tensor);
    const key = l === undefined ? '-' : String(l);
    const row = rows.get(key) ?? { layer: key, counts: {}, why: [] };
    row.counts[m.scheme] = (row.counts[m.scheme] ?? 0) + 1;
    if (m.why && !row.why.includes(m.why)) row.why.push(m.why);
    rows.set(key, row);
  }
  for (const a of auto?.layers ?? []) {
    const row = rows.get(String(a.layer));
    if (row) Object.assign(row, { w4Cosine: a.w4Cosine, cosine: a.cosine });
  }
  const head = rows.get('-');
  if (head && auto?.lmHead) Object.assign(head, { w4Cosine: auto.lmHead.w4Cosine, cosine: auto.lmHead.cosine });
  const order = (r: PrecisionRow) => (r.layer === '-' ? Infinity : Number(r.layer));
  return [...rows.values()].sort((a, b) => order(a) - order(b));
}

/** `w4 ×5, w8 ×2` */
export const countsText = (c: Record<string, number>) => Object.entries(c).map(([s, n]) => `${s} ×${n}`).join(', ');

/** Whether any matrix is stored otherwise than its graphs' scheme (the map is then worth a table). */
export const mixed = (rows: PrecisionRow[]) => rows.some((r) => Object.keys(r.counts).length > 1 || r.why.length > 0);

/** The map as a Markdown table (the card; the report renders the same rows). */
export function precisionTable(rows: PrecisionRow[]): string[] {
  const auto = rows.some((r) => r.w4Cosine !== undefined);
  const head = auto ? '| layer | matrices | alone at w4 (cosine) | as shipped (cosine) | why |' : '| layer | matrices | why |';
  const lines = [head, auto ? '|---|---|---|---|---|' : '|---|---|---|'];
  for (const r of rows) {
    const layer = r.layer === '-' ? 'lm-head' : r.layer;
    const why = r.why.join('; ') || '-';
    lines.push(auto ? `| ${layer} | ${countsText(r.counts)} | ${r.w4Cosine?.toFixed(5) ?? '-'} | ${r.cosine?.toFixed(5) ?? '-'} | ${why} |` : `| ${layer} | ${countsText(r.counts)} | ${why} |`);
  }
  return lines;
}
