// What one decode step moves besides the weights, counted from the family's own graph interfaces and
// bindings (the ones a build writes into the manifest): KV caches and recurrent state read and
// written, host-table rows, masks, and the other graph inputs and outputs. decode-bytes.ts adds the
// planner's weight bytes; test/decode-bytes.test.ts checks these against hand-computed figures for
// the twins' configs. Nothing here reads a checkpoint or runs a graph.
import { GraphBuilder } from '../onnx/builder.js';
import { ELEM, type ElemType } from '../onnx/dtype.js';
import { ROLES } from '../families/phimoe.js';
import { MADE_DTYPES, graphName, type ComponentLayout, type Family, type GraphBindings, type GraphEntry } from '../families/types.js';
import type { WeightStore } from '../quant/weights.js';
import type { QuantScheme } from '../recipe/schema.js';

const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

/** One decode graph as the runtime runs it per token: its bindings, and how many times a step runs it. */
export interface StepGraph {
  name: string;
  /** Runs per decode step: 1, or one per layer for a graph every layer shares (PhiMoE's experts). */
  runs: number;
  bindings: GraphBindings;
}

/** A host table's element size, by the name bindings use. */
export type TableBytes = Record<string, number>;

/**
 * How caches and recurrent states cross the graph boundary. `bytes`: per element (null: as the graph
 * declares them, float32 today). `cacheRead`: 'all' reads every slot of a cache every step (as built:
 * the whole cache is the graph input), 'filled' only the slots holding tokens at the step's position.
 */
export interface StateForm {
  bytes: number | null;
  cacheRead: 'all' | 'filled';
}

/** As forge builds today: float32 state, whole caches every step. */
export const AS_BUILT: StateForm = { bytes: null, cacheRead: 'all' };

/** Bytes per step, by what moves (everything but the weights; decode-bytes.ts adds those). */
export interface IoParts {
  /** Host-table rows read: the token's embedding row, Gemma's per-layer-embedding rows, PhiMoE's selected experts' rows and scales. */
  hostRows: number;
  kvRead: number;
  kvWrite: number;
  /** Recurrent state (Qwen3.5's conv FIFO and delta-rule state) read and written back. */
  stateRead: number;
  stateWrite: number;
  masks: number;
  /** Other graph inputs: residuals, hand-offs, positions, routing weights, encoder outputs, float copies of host rows. */
  graphIn: number;
  /** Other graph outputs: residuals, hand-offs, router logits, logits. */
  graphOut: number;
}

export const emptyIo = (): IoParts => ({ hostRows: 0, kvRead: 0, kvWrite: 0, stateRead: 0, stateWrite: 0, masks: 0, graphIn: 0, graphOut: 0 });

/** Slots of a cache of `slots` (maxContext, or a ring's window) a step reads at `position` (tokens already cached). */
export function cacheSlotsRead(slots: number, position: number, form: StateForm): number {
  return form.cacheRead === 'all' ? slots : Math.min(Math.max(position, 0), slots);
}

/**
 * One layer's KV cache traffic per step (K and V together): `kvHeads` × `slots` × `headDim` per cache.
 * As built: both caches read whole in float32 and one float32 row of each written.
 */
export function kvLayerBytes(kv: { kvHeads: number; headDim: number; slots: number }, position: number, form: StateForm, elemBytes = 4): { read: number; write: number } {
  const b = form.bytes ?? elemBytes;
  return {
    read: 2 * kv.kvHeads * kv.headDim * cacheSlotsRead(kv.slots, position, form) * b,
    write: 2 * kv.kvHeads * kv.headDim * b,
  };
}

/**
 * One Qwen3.5 linear-attention layer's recurrent state per step, read whole and written whole: the
 * conv FIFO [convDim, kernel] and the delta-rule state [vHeads, kDim, vDim].
 */
export function recurrentLayerBytes(l: { convDim: number; convKernel: number; vHeads: number; kDim: number; vDim: number }, form: StateForm, elemBytes = 4): number {
  return (l.convDim * l.convKernel + l.vHeads * l.kDim * l.vDim) * (form.bytes ?? elemBytes);
}

/**
 * What a decode step moves through `graphs` at `position`, besides their weights.
 * - A cache input reads its slots (all, or as far as filled); a state-rows output writes the new row;
 *   a recurrent state is read whole and its next value written whole.
 * - Host rows are counted once a step per (table, layer slice, expert slot, run): the runtime reads
 *   a token's rows once per pass for every graph that takes them, and binds the selected experts'
 *   mapped rows in place. Where a graph input is wider than its table (float32 rows of an f16 table)
 *   the runtime feeds a converted copy, which the graph reads too (counted in graphIn).
 * - `embedding`: the table whose row starts the residual chain (read by the host even where no graph
 *   input names it).
 */
