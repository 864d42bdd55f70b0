// The checkpoint tensors a component reads, derived from its own graph builder: the builder runs
// once against a store that records each weight it asks for instead of reading it. The planner's
// byte counts, the export's progress total and the fetched checkpoint's check all come from this,
// so a builder that reads a new tensor cannot leave a hand-written list behind.
import { GraphBuilder } from '../onnx/builder.js';
import type { QuantScheme } from '../recipe/schema.js';
import type { RowRange, WeightStore } from '../quant/weights.js';
import type { Component, ComponentLayout, Family, TensorSpec } from './types.js';

/** Stands in for a WeightStore during a dry build: records (name, shape, role), reads nothing. */
class RecordingStore {
  readonly tensors = new Map<string, TensorSpec>();

  private record(name: string, shape: number[], role: TensorSpec['role']): void {
    const seen = this.tensors.get(name);
    if (seen && seen.shape.join(',') !== shape.join(',')) throw new Error(`${name} is read as [${seen.shape}] and as [${shape}] by one component`);
    // A tensor read both as a matmul weight and as a small float (none today) is stored as the matmul.
    if (!seen || role === 'matmul') this.tensors.set(name, { name, shape: [...shape], role });
  }

  async linear(g: GraphBuilder, x: string, name: string, shape: [number, number], scheme: QuantScheme, _n?: number, _bias?: string, rows?: RowRange): Promise<string> {
    const seen = this.tensors.get(name);
    this.record(name, shape, 'matmul');
    const t = this.tensors.get(name)!;
    t.scheme = scheme;
    // Rows read by this component: the union of its reads (every row once a read takes them all;
    // the store keeps each range it is given apart, and no builder reads two ranges of one tensor).
    const had = seen?.role === 'matmul' ? (seen.rows ?? [0, shape[0]]) : undefined;
    const now: [number, number] = rows ? [rows[0], rows[1]] : [0, shape[0]];
    const union: [number, number] = had ? [Math.min(had[0], now[0]), Math.max(had[1], now[1])] : now;
    if (union[0] === 0 && union[1] === shape[0]) delete t.rows;
    else t.rows = union;
    return g.op('Identity', [x]);
  }

  async small(g: GraphBuilder, name: string, shape: number[]): Promise<string> {
    this.record(name, shape, 'small');
    return g.constFloat32([1], []);
  }

  async fp16(name: string, shape: number[]): Promise<void> {
    this.record(name, shape, 'host');
  }
}

/** Every tensor the component's graphs read (the union over its variants), in the order first read. */
export async function componentTensors(c: Component, schemes: { scheme: QuantScheme; lmHeadScheme: QuantScheme } = { scheme: 'fp32', lmHeadScheme: 'fp32' }): Promise<TensorSpec[]> {
  const store = new RecordingStore();
  for (const v of c.variants) await v.build(new GraphBuilder(`dry.${c.name}.${v.name}`), { store: store as unknown as WeightStore, ...schemes });
  return [...store.tensors.values()];
}

/**
 * A layout for a dry build: tensors do not depend on the cache size or the call size. No cache
 * slots: tables computed per slot (RoPE) come out empty, so a dry build's cost does not grow with
 * a config's head size.
 */
const dryLayout = (shards: ComponentLayout['shards'], lmHeadInside: boolean): ComponentLayout => ({ shards, lmHeadInside, prefillLength: 0, maxContext: 0, dry: true });

/** The decoder's components only: an encoder is grouped on its own (encoderTensors). */
async function tensorsOfOnly<C>(family: Family<C>, config: C, layout: ComponentLayout): Promise<TensorSpec[][]> {
  return Promise.all(family.components(config, layout).filter((c) => c.weights !== 'encoder').map((c) => componentTensors(c)));
}

/**
 * The image layout of a dry build: both forms at once (a fixed size of no pixels; Gemma 4's smallest
 * soft-token budget), so every family's encoder builds; its tensors do not depend on the grid.
 */
