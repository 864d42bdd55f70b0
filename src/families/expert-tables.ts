// Expert weights the host keeps and feeds per call (a mixture-of-experts layer's selected experts),
// as tables [layers, experts, rows, cols]: the experts graph is one graph for every layer and every
// choice of experts, so their rows cannot be its initializers. W8 stores int8 codes with one float32
// scale per row in a table of its own (the same per-row symmetric form as W8 graph weights); fp16 and
// fp32 store the rows as they are. Written in one pass, expert by expert: never a whole table in memory.
import { openSync, readSync, closeSync } from 'node:fs';
import type { Checkpoint } from '../io/checkpoint.js';
import { ExternalDataWriter } from '../onnx/external.js';
import { quantizeRows } from '../quant/w8.js';
import { f32ToF16Bits } from '../io/dtype.js';
import type { Equalize, QuantScheme } from '../recipe/schema.js';
import { MADE_DTYPES, type MadeTable, type MadeTables, type TensorSpec } from './types.js';

/** One expert matrix of a table: the checkpoint tensors stacked (row-wise, in order) into its rows. */
export interface ExpertMatrix {
  /** Table name (`experts.gate_up`); its W8 scales are `<name>.scale`. */
  name: string;
  rows: number;
  cols: number;
  /** The checkpoint tensors of layer l, expert e, stacked in this order ([r_i, cols] each, Σ r_i = rows). */
  tensors(layer: number, expert: number): Array<{ name: string; rows: number }>;
}

export const scaleTable = (name: string) => `${name}.scale`;

/**
 * The dtype expert rows are stored (and fed to the experts graph) in, per scheme. Under w4 they stay
 * int8 rows with row scales, as in w8: the experts graph takes them as inputs bound to the host's
 * mapped rows, not as MatMulNBits initializers, and no packed-int4 input form was measured on the HTP.
 */
export const EXPERT_ROW_DTYPE: Record<QuantScheme, MadeTable['dtype']> = { w8: 'int8', w4: 'int8', fp16: 'float16', fp32: 'float32' };

/** Schemes whose expert rows are int8 with one float32 scale per row (see EXPERT_ROW_DTYPE). */
export const int8Rows = (scheme: QuantScheme) => EXPERT_ROW_DTYPE[scheme] === 'int8';

/** What an `equalize` rule's pattern is matched against. */
export const expertId = (layer: number, expert: number) => `layers.${layer}.experts.${expert}`;

/**
 * The pair of an expert's matrices whose intermediate channels can be rebalanced exactly: `up`'s rows
 * from `upRow` on (one per channel) scale the intermediate linearly, `down`'s columns read it.
 */
export interface EqualizePair { up: string; upRow: number; down: string; channels: number }

/**
 * Rebalances intermediate channel j between `up`'s row j (its rows [channels, upCols], from row 0)
 * and `down`'s column j ([downRows, channels]): the row × s_j, the column ÷ s_j, s_j a power of two
 * (exact in float) nearest the geometric mean of the column's range over the columns' median and the
 * row's median over its range: outlier columns come down to their neighbours' range, the row takes
 * the factor, which its own int8 row scale absorbs. Returns how many channels moved. Pure.
 */
export function equalizeChannels(up: Float32Array, upCols: number, down: Float32Array, channels: number): number {
  const downRows = down.length / channels;
  const colMax = Float64Array.from({ length: channels }, (_, j) => {
    let m = 0;
    for (let r = 0; r < downRows; r++) m = Math.max(m, Math.abs(down[r * channels + j]));
    return m;
  });
  const rowMax = Float64Array.from({ length: channels }, (_, j) => {
    let m = 0;
    for (let k = 0; k < upCols; k++) m = Math.max(m, Math.abs(up[j * upCols + k]));
    return m;
  });
  const median = (x: Float64Array) => {
    const v = [...x].filter((a) => a > 0).sort((a, b) => a - b);
    return v.length ? v[v.length >> 1] : 0;
  };
  const [ma, mb] = [median(colMax), median(rowMax)];
  let moved = 0;
  for (let j = 0; j < channels; j++) {
    if (!(colMax[j] > 0 && rowMax[j] > 0 && ma > 0 && mb > 0)) continue;
    const k = Math.round(0.5 * Math.log2((colMax[j] / ma) * (mb / rowMax[j])));
    if (k === 0) continue;
    const s = 2 ** k;
    for (let c = 0; c < upCols; c++) up[j * upCols + c] *= s;
    for (let r = 0; r < downRows; r++) down[r * channels + j] /= s;
    moved++;
  }
  return moved;
}

