// What every family module provides. Everything model-specific lives in src/families/<family>.ts;
// the rest of forge sees only this interface.
import type { Equalize, FamilyId, QuantScheme } from '../recipe/schema.js';
import type { GraphBuilder } from '../onnx/builder.js';
import type { ElemType } from '../onnx/dtype.js';
import type { WeightStore } from '../quant/weights.js';
import type { Trace } from '../gates/trace.js';
import type { Checkpoint } from '../io/checkpoint.js';
import type { CompareMask } from '../gates/compare.js';
import type { Manifest, ManifestGraph } from '../bundle/manifest.js';

/**
 * How a tensor is stored once exported: matmul weights in the scheme, small tensors (norms, biases,
 * conv taps) as float32 inline in the graph, host tables in their own file.
 */
export type TensorRole = 'matmul' | 'small' | 'host';

export interface TensorSpec {
  name: string;
  shape: number[];
  role: TensorRole;
  /** A matmul weight read by a dry build (families/tensors.ts): the scheme the graph stores it in. */
  scheme?: QuantScheme;
  /**
   * The rows [first, end) a component reads when not the whole tensor (a matmul weight of which it
   * uses only some outputs); `shape` stays the checkpoint's. Absent: every row.
   */
  rows?: [number, number];
}

export class ConfigError extends Error {
  constructor(file: string, field: string, message: string) {
    // Control characters (a newline in a quoted value) escaped: a refusal is one line.
    super(`${file}: field ${field}: ${message}`.replace(/[\u0000-\u001f\u007f]/g, (c) => JSON.stringify(c).slice(1, -1)));
    this.name = 'ConfigError';
  }
}

/**
 * A corrupt size must fail here, naming its field, not later as a fractional, overflowing or
 * multi-million-entry shape list: the runtime keeps dimensions in 32-bit ints, a tensor's element
 * count must stay exact in a double, and a layer count past MAX_LAYERS is taken as corruption
 * (the largest public decoders have a few hundred).
 */
export const MAX_DIM = 2 ** 31 - 1;
export const MAX_LAYERS = 65_536;

/** Refuses `dims` whose product (a tensor's element count) is not an exact integer in a double. */
export function checkElements(file: string, field: string, dims: readonly number[], what: string): void {
  const n = dims.reduce((a, d) => a * d, 1);
  if (!Number.isSafeInteger(n)) throw new ConfigError(file, field, `gives ${what} of ${dims.join(' × ')} elements, more than any tensor can hold`);
}

/** Parses a config with a zod schema; the first problem becomes a ConfigError naming file and field. */
export function parseConfigWith<T>(schema: { safeParse(raw: unknown): { success: true; data: T } | { success: false; error: { issues: Array<{ path: PropertyKey[]; message: string }> } } }, raw: unknown, file: string): T {
  const r = schema.safeParse(raw);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new ConfigError(file, i.path.map(String).join('.') || '(root)', i.message);
  }
  return r.data;
}

/**
 * What a family gives the rest of forge: its config parser, its host tables and its components.
 * Export, quantize, plan, the gates, compile and bundle iterate over components; only the family
 * (and the shared modules it composes) knows what a component computes.
 */
export interface Family<C> {
  id: FamilyId;
  /** The runtime host-op that drives this family's bundles (its decode loop lives in native/). */
  hostOp: Manifest['hostOp'];
  /** Parses config.json (or the recipe's recorded copy); errors name the file and field. */
  parseConfig(raw: unknown, file: string): C;
  numLayers(config: C): number;
  /** Tables the runtime keeps on the host (the token embedding …), in the order the manifest lists them. */
  hostTables(config: C): HostTable[];
  /**
   * false: the oracle gate runs this family's one-token graphs on the whole KV cache, not cut to the
   * window the masks open (gates/cpu-form.ts), because a graph indexes the cache's slots itself.
   */
  gateWindow?: false;
  /** The units the runtime executes for a cut of the layers into contexts, in model order. */
  components(config: C, layout: ComponentLayout): Component[];
  /**
   * Tables made from several checkpoint tensors in a component scheme (PhiMoE's expert rows): every
   * export writes them beside its graphs, which are fed from them.
   */
  madeTables?(config: C, scheme: QuantScheme, equalize?: readonly Equalize[]): MadeTables;
  /** Numbers the host-op needs beyond the graphs (a router's jitter eps …), written into the manifest. */
  hostOpParams?(config: C, layout?: Pick<ComponentLayout, 'image' | 'audio'>): Record<string, number | string | boolean>;
  /**
   * Teacher-forced calls of an exported graph, fed from the oracle trace, with the expected outputs.
   * `dir` holds the export (graphs.json, its graphs and the made tables they are fed from).
   */
  gateCases(config: C, entry: GraphEntry, trace: Trace, maxContext: number, dir: string): AsyncGenerator<GateCase>;
  /**
   * A family whose layer graphs do not hand the residual from one to the next (PhiMoE: the host
   * routes each layer's experts between its graphs) chains its one-token graphs itself for the
   * oracle's logit error: `run` runs a graph of `graphs` over cases in the gate's CPU form, and
   * `logits` takes each step's chained logits with its case (expected.logits HF's). A family that
   * routes on the host says how often the chained router picks HF's experts (`routing`).
   */
  chain?(config: C, graphs: GraphEntry[], trace: Trace, maxContext: number, dir: string, run: ChainRunner, logits: (c: GateCase, got: Float32Array) => void): Promise<ChainNotes | void>;
  /** How the runtime binds each input/output of an exported graph, and the state buffers it keeps. */
  bindings(config: C, entry: GraphEntry, maxContext: number): GraphBindings;
  /** The rescales its layers honour beyond the norms' (blocks.ts MLP_RESCALE, VALUES_RESCALE); none when absent. */
  rescalePairs?: readonly RescalePair[];
  /**
   * What HF's loader copies into private memory when the trace loads the checkpoint (its weight
   * converters' outputs, e.g. experts stacked per layer): the trace's memory prediction adds it.
   * None when absent (every weight stays a view of the mapped checkpoint).
   */
  hfLoadCopies?(config: C): { bytes: number; what: string };
}

