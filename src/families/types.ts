// What every family module provides. Everything model-specific lives in src/families/<family>.ts;
// the rest of forge sees only this interface.
import type { FamilyId } from '../recipe/schema.js';

/** How a tensor is stored once exported: matmul weights are quantized, the rest stay float. */
export type TensorRole = 'matmul' | 'norm' | 'bias' | 'embedding' | 'conv' | 'other';

export interface TensorSpec {
  name: string;
  shape: number[];
  role: TensorRole;
}

export class ConfigError extends Error {
  constructor(file: string, field: string, message: string) {
    super(`${file}: field ${field}: ${message}`);
    this.name = 'ConfigError';
  }
}

export interface Family<C> {
  id: FamilyId;
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
}