const DRY_IMAGE = { height: 0, width: 0, maxSoftTokens: 70 };
/** The audio layout of a dry build: one second (an audio encoder's tensors do not depend on its frames). */
const DRY_AUDIO = { maxSeconds: 1 };

/** What each encoder component reads (none for a text-only family). */
export async function encoderTensors<C>(family: Family<C>, config: C, scheme: QuantScheme = 'fp32'): Promise<Array<{ name: string; tensors: TensorSpec[] }>> {
  const n = family.numLayers(config);
  const layout = { ...dryLayout([{ first: 0, last: n - 1, isLast: true }], false), image: DRY_IMAGE, audio: DRY_AUDIO };
  const encoders = family.components(config, layout).filter((c) => c.weights === 'encoder');
  return Promise.all(encoders.map(async (c) => ({ name: c.name, tensors: await componentTensors(c, { scheme, lmHeadScheme: scheme }) })));
}

const minus = (a: TensorSpec[], b: TensorSpec[]) => {
  const drop = new Set(b.map((t) => t.name));
  return a.filter((t) => !drop.has(t.name));
};

export interface ModelTensors {
  /** Per layer, what a shard holding only that layer reads. */
  layers: TensorSpec[][];
  /** What the last shard reads beyond its layers (the final norm). */
  final: TensorSpec[];
  /** What the lm-head reads when it stands alone (its weight, the embedding's when tied). */
  lmHead: TensorSpec[];
  host: TensorSpec[];
  /** Per encoder component (a vision tower), what it reads. */
  encoders: Array<{ name: string; tensors: TensorSpec[] }>;
}

/** What a shard holding only layer `i` reads (one dry build). */
export async function layerTensors<C>(family: Family<C>, config: C, i: number): Promise<TensorSpec[]> {
  return (await tensorsOfOnly(family, config, dryLayout([{ first: i, last: i, isLast: false }], true))).flat();
}

/** What is read after the layers: by the last shard beyond its layer (the final norm), and by the lm-head standing alone. */
export async function headTensors<C>(family: Family<C>, config: C): Promise<{ final: TensorSpec[]; lmHead: TensorSpec[] }> {
  const n = family.numLayers(config);
  const [lastShard, ...rest] = await tensorsOfOnly(family, config, dryLayout([{ first: n - 1, last: n - 1, isLast: true }], false));
  return { final: minus(lastShard, await layerTensors(family, config, n - 1)), lmHead: rest.flat() };
}

/** What the host tables read: each table's tensor, and the tensors the made tables (expert rows …) are made from. */
export const hostTensors = <C>(family: Family<C>, config: C): TensorSpec[] => [
  ...family.hostTables(config).map((t): TensorSpec => ({ name: t.tensor, shape: t.shape, role: 'host' })),
  ...(family.madeTables?.(config, 'fp32').reads ?? []),
];

/** The model's tensors, grouped as the planner places them: one dry build per layer, plus the last shard and the lm-head. */
export async function modelTensors<C>(family: Family<C>, config: C): Promise<ModelTensors> {
  const layers: TensorSpec[][] = [];
  for (let i = 0; i < family.numLayers(config); i++) layers.push(await layerTensors(family, config, i));
  return { layers, ...(await headTensors(family, config)), host: hostTensors(family, config), encoders: await encoderTensors(family, config) };
}

/** Every distinct checkpoint tensor the model's graphs and host tables read. */
export function allTensors(m: ModelTensors): TensorSpec[] {
  const out = new Map<string, TensorSpec>();
  for (const t of [...m.host, ...m.layers.flat(), ...m.final, ...m.lmHead, ...m.encoders.flatMap((e) => e.tensors)]) if (!out.has(t.name)) out.set(t.name, t);
  // The checkpoint's tensors, whole: a row range is what one component reads, not what the checkpoint holds.
  return [...out.values()].map(({ rows: _rows, ...t }) => t);
}