export function stepIo(graphs: StepGraph[], tables: TableBytes, embedding: { table: string; width: number }, position: number, form: StateForm): IoParts & { hostRowsByTable: Record<string, number> } {
  const p = emptyIo();
  const byTable: Record<string, number> = {};
  const seen = new Set<string>();
  const rows = (table: string, key: string, elements: number) => {
    if (seen.has(key)) return;
    seen.add(key);
    const b = elements * tableBytes(tables, table);
    p.hostRows += b;
    byTable[table] = (byTable[table] ?? 0) + b;
  };
  rows(embedding.table, `${embedding.table}|-1|-1|-1`, embedding.width);
  for (const g of graphs) {
    const states = new Map(g.bindings.state.map((s) => [s.name, s]));
    for (let run = 0; run < g.runs; run++) {
      for (const t of g.bindings.inputs) {
        const elem = ELEM[t.dtype as ElemType].bytes;
        switch (t.bind) {
          case 'state': {
            const s = states.get(t.state);
            if (!s) throw new Error(`${g.name}: input ${t.name} binds state ${t.state}, which the bindings do not declare`);
            const b = form.bytes ?? elem;
            if (s.kind === 'kv-cache') {
              const slots = t.shape[s.positionAxis];
              p.kvRead += (numel(t.shape) / slots) * cacheSlotsRead(slots, position, form) * b;
            } else p.stateRead += numel(t.shape) * b;
            break;
          }
          case 'host-rows': {
            const key = `${t.table}|${t.layer ?? -1}|${t.slot ?? -1}|${t.index === 'expert' ? run : -1}`;
            rows(t.table, key, numel(t.shape));
            if (elem !== tableBytes(tables, t.table)) p.graphIn += numel(t.shape) * elem;
            break;
          }
          case 'mask': {
            // [1, 1, N, slots + N]: cut to the filled slots with the cache.
            const n = t.shape[t.shape.length - 2];
            const slots = t.shape[t.shape.length - 1] - n;
            p.masks += (numel(t.shape) / (slots + n)) * (cacheSlotsRead(slots, position, form) + n) * elem;
            break;
          }
          default:
            p.graphIn += numel(t.shape) * elem;
        }
      }
      for (const t of g.bindings.outputs) {
        const elem = ELEM[t.dtype as ElemType].bytes;
        if (t.bind === 'state-rows') p.kvWrite += numel(t.shape) * (form.bytes ?? elem);
        else if (t.bind === 'state-replace') p.stateWrite += numel(t.shape) * (form.bytes ?? elem);
        else p.graphOut += numel(t.shape) * elem;
      }
    }
  }
  return { ...p, hostRowsByTable: byTable };
}

function tableBytes(tables: TableBytes, table: string): number {
  const b = tables[table];
  if (b === undefined) throw new Error(`host table ${table} is not one the family declares (${Object.keys(tables).join(', ')})`);
  return b;
}

/** Element size of every host table a family declares (its f16 tables, and the made tables in `scheme`), by name. */
export function familyTables<C>(family: Family<C>, config: C, scheme: QuantScheme): TableBytes {
  const out: TableBytes = {};
  for (const t of family.hostTables(config)) out[t.name] = ELEM[t.dtype].bytes;
  for (const t of family.madeTables?.(config, scheme).tables ?? []) out[t.name] = MADE_DTYPES[t.dtype].bytes;
  return out;
}

/** The table the residual chain starts from (use 'embedding') and its row width. */
export function embeddingTable<C>(family: Family<C>, config: C): { table: string; width: number } {
  const t = family.hostTables(config).find((x) => x.use === 'embedding');
  if (!t) throw new Error(`${family.id}: no embedding host table`);
  return { table: t.name, width: t.shape[1] };
}

/** Stands in for a WeightStore: every read is a node, nothing is read (the interfaces do not depend on the weights). */
const dryStore = {
  linear: async (g: GraphBuilder, x: string) => g.op('Identity', [x]),
  small: async (g: GraphBuilder) => g.constFloat32([1], []),
} as unknown as WeightStore;

/**
 * The decode graphs of `layout` (one token per call; no encoder, no batched prefill), each built dry
 * for its interface and bound by the family's own bindings at the layout's maxContext, with how
 * many times a step runs it. `scheme`: the layers' (PhiMoE's expert rows enter the experts graph in
 * its dtype: int8 under W8 and W4).
 */
export async function decodeGraphs<C>(family: Family<C>, config: C, layout: ComponentLayout, scheme: QuantScheme): Promise<StepGraph[]> {
  const out: StepGraph[] = [];
  for (const c of family.components(config, layout)) {
    if (c.weights === 'encoder') continue;
    for (const v of c.variants) {
      if (v.n !== 1 || v.optional) continue;
      const name = graphName(c.name, v.name);
      const iface = await v.build(new GraphBuilder(`dry.${name}`), { store: dryStore, scheme, lmHeadScheme: scheme });
      const entry: GraphEntry = { name, file: `${name}.onnx`, component: c.name, kind: c.kind, variant: v.name, n: v.n, ...(v.role ? { role: v.role } : {}), scheme, ...c.entry, ...v.entry, ...iface };
      out.push({ name, runs: v.role === ROLES.experts ? family.numLayers(config) : 1, bindings: family.bindings(config, entry, layout.maxContext) });
    }
  }
  return out;
}
