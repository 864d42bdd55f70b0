// What every family module provides. Everything model-specific lives in src/families/<family>.ts;
// the rest of forge sees only this interface.
import type { FamilyId, QuantScheme } from '../recipe/schema.js';
import type { GraphBuilder } from '../onnx/builder.js';
import type { ElemType } from '../onnx/dtype.js';
import type { WeightStore } from '../quant/weights.js';
import type { Trace } from '../gates/trace.js';
import type { GraphEntry } from './export-stage.js';
import type { GateCase } from './kv-decoder.js';
import type { Manifest, ManifestGraph } from '../bundle/manifest.js';

/** How a tensor is stored once exported: matmul weights are quantized, the rest stay float. */
export type TensorRole = 'matmul' | 'norm' | 'bias' | 'embedding' | 'conv' | 'other';

export interface TensorSpec {
  name: string;
  shape: number[];
  role: TensorRole;
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

export interface Family<C> {
  id: FamilyId;
  /** The runtime host-op that drives this family's bundles (its decode loop lives in native/). */
  hostOp: Manifest['hostOp'];
  /** Parses config.json (or the recipe's recorded copy); errors name the file and field. */
  parseConfig(raw: unknown, file: string): C;
  numLayers(config: C): number;
  /** The checkpoint tensors one decoder layer reads. */
  layerTensors(config: C, layer: number): TensorSpec[];
  /** Input embedding table (kept on the host as f16). */
  embedding(config: C): TensorSpec;
  /** Tensors applied after the last layer, before the lm-head (final norm …). */
  finalTensors(config: C): TensorSpec[];
  /** The lm-head weight, or the embedding when tied. */
  lmHead(config: C): TensorSpec;
  /** Adds one shard's graph (layers first..last, N tokens per call) to g; returns its interface. */
  buildShard(g: GraphBuilder, config: C, shard: ShardSpec, w: GraphWeights): Promise<GraphInterface>;
  /** Adds the lm-head graph (final-normed hidden [1,1,H] → logits [1,1,V]) to g. */
  buildLmHead(g: GraphBuilder, config: C, w: GraphWeights): Promise<GraphInterface>;
  /** Teacher-forced calls of an exported graph, fed from the oracle trace, with the expected outputs. */
  gateCases(config: C, entry: GraphEntry, trace: Trace, maxContext: number): AsyncGenerator<GateCase>;
  /** How the runtime binds each input/output of an exported graph, and the state buffers it keeps. */
  bindings(config: C, entry: GraphEntry, maxContext: number): GraphBindings;
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
