// Bytes one decode step of a bundle moves, per position: the weights of every context a step runs
// (the planner's own byte counts, the auto map's precisions included) and everything else from the
// family's graph interfaces and bindings (decode-traffic.ts): KV caches and recurrent state, host
// rows, masks and the other graph inputs and outputs. Decode on the HTP is bound by these bytes over
// the memory bandwidth: the model card prints them, bench/decode-bytes.ts sets them beside the
// hand-made bundles'. Nothing here reads a checkpoint's weights or runs a graph.
import type { HexagonArch } from '../arch/table.js';
import type { ComponentLayout, Family, TensorSpec } from '../families/types.js';
import { modelTensors } from '../families/tensors.js';
import { makePlan, type ShardPlan } from '../plan/shards.js';
import { sumBytes } from '../quant/bytes.js';
import { PrecisionChooser, type PrecisionMap } from '../quant/precision.js';
import { baseScheme, type ArchSettings } from '../recipe/schema.js';
import { decodeGraphs, embeddingTable, familyTables, stepIo, type IoParts, type StateForm } from './decode-traffic.js';

export interface DecodeParts extends IoParts {
  /** Every layer's weights (matmuls in the scheme shipped, float tensors float32). */
  layerWeights: number;
  /** The final norm and the lm-head matrix. */
  lmHeadWeights: number;
}

export interface DecodeStep {
  bytesPerToken: number;
  parts: DecodeParts;
  hostRowsByTable: Record<string, number>;
  contexts: number;
}

export const partsSum = (p: DecodeParts): number => Object.values(p).reduce((a, b) => a + b, 0);

/**
 * The layout `s` plans (with `precision`, auto's map) as a function of the position (tokens already
 * cached when the step runs). The weights are checked against the plan's own context bytes, so this
 * count cannot drift from what the planner cuts. `built`: the plan a build used (a re-plan under a
 * lower ceiling cuts other shards), else the plan `s` makes.
 */
export async function decodeSteps<C>(family: Family<C>, config: C, arch: HexagonArch, s: ArchSettings, form: StateForm, precision?: PrecisionMap, built?: ShardPlan): Promise<(position: number) => DecodeStep> {
  const tensors = await modelTensors(family, config);
  const layer = tensors.layers.flat();
  const head: TensorSpec[] = [...tensors.final, ...tensors.lmHead];
  const plan = built ?? (await makePlan(family, config, arch, s, undefined, precision));
  const chooser = new PrecisionChooser(s.overrides, precision);
  const layerWeights = sumBytes(layer, baseScheme(s.quant), chooser);
  const lmHeadWeights = sumBytes(head, baseScheme(s.lmHead.quant), chooser);
  const planned = plan.totalContextBytes - (plan.encoders ?? []).reduce((a, e) => a + e.weightBytes, 0);
  if (planned !== layerWeights + lmHeadWeights) throw new Error(`decode bytes: the plan's contexts hold ${planned} B, the tensors ${layerWeights + lmHeadWeights} B`);
  const layout: ComponentLayout = {
    shards: plan.shards.map((x, i) => ({ first: x.first, last: x.last, isLast: i === plan.shards.length - 1 })),
    lmHeadInside: s.lmHead.placement === 'last-shard',
    prefillLength: s.prefillLength,
    maxContext: s.maxContext,
    ...(s.image ? { image: s.image } : {}),
  };
  const graphs = await decodeGraphs(family, config, layout, baseScheme(s.quant));
  const tables = familyTables(family, config, baseScheme(s.quant));
  const embedding = embeddingTable(family, config);
  return (position: number) => {
    const { hostRowsByTable, ...io } = stepIo(graphs, tables, embedding, position, form);
    const parts = { layerWeights, lmHeadWeights, ...io };
    return { bytesPerToken: partsSum(parts), parts, hostRowsByTable, contexts: plan.contexts };
  };
}

/** The positions a card shows: 128, 512, 2048 and maxContext, those within maxContext. */
export const cardPositions = (maxContext: number): number[] => [...new Set([128, 512, 2048, maxContext].filter((p) => p <= maxContext))].sort((a, b) => a - b);

/** One row of the card's table: a position and what a decode step moves there. */
export interface DecodeBytesRow {
  position: number;
  bytesPerToken: number;
  weights: number;
  kvRead: number;
  /** KV rows written, recurrent state read and written, host rows, masks, other graph I/O. */
  other: number;
}

export const decodeRow = (position: number, d: DecodeStep): DecodeBytesRow => {
  const p = d.parts;
  const weights = p.layerWeights + p.lmHeadWeights;
  return { position, bytesPerToken: d.bytesPerToken, weights, kvRead: p.kvRead, other: d.bytesPerToken - weights - p.kvRead };
};
