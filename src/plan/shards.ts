// The plan: contiguous layer ranges whose stored weight bytes fit the arch's per-context ceiling,
// using as few contexts as possible and, for that count, the most even split (so neither shard sits
// near the ceiling when an even split would not); then the family's components for that cut,
// checked against the arch's contexts and graphs per process. Optional graphs (batched prefill) are
// dropped, each with its reason in plan.json, when the graphs would not fit; required ones that do
// not fit are a PlanError naming the limit. The bytes come from the tensors each builder reads
// (families/tensors.ts), not from a list kept beside it.
import type { HexagonArch } from '../arch/table.js';
import { mb } from '../units.js';
import { baseScheme, choosesPrecision, type ArchSettings, type QuantScheme } from '../recipe/schema.js';
import { PrecisionChooser, type PrecisionMap } from '../quant/precision.js';
import { MADE_DTYPES, type Component, type Family, type TensorSpec } from '../families/types.js';
import { sumBytes } from '../quant/bytes.js';
import { modelTensors } from '../families/tensors.js';
import { graphName } from '../families/types.js';

export interface ShardPlan {
  arch: string;
  socModel: number;
  ceilingBytes: number;
  /** Present after a re-plan: the lower ceiling the layer shards were cut under. */
  shardCeilingBytes?: number;
  quant: ArchSettings['quant'];
  layers: number;
  shards: Array<{ index: number; first: number; last: number; weightBytes: number; graphs: string[] }>;
  /** `quant`: the recipe's lmHead.quant; under 'auto', `chosen` is what the bytes count (the precision stage's choice, or w4 before it ran). */
  lmHead: { placement: 'separate' | 'last-shard'; quant: ArchSettings['lmHead']['quant']; chosen?: QuantScheme; bytes: number; tied: boolean };
  hostTables: Array<{ name: string; dtype: 'f16' | 'f32' | 'i8'; bytes: number }>;
  /** Encoder components (a vision tower), each a context of its own in the layers' scheme. */
  encoders?: Array<{ name: string; weightBytes: number; graphs: string[] }>;
  contexts: number;
  totalContextBytes: number;
  /** Graphs the bundle sets up in one process, against the arch's maxGraphsPerProcess. */
  graphs?: number;
  /** quant 'auto' planned without the precision stage's map (forge plan from a recorded config): what the bytes are. */
  precisionNote?: string;
  /** Optional graphs left out to fit an arch limit, each with why; absent when none was. */
  dropped?: Array<{ graph: string; why: string }>;
}

export class PlanError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PlanError';
  }
}

/** Min over splits of [0,n) into k contiguous groups of the max group cost; returns the cut points. */
function balancedSplit(costs: number[], k: number, extraLast: number): { max: number; cuts: number[] } {
  const n = costs.length;
  const prefix = [0];
  for (const c of costs) prefix.push(prefix[prefix.length - 1] + c);
  const seg = (a: number, b: number) => prefix[b] - prefix[a] + (b === n ? extraLast : 0);
  // best[j][i]: minimal max cost splitting the first i layers into j groups.
  const best = Array.from({ length: k + 1 }, () => new Array<number>(n + 1).fill(Infinity));
  const from = Array.from({ length: k + 1 }, () => new Array<number>(n + 1).fill(-1));
  best[0][0] = 0;
  for (let j = 1; j <= k; j++) {
    for (let i = j; i <= n; i++) {
      for (let s = j - 1; s < i; s++) {
        const v = Math.max(best[j - 1][s], seg(s, i));
        if (v < best[j][i]) { best[j][i] = v; from[j][i] = s; }
      }
    }
  }
  const cuts: number[] = [];
  for (let j = k, i = n; j > 0; j--) { cuts.unshift(i); i = from[j][i]; }
  return { max: best[k][n], cuts };
}

interface PlannedGraph {
  graph: string;
  component: string;
  variant: string;
  optional?: string;
}

/**
 * Keeps the graphs within the arch's graphs per process: while over, drops one optional feature
 * (every graph whose `optional` reason is the same, from every component at once: the runtime uses
 * a feature such as batched prefill across the model or not at all), in the order the family
 * declares them. Returns what is kept and what was dropped, and why.
 */