/**
 * A function-preserving rescale a family's layers honour, besides every named RMSNorm's (which any
 * family's norms honour: blocks.ts rmsNorm): a recipe `rescale` line naming `<layer scope>/<scope>`
 * divides one matrix by a power of two and multiplies the one that reads its output back — forge
 * bisect's fix when a value between them leaves fp16's range on the HTP. `grows`: the op scopes whose
 * outputs carry the divided values (their peak on the CPU sets the factor); `reads`: the op that takes
 * them back; an overflow at any of `ops` is this pair's to fix.
 */
export interface RescalePair {
  /** The matrices it pairs, in words: `up_proj with down_proj`. */
  pair: string;
  /** The values it divides, in words: `act(gate)·up (down_proj's input)`. */
  values: string;
  scope: string;
  grows: string[];
  reads: string;
  ops: string[];
  /** The rescale by 2^k in words: `up_proj ÷ 2^3, down_proj × 2^3`. */
  what: (k: number) => string;
}

/** What the runtime does with a host table (the manifest's `use`). */
export type HostTableUse = Manifest['hostTables'][number]['use'];

/** A checkpoint tensor the runtime reads on the host, stored whole in its own file. */
export interface HostTable {
  name: string;
  use: HostTableUse;
  /** The checkpoint tensor it is made from. */
  tensor: string;
  shape: number[];
  dtype: 'float16';
}

/** A table the family makes from several tensors (see Family.madeTables). */
export interface MadeTable {
  name: string;
  use: HostTableUse;
  shape: number[];
  dtype: 'int8' | 'float16' | 'float32';
}

/** Per dtype of a made table: bytes per element, and the short name its file carries. */
export const MADE_DTYPES = {
  int8: { bytes: 1, short: 'i8' },
  float16: { bytes: 2, short: 'f16' },
  float32: { bytes: 4, short: 'f32' },
} as const satisfies Record<MadeTable['dtype'], { bytes: number; short: string }>;

export interface MadeTables {
  tables: MadeTable[];
  /** The checkpoint tensors they are made from (the fetched checkpoint's check covers them). */
  reads: TensorSpec[];
  /** Writes every table, each to `fileOf(name)`, in one pass over the checkpoint; nothing half-written on failure. */
  write(ckpt: Checkpoint, fileOf: (table: string) => string): Promise<void>;
  /** The experts the recipe's `equalize` rules picked (`layers.2.experts.1`), and the rules that picked none. */
  equalized?: string[];
  unmatched?: Equalize[];
}

/**
 * How the plan cut the model: layer ranges in model order (one context each; the one marked last
 * applies the final norm), where the lm-head goes, and the call sizes.
 */
export interface ComponentLayout {
  shards: Array<{ first: number; last: number; isLast: boolean }>;
  /** The lm-head is part of the last shard's graphs (no component of its own). */
  lmHeadInside: boolean;
  /** Tokens per batched-prefill call; 0: no prefill graphs (decode over the prompt). */
  prefillLength: number;
  /** KV cache slots. */
  maxContext: number;
  /** How images reach the vision encoder; absent: the text path only (no encoder component). */
  image?: ImageLayout;
  /** How long an audio clip may be; absent: no audio encoder component. */
  audio?: AudioLayout;
  /** A dry build (families/tensors.ts): asks only what the components read; a family leaves out an encoder its checkpoint lacks. */
  dry?: boolean;
}

