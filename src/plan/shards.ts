// The shard plan: contiguous layer ranges whose stored weight bytes fit the arch's per-context
// ceiling, using as few contexts as possible and, for that count, the most even split (so neither
// shard sits near the ceiling when an even split would not).
import type { HexagonArch } from '../arch/table.js';
import type { ArchSettings } from '../recipe/schema.js';
import type { Family } from '../families/types.js';
import { storedBytes, sumBytes } from '../quant/bytes.js';

export interface ShardPlan {
  arch: string;
  socModel: number;
  ceilingBytes: number;
  /** Present after a re-plan: the lower ceiling the layer shards were cut under. */
  shardCeilingBytes?: number;
  quant: ArchSettings['quant'];
  layers: number;
  shards: Array<{ index: number; first: number; last: number; weightBytes: number; graphs: string[] }>;
  lmHead: { placement: 'separate' | 'last-shard'; quant: ArchSettings['quant']; bytes: number; tied: boolean };
  hostTables: Array<{ name: string; dtype: 'f16'; bytes: number }>;
  contexts: number;
  totalContextBytes: number;
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

/** `shardCeilingBytes` lowers the ceiling for the layer shards only (a re-plan after the compile ran out of HTP memory). */
export function makePlan<C>(family: Family<C>, config: C, arch: HexagonArch, s: ArchSettings, shardCeilingBytes?: number): ShardPlan {
  const n = family.numLayers(config);
  const layerBytes = Array.from({ length: n }, (_, i) => sumBytes(family.layerTensors(config, i), s.quant));
  const head = family.lmHead(config);
  const headBytes = storedBytes(head, s.lmHead.quant) + sumBytes(family.finalTensors(config), s.lmHead.quant);
  const inLast = s.lmHead.placement === 'last-shard' ? headBytes : 0;
  const archCeiling = arch.contextCeilingBytes;
  const ceiling = Math.min(archCeiling, shardCeilingBytes ?? Infinity);
  const mb = (b: number) => `${(b / 1e6).toFixed(1)} MB`;
  const graphs = s.prefillLength > 0 ? ['prefill', 'decode'] : ['decode'];

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
  const shards = ranges.map(([first, last], index) => {
    let weightBytes = layerBytes.slice(first, last + 1).reduce((x, y) => x + y, 0);
    if (index === ranges.length - 1) weightBytes += inLast;
    if (weightBytes > ceiling) throw new PlanError(`shard ${index} (layers ${first}-${last}) stores ${mb(weightBytes)}, over the ${arch.id} ceiling of ${mb(ceiling)}`);
    return { index, first, last, weightBytes, graphs };
  });
  if (s.lmHead.placement === 'separate' && headBytes > archCeiling) {
    throw new PlanError(`the lm-head stores ${mb(headBytes)} (${s.lmHead.quant}), over the ${arch.id} ceiling of ${mb(archCeiling)}: quantize it (lmHead.quant 'w8')`);
  }
  const contexts = shards.length + (s.lmHead.placement === 'separate' ? 1 : 0);
  if (contexts > arch.maxContexts) throw new PlanError(`the plan needs ${contexts} contexts, over the ${arch.id} limit of ${arch.maxContexts}`);
  const emb = family.embedding(config);
  return {
    arch: arch.id,
    socModel: arch.socModel,
    ceilingBytes: archCeiling,
    ...(ceiling < archCeiling ? { shardCeilingBytes: ceiling } : {}),
    quant: s.quant,
    layers: n,
    shards,
    lmHead: { placement: s.lmHead.placement, quant: s.lmHead.quant, bytes: headBytes, tied: head.name === emb.name },
    hostTables: [{ name: 'embedding', dtype: 'f16', bytes: emb.shape[0] * emb.shape[1] * 2 }],
    contexts,
    totalContextBytes: shards.reduce((a, x) => a + x.weightBytes, 0) + (s.lmHead.placement === 'separate' ? headBytes : 0),
  };
}