export function fitGraphs(components: Component[], arch: Pick<HexagonArch, 'id' | 'maxGraphsPerProcess'>): { kept: PlannedGraph[]; dropped: Array<{ graph: string; why: string }> } {
  let kept: PlannedGraph[] = components.flatMap((c) => c.variants.map((v) => ({ graph: graphName(c.name, v.name), component: c.name, variant: v.name, optional: v.optional })));
  const dropped: Array<{ graph: string; why: string }> = [];
  const limit = arch.maxGraphsPerProcess;
  const features = [...new Set(kept.filter((g) => g.optional).map((g) => g.optional))];
  for (const feature of features) {
    if (kept.length <= limit) break;
    const before = kept.length;
    const gone = kept.filter((g) => g.optional === feature);
    kept = kept.filter((g) => !gone.includes(g));
    for (const g of gone) dropped.push({ graph: g.graph, why: `${before} graphs are over the ${arch.id} limit of ${limit} graphs per process (arch table: cdsp-heap); optional, ${g.optional}` });
  }
  if (kept.length > limit) {
    const left = dropped.length ? ` after dropping the optional ${dropped.map((d) => d.graph).join(', ')}` : '';
    throw new PlanError(`the plan needs ${kept.length} graphs${left}, over the ${arch.id} limit of ${limit} graphs per process (arch table: cdsp-heap): use fewer, larger contexts or a family layout with fewer graphs`);
  }
  return { kept, dropped };
}

/** The scheme the auto map gives a part's matmul weights (its first one's), else `base`. */
function chosenScheme(ts: TensorSpec[], base: QuantScheme, map?: PrecisionMap): QuantScheme {
  const m = ts.find((t) => t.role === 'matmul');
  return (m && map?.[m.name]?.scheme) || base;
}

/** `shardCeilingBytes` lowers the ceiling for the layer shards only (a re-plan after the compile ran out of HTP memory). */
const numel = (shape: number[]) => shape.reduce((a, d) => a * d, 1);

/**
 * `precision`: the auto stage's map (quant 'auto'); the recipe's overrides apply either way, and one
 * that matches no matmul weight of the model is refused (a typo would silently pin nothing).
 */