/**
 * How a vision encoder takes an image: stretched to a fixed height × width (a fixed grid: Qwen-VL),
 * or resized keeping its aspect ratio within a budget of soft tokens (Gemma 4: the grid is an input).
 * A family reads the form it builds and refuses the other.
 */
export interface ImageLayout {
  height?: number;
  width?: number;
  maxSoftTokens?: number;
}

/** The recipe's audio budget: the longest clip, in seconds (the family turns it into its encoder's frame count). */
export interface AudioLayout {
  maxSeconds: number;
}

/** One graph of a component; the variants of a component share its weights (one data file). */
export interface GraphVariant {
  /** Appended to the component's name for the graph's (`shard0.prefill`); '' names the graph as the component. */
  name: string;
  /** Tokens per call. */
  n: number;
  /** How the host-op runs it (the manifest's role); absent: prefill for N > 1, decode for N = 1, lm_head for an lm-head component. */
  role?: string;
  /** Entry fields of this graph alone, over its component's (PhiMoE: the one layer of a per-layer graph). */
  entry?: ComponentEntryFields;
  /** Why the runtime does without this graph, when it may (the planner drops it when a limit would be exceeded); absent: required. */
  optional?: string;
  build(g: GraphBuilder, w: GraphWeights): Promise<GraphInterface>;
}

/** A unit the runtime executes, compiled into one context: its graphs, built from one set of weights. */
export interface Component {
  /** Its context's name (`shard0`, `lm_head`). */
  name: string;
  /** Family-defined; only src/families/ reads it. */
  kind: string;
  /** Which of the recipe's schemes stores its matmul weights ('encoder': an encoder's context, in the layers' scheme). */
  weights: 'layers' | 'lmHead' | 'encoder';
  variants: GraphVariant[];
  /** Fields every graph of it carries in graphs.json, for the family's gate cases and bindings. */
  entry: ComponentEntryFields;
}

/** The hidden state a graph takes and gives, by trace name: lets a gate run one-token graphs in model order, each fed the previous one's output. */
export interface ResidualStream {
  /** Graph input holding it. */
  input: string;
  /** The trace value it is (`h.3`, `final`), or null when the runtime feeds it from a host table (the chain's first link). */
  from: string | null;
  output?: string;
  /** The trace value the output is. */
  to?: string;
}

export interface ComponentEntryFields {
  stream?: ResidualStream;
  shard?: number;
  first?: number;
  last?: number;
  /** The last shard's hidden_out is final-normed. */
  isLast?: boolean;
}

export interface GraphBindings {
  inputs: ManifestGraph['inputs'];
  outputs: ManifestGraph['outputs'];
  state: Manifest['state'];
}

export interface ShardSpec {
  first: number;
  last: number;
  /** Tokens per call: 1 for decode, the prefill length for prefill. */
  n: number;
  /** KV cache slots. */
  maxContext: number;
  /** The recipe's prefill length (0: none): both graphs of a shard size their state for it (Gemma 4's rings). */
  prefillLength?: number;
  /** The last shard applies the final norm (and the lm-head when it is placed there). */
  isLast: boolean;
  lmHeadInside: boolean;
}

export interface GraphWeights {
  store: WeightStore;
  scheme: QuantScheme;
  lmHeadScheme: QuantScheme;
}

export interface TensorIO {
  name: string;
  dtype: ElemType;
  shape: number[];
}

/** What a graph takes and gives, plus the internal values the oracle gate may probe. */
export interface GraphInterface {
  inputs: TensorIO[];
  outputs: TensorIO[];
  /** Internal value name → what it is in the trace (e.g. 'h.3' = residual after layer 2). */
  probes: Record<string, TensorIO>;
}

/** One exported graph (graphs.json: src/export/graphs.ts): a variant of a component, with the interface its builder gave. */
export interface GraphEntry extends GraphInterface, ComponentEntryFields {
  name: string;
  file: string;
  /** The component (and context) it belongs to. */
  component: string;
  /** The component's family-defined kind: only src/families/ reads it. */
  kind: string;
  /** The variant's name within its component ('' when the component has one graph). */
  variant: string;
  /** Tokens per call. */
  n: number;
  /** The variant's role, when the family names one (GraphVariant.role). */
  role?: string;
  /** The quant scheme of its matmul weights. */
  scheme: QuantScheme;
  /**
   * State inputs and outputs the graph holds times a factor (a recipe `rescale` of v_proj with
   * o_proj: its KV cache holds the values scaled): the gates scale HF's states alike (gateCasesOf).
   */
  stateScales?: Record<string, number>;
}

