// graphs.json: what an export gives the later stages (quantize, gates, compile, bundle): its
// contexts, each context's graphs with the interface and entry fields the family's builders gave,
// the host and made tables, and the checkpoint files read in place.
import type { FamilyId, QuantScheme } from '../recipe/schema.js';
import type { MatrixEntry, W8Form } from '../quant/weights.js';
import type { LinkedFile } from '../onnx/linked-data.js';
import type { ShardPlan } from '../plan/shards.js';
import { MADE_DTYPES, type AudioLayout, type ComponentLayout, type GraphEntry, type GraphInterface, type ImageLayout, type MadeTable } from '../families/types.js';

export { graphName, type GraphEntry } from '../families/types.js';

export interface ContextEntry {
  name: string;
  /** The context's own weight file; absent when every weight is read in place from the checkpoint. */
  data?: string;
  dataBytes: number;
  /** Checkpoint files (links in the export directory, see ExportManifest.linked) the context's graphs read in place. */
  linked?: string[];
  graphs: GraphEntry[];
  /**
   * The precision each matmul weight of the context got, in the order first stored; `why` where it
   * is not the graphs' scheme's own form (in-features zero-padded to the block: quant/pad.ts).
   */
  matrices?: MatrixEntry[];
}

/** The matrices an export stored otherwise than its scheme's own form (padded in-features …), with why. */
export function matrixFallbacks(m: ExportManifest): Array<{ tensor: string; scheme: string; why: string; paddedTo?: number }> {
  return m.contexts.flatMap((c) => (c.matrices ?? []).flatMap((x) => (x.why ? [{ tensor: x.tensor, scheme: x.scheme, why: x.why, ...(x.paddedTo ? { paddedTo: x.paddedTo } : {}) }] : [])));
}

export interface HostTableEntry {
  name: string;
  file: string;
  dtype: 'float16';
  shape: number[];
}

export interface ExportManifest {
  family: FamilyId;
  scheme: QuantScheme;
  lmHeadScheme: QuantScheme;
  w8Form: W8Form;
  maxContext: number;
  /** How images reach the vision encoder (a size, or a soft-token budget), when the export has one. */
  image?: ImageLayout;
  /** The longest audio clip the audio encoder takes, when the export has one. */
  audio?: AudioLayout;
  contexts: ContextEntry[];
  /** The family's host tables, in its order. */
  hostTables?: HostTableEntry[];
  /** Tables made in this export's scheme (expert rows …) that its graphs are fed from, in the family's order. */
  madeTables?: Array<MadeTable & { file: string }>;
  /** The first host table (the token embedding), as the v1 bundle assembly reads it. */
  embedding?: { file: string; dtype: 'float16'; shape: [number, number] };
  /** The checkpoint's files, linked (or, failing that, copied) into the export directory. */
  linked?: LinkedFile[];
}

export const GRAPHS_JSON = 'graphs.json';

/** A made table's file: its name and dtype (`experts.gate_up.i8.bin`). */
export const madeTableFile = (t: MadeTable) => `${t.name}.${MADE_DTYPES[t.dtype].short}.bin`;

/**
 * Graph inputs and outputs are C identifiers: the QAIRT converter rewrites any other name (`a.0` →
 * `a_0`), and the runtime binds by the manifest's names, so a rewritten name would not bind.
 */
export function checkIoNames(graph: string, iface: GraphInterface): void {
  for (const t of [...iface.inputs, ...iface.outputs]) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(t.name)) throw new Error(`${graph}: graph input/output '${t.name}' is not a C identifier ([A-Za-z_][A-Za-z0-9_]*), which every compile toolchain keeps unchanged`);
  }
}


/** What an export reads of a plan: the layer cut, where the lm-head goes, the graphs left out. */
export type ExportPlan = { shards: Array<Pick<ShardPlan['shards'][number], 'first' | 'last'>>; lmHead: Pick<ShardPlan['lmHead'], 'placement'>; dropped?: ShardPlan['dropped'] };

/** The cut of the layers the plan chose, as the family's components take it. */
export function layoutOf(plan: ExportPlan, p: { prefillLength: number; maxContext: number; image?: ImageLayout | null; audio?: AudioLayout | null }): ComponentLayout {
  return {
    shards: plan.shards.map((s, i) => ({ first: s.first, last: s.last, isLast: i === plan.shards.length - 1 })),
    lmHeadInside: plan.lmHead.placement === 'last-shard',
    prefillLength: p.prefillLength,
    maxContext: p.maxContext,
    ...(p.image ? { image: p.image } : {}),
    ...(p.audio ? { audio: p.audio } : {}),
  };
}