export async function makePlan<C>(family: Family<C>, config: C, arch: HexagonArch, s: ArchSettings, shardCeilingBytes?: number, precision?: PrecisionMap): Promise<ShardPlan> {
  const n = family.numLayers(config);
  const tensors = await modelTensors(family, config);
  const chooser = new PrecisionChooser(s.overrides, precision);
  const layerBytes = tensors.layers.map((t) => sumBytes(t, baseScheme(s.quant), chooser));
  const headBytes = sumBytes(tensors.lmHead, baseScheme(s.lmHead.quant), chooser) + sumBytes(tensors.final, baseScheme(s.lmHead.quant), chooser);
  // A line that matches no matmul weight is a typo; one that matches weights an earlier line already
  // pins (forge bisect puts its fix first) is shadowed, not wrong: first match wins, as documented.
  const matmuls = [...tensors.layers.flat(), ...tensors.lmHead, ...tensors.final, ...tensors.encoders.flatMap((e) => e.tensors)].filter((t) => t.role === 'matmul').map((t) => t.name);
  const unused = s.overrides.filter((o) => { const re = new RegExp(`^(?:${o.match})$`); return !matmuls.some((n) => re.test(n)); });
  if (unused.length) throw new PlanError(`overrides ${unused.map((o) => JSON.stringify(o.match)).join(', ')} match no matmul weight of this model (patterns match a whole tensor name, e.g. "model\\.layers\\.3\\..*")`);
  const inLast = s.lmHead.placement === 'last-shard' ? headBytes : 0;
  const archCeiling = arch.contextCeilingBytes;
  const ceiling = Math.min(archCeiling, shardCeilingBytes ?? Infinity);

  let ranges: Array<[number, number]>;
  if (s.shards === 'auto') {
    const biggest = Math.max(...layerBytes);
    if (biggest > ceiling) throw new PlanError(`one layer stores ${mb(biggest)}, over the ${arch.id} per-context ceiling of ${mb(ceiling)}: use a smaller quant scheme`);
    let found: number[] | null = null;
    for (let k = 1; k <= n && !found; k++) {
      const { max, cuts } = balancedSplit(layerBytes, k, inLast);
      if (max <= ceiling) found = cuts;
    }
    if (!found) throw new PlanError(`the lm-head in the last shard (${mb(inLast)}) does not fit the ${arch.id} ceiling of ${mb(ceiling)}: place it 'separate'`);
    ranges = found.map((end, i) => [i === 0 ? 0 : found![i - 1], end - 1]);
  } else {
    ranges = s.shards as Array<[number, number]>;
    let next = 0;
    for (const [a, b] of ranges) {
      if (a !== next || b >= n) throw new PlanError(`pinned shards must cover layers 0..${n - 1} in order without gaps; got ${JSON.stringify(ranges)}`);
      next = b + 1;
    }
    if (next !== n) throw new PlanError(`pinned shards end at layer ${next - 1}, the model has ${n} layers`);
  }
  const sized = ranges.map(([first, last], index) => {
    let weightBytes = layerBytes.slice(first, last + 1).reduce((x, y) => x + y, 0);
    if (index === ranges.length - 1) weightBytes += inLast;
    if (weightBytes > ceiling) throw new PlanError(`shard ${index} (layers ${first}-${last}) stores ${mb(weightBytes)}, over the ${arch.id} ceiling of ${mb(ceiling)}`);
    return { index, first, last, weightBytes };
  });
  if (s.lmHead.placement === 'separate' && headBytes > archCeiling) {
    throw new PlanError(`the lm-head stores ${mb(headBytes)} (${s.lmHead.quant}), over the ${arch.id} ceiling of ${mb(archCeiling)}: quantize it (lmHead.quant 'w8' or 'w4')`);
  }
  const layout = {
    shards: ranges.map(([first, last], i) => ({ first, last, isLast: i === ranges.length - 1 })),
    lmHeadInside: s.lmHead.placement === 'last-shard',
    prefillLength: s.prefillLength,
    maxContext: s.maxContext,
    ...(s.image ? { image: s.image } : {}),
    ...(s.audio ? { audio: s.audio } : {}),
  };
  const components = family.components(config, layout);
  const encoders = tensors.encoders.filter((e) => components.some((c) => c.name === e.name)).map((e) => {
    const weightBytes = sumBytes(e.tensors, baseScheme(s.quant), chooser);
    if (weightBytes > archCeiling) throw new PlanError(`the ${e.name} encoder stores ${mb(weightBytes)}, over the ${arch.id} ceiling of ${mb(archCeiling)}: quantize it (quant 'w8' or 'w4')`);
    return { name: e.name, weightBytes };
  });
  const contexts = components.length;
  if (contexts > arch.maxContexts) throw new PlanError(`the plan needs ${contexts} contexts, over the ${arch.id} limit of ${arch.maxContexts}`);
  const { kept, dropped } = fitGraphs(components, arch);
  const shards = sized.map((x) => {
    const c = components.find((k) => k.entry.shard === x.index);
    return { ...x, graphs: c ? kept.filter((g) => g.component === c.name).map((g) => g.variant) : [] };
  });
  const encoderPlans = encoders.map((e) => ({ ...e, graphs: kept.filter((g) => g.component === e.name).map((g) => g.graph) }));
  const host = family.hostTables(config);
  const hostNames = new Set(host.map((t) => t.tensor));
  return {
    arch: arch.id,
    socModel: arch.socModel,
    ceilingBytes: archCeiling,
    ...(ceiling < archCeiling ? { shardCeilingBytes: ceiling } : {}),
    quant: s.quant,
    layers: n,
    shards,
    lmHead: {
      placement: s.lmHead.placement, quant: s.lmHead.quant, bytes: headBytes, tied: tensors.lmHead.some((t) => hostNames.has(t.name)),
      ...(s.lmHead.quant === 'auto' ? { chosen: chosenScheme(tensors.lmHead, 'w4', precision) } : {}),
    },
    hostTables: [
      ...host.map((t) => ({ name: t.name, dtype: 'f16' as const, bytes: numel(t.shape) * 2 })),
      // Made tables (expert rows) in the layers' scheme.
      ...(family.madeTables?.(config, baseScheme(s.quant)).tables ?? []).map((t) => ({ name: t.name, dtype: MADE_DTYPES[t.dtype].short, bytes: numel(t.shape) * MADE_DTYPES[t.dtype].bytes })),
    ],
    ...(encoderPlans.length ? { encoders: encoderPlans } : {}),
    contexts,
    totalContextBytes: shards.reduce((a, x) => a + x.weightBytes, 0) + (s.lmHead.placement === 'separate' ? headBytes : 0) + encoders.reduce((a, e) => a + e.weightBytes, 0),
    graphs: kept.length,
    ...(choosesPrecision(s) && !precision ? { precisionNote: `${[...(s.quant === 'auto' ? ["quant 'auto' planned with every layer"] : []), ...(s.lmHead.quant === 'auto' ? ["lmHead.quant 'auto' planned with the lm-head"] : [])].join(' and ')} at w4 (the least bytes): a build's precision stage promotes what the oracle and host parity need to w8 (or fp16), which may take more bytes and contexts` } : {}),
    ...(dropped.length ? { dropped } : {}),
  };
}