/**
 * The tables (and the scale tables W8 adds) for `matrices` of `layers` × `experts`, in `scheme`;
 * the experts `equalize.rules` pick have their `equalize.pair` rebalanced first (equalizeChannels).
 */
export function expertTables(matrices: ExpertMatrix[], layers: number, experts: number, scheme: QuantScheme, equalize?: { pair: EqualizePair; rules: readonly Equalize[] }): MadeTables {
  const rules = (equalize?.rules ?? []).map((rule) => ({ rule, re: new RegExp(`^(?:${rule.match})$`) }));
  const ids = Array.from({ length: layers * experts }, (_, i) => expertId(Math.floor(i / experts), i % experts));
  const equalized = ids.filter((id) => rules.some((r) => r.re.test(id)));
  const picked = new Set(equalized);
  const tables: MadeTable[] = [];
  for (const m of matrices) {
    tables.push({ name: m.name, use: 'expert-weights', shape: [layers, experts, m.rows, m.cols], dtype: EXPERT_ROW_DTYPE[scheme] });
    if (int8Rows(scheme)) tables.push({ name: scaleTable(m.name), use: 'expert-scales', shape: [layers, experts, m.rows], dtype: 'float32' });
  }
  const reads: TensorSpec[] = [];
  for (let l = 0; l < layers; l++) for (let e = 0; e < experts; e++) for (const m of matrices) for (const t of m.tensors(l, e)) reads.push({ name: t.name, shape: [t.rows, m.cols], role: 'host' });
  return {
    tables,
    reads,
    ...(rules.length ? { equalized, unmatched: rules.filter((r) => !equalized.some((id) => r.re.test(id))).map((r) => r.rule) } : {}),
    async write(ckpt: Checkpoint, fileOf: (table: string) => string): Promise<void> {
      const sinks = new Map(tables.map((t) => [t.name, new ExternalDataWriter(fileOf(t.name), { align: 1 })]));
      try {
        for (let l = 0; l < layers; l++) {
          for (let e = 0; e < experts; e++) {
            const read = new Map<string, Float32Array>();
            for (const m of matrices) {
              const rows = new Float32Array(m.rows * m.cols);
              let at = 0;
              for (const t of m.tensors(l, e)) {
                ckpt.expectShape(t.name, [t.rows, m.cols]);
                rows.set(await ckpt.readRows(t.name, 0, t.rows), at * m.cols);
                at += t.rows;
              }
              read.set(m.name, rows);
            }
            if (equalize && picked.has(expertId(l, e))) {
              const { up, upRow, down, channels } = equalize.pair;
              const cols = matrices.find((m) => m.name === up)!.cols;
              equalizeChannels(read.get(up)!.subarray(upRow * cols, (upRow + channels) * cols), cols, read.get(down)!, channels);
            }
            for (const m of matrices) {
              const rows = read.get(m.name)!;
              const sink = sinks.get(m.name)!;
              if (int8Rows(scheme)) {
                const q = new Int8Array(rows.length);
                const scales = new Float32Array(m.rows);
                quantizeRows(rows, m.cols, q, scales);
                sink.append(new Uint8Array(q.buffer));
                sinks.get(scaleTable(m.name))!.append(new Uint8Array(scales.buffer));
              } else if (scheme === 'fp16') {
                sink.append(new Uint8Array(Uint16Array.from(rows, f32ToF16Bits).buffer));
              } else {
                sink.append(new Uint8Array(rows.buffer));
              }
            }
          }
        }
        for (const s of sinks.values()) await s.commitAsync();
      } catch (e) {
        for (const s of sinks.values()) s.abort();
        throw e;
      }
    },
  };
}

/** Rows of table `file` (`dtype`, shape [L, E, rows, cols]) for layer l, expert e: `rows × cols` elements. */
export function readExpertRows(file: string, dtype: MadeTable['dtype'], shape: number[], layer: number, expert: number): Int8Array | Uint16Array | Float32Array {
  const [, E, ...inner] = shape;
  const count = inner.reduce((a, d) => a * d, 1);
  const bytes = MADE_DTYPES[dtype].bytes;
  const buf = Buffer.alloc(count * bytes);
  const fd = openSync(file, 'r');
  try {
    const got = readSync(fd, buf, 0, buf.length, (layer * E + expert) * count * bytes);
    if (got !== buf.length) throw new Error(`${file}: short read of layer ${layer} expert ${expert} (${got} of ${buf.length} bytes): the table is truncated`);
  } finally {
    closeSync(fd);
  }
  const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length);
  return dtype === 'int8' ? new Int8Array(ab) : dtype === 'float16' ? new Uint16Array(ab) : new Float32Array(ab);
}