/** A graph input fed by a gate case. */
export interface Feed {
  /** int8 and float16 (raw bits): expert rows fed from host tables. */
  dtype: 'float32' | 'int32' | 'int8' | 'float16';
  data: Float32Array | Int32Array | Int8Array | Uint16Array;
  dims: number[];
}

/** One teacher-forced call: feeds, and expected values. */
export interface GateCase {
  prompt: number;
  step: number;
  feeds: Record<string, Feed>;
  expected: Record<string, Float32Array>;
  /**
   * Per expected output, which entries are compared (the rest are padding rows of a short prefill
   * chunk, zeros in `expected`); an output without a mask is compared whole.
   */
  masks?: Record<string, CompareMask>;
  /**
   * The step's logits predict a placeholder (the next prompt id stands for an image's or a clip's
   * soft token, or closes its block): no one asks the model for that token, so they are compared by
   * cosine but not counted in top-1.
   */
  placeholder?: boolean;
  /**
   * A graph every layer shares (PhiMoE's experts): the layer this case ran for, and the experts it
   * was fed. The gate reports such a graph per layer, and bisect names an expert from them.
   */
  served?: { layer: number; experts: number[] };
}

/**
 * A graph's gate cases as its family makes them from HF's trace, with any state the graph holds
 * rescaled (GraphEntry.stateScales) scaled alike, fed and expected: what every gate and bisect step runs.
 */
export async function* gateCasesOf<C>(family: Pick<Family<C>, 'gateCases'>, config: C, entry: GraphEntry, trace: Trace, maxContext: number, dir: string): AsyncGenerator<GateCase> {
  yield* scaleStates(entry, family.gateCases(config, entry, trace, maxContext, dir));
}

/**
 * `cases` with the entry's rescaled states (GraphEntry.stateScales) multiplied by their factor; as they
 * are where it has none. A family may refill one cache buffer in place from case to case (the gate
 * feeds it once to a batch of cases, each masking the rows after its own step): the scaled copy of a
 * buffer is kept and refilled in place alike.
 */
export async function* scaleStates(entry: GraphEntry, cases: AsyncIterable<GateCase>): AsyncGenerator<GateCase> {
  const scales = Object.entries(entry.stateScales ?? {});
  const copies = new WeakMap<Float32Array, Float32Array>();
  const scaled = (data: Float32Array, s: number) => {
    let out = copies.get(data);
    if (!out) copies.set(data, (out = new Float32Array(data.length)));
    for (let i = 0; i < data.length; i++) out[i] = data[i] * s;
    return out;
  };
  for await (const c of cases) {
    if (!scales.length) {
      yield c;
      continue;
    }
    const feeds = { ...c.feeds };
    const expected = { ...c.expected };
    for (const [name, s] of scales) {
      const f = feeds[name];
      if (f) {
        if (f.dtype !== 'float32') throw new Error(`${entry.name}: state ${name} is rescaled but fed as ${f.dtype}`);
        feeds[name] = { ...f, data: scaled(f.data as Float32Array, s) };
      }
      if (expected[name]) expected[name] = expected[name].map((v) => v * s);
    }
    yield { ...c, feeds, expected };
  }
}

/** The cases of a graph every layer shares that ran for `layer` (GateCase.served); a graph of its own layer's cases passes whole. */
export async function* casesOfLayer(cases: AsyncIterable<GateCase>, layer: number): AsyncGenerator<GateCase> {
  for await (const c of cases) if (!c.served || c.served.layer === layer) yield c;
}

/**
 * A routing decision where the shipped router, fed the chained graphs' numbers, picks other experts
 * than HF's at a traced step: `hf` and `shipped` in the order chosen; `hfGap`, HF's own logit gap
 * at the first rank where they differ, between its expert and the shipped router's (small: a
 * near-tie in routing).
 */
export interface RoutingFlip { prompt: number; step: number; layer: number; hf: number[]; shipped: number[]; hfGap: number }

/** How often the chained router keeps HF's choice: one decision per traced step and layer; the flips first to last. */
export interface RoutingTally { decisions: number; flips: RoutingFlip[] }

/** What a family's own chain learnt beyond the logits. */
export interface ChainNotes { routing?: RoutingTally }

/** Runs an exported graph over cases (the oracle gate's form of it), each case with its outputs. */
export type ChainRunner = (entry: GraphEntry, cases: AsyncIterable<GateCase>, each: (c: GateCase, output: (name: string) => Float32Array) => void) => Promise<void>;

/** A graph's name: its component's, then the variant's (`shard0.decode`; `lm_head` for a one-graph component). */
export const graphName = (component: string, variant: string) => (variant ? `${component}.${variant}` : component);
