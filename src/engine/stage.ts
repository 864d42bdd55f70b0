// What a stage is. A stage module is a file exporting `stage: StageModule`; the engine imports it
// in a child process and calls run() with a fresh temporary output directory. A stage reads only
// its declared inputs and params, so its output is a pure function of its cache key.

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

export interface StageContext<P = Json> {
  params: P;
  /** Input name → absolute directory of the upstream stage's output (read-only). */
  inputs: Record<string, string>;
  /** Absolute temporary directory the stage fills; renamed into the cache only when run() resolves. */
  out: string;
  /** Versions of the tools this stage declared (also part of its cache key). */
  tools: Record<string, string>;
  log(message: string): void;
  progress(done: number, total: number, label?: string): void;
  /** Report the peak RSS of a subprocess this stage ran, so the run record sees it. */
  notePeakRss(bytes: number): void;
}

export interface StageOutcome {
  /** Small JSON the run record keeps (gate figures, sizes …). */
  summary?: Json;
  /** Set when this stage is a gate: its name and whether it passed. */
  gate?: { name: string; ok: boolean };
}

export interface StageModule<P = Json> {
  name: string;
  /** Bump when the stage's output for the same inputs changes. */
  version: string;
  run(ctx: StageContext<P>): Promise<StageOutcome | void>;
}

/** One use of a stage module inside a pipeline. */
export interface StageNode {
  /** Unique within the pipeline; also the cache folder name. */
  id: string;
  /** Absolute path of the module file exporting `stage`. */
  module: string;
  params: Json;
  /** Input name → id of the upstream node whose output it reads. */
  inputs: Record<string, string>;
  /**
   * Nodes that must have finished (and, if gates, passed) first, without their output entering
   * this node's key: e.g. compile waits for the oracle gate but does not re-run when its figures move.
   */
  after?: string[];
  /** Tool names whose versions enter the cache key (see toolchain/versions). */
  tools: string[];
  /**
   * Expected peak memory, a function of what the stage processes: the scheduler keeps the sum of
   * running stages' predictions under the budget, and a stage predicted over it is refused.
   */
  memory: StageMemory;
  /** Give up after this long (a hung compile must not hang the build). */
  timeoutSeconds?: number;
}

/**
 * A stage's predicted peak. private: anonymous memory (cannot be dropped); mapped: file pages it
 * maps and keeps touching (weights read at every step), its resident working set beside private.
 * Pages it only streams through once are not counted: the kernel drops them as it goes.
 */
export interface MemoryPrediction {
  privateBytes: number;
  mappedBytes: number;
  /** How the figure was computed (the inputs' sizes and the formula), for the record and a refusal. */
  how: string;
}

export interface StageMemory {
  /**
   * Earlier nodes whose outputs the prediction reads (plan.json, the checkpoint …). It is
   * evaluated as soon as they are done, so a stage that cannot fit is refused then, not when its
   * turn comes after hours of other stages. Need not be inputs of the stage.
   */
  from: string[];
  /** dirs: node id (of `from`) → its output directory. */
  predict(dirs: Record<string, string>): MemoryPrediction;
  /** What the user can do when the stage is refused under limitBytes (appended to the refusal). */
  remedy?(dirs: Record<string, string>, p: MemoryPrediction, limitBytes: number): string;
}

/** A prediction that does not depend on any input (a stage whose memory is independent of model size). */
export function fixedMemory(privateBytes: number, how: string, mappedBytes = 0): StageMemory {
  return { from: [], predict: () => ({ privateBytes, mappedBytes, how }) };
}

/** What the scheduler reserves for a prediction: the private bytes plus the mapped working set. */
export const workingSet = (p: MemoryPrediction) => p.privateBytes + p.mappedBytes;

export interface Pipeline {
  nodes: StageNode[];
  /** Node ids whose outputs are copied into the build's output directory, in order. */
  publish: string[];
  /** Node ids whose outputs (gate tables …) are copied into build/ beside the run record, even when the build failed. */
  reports?: string[];
  /** Gates this pipeline does not run, each with the reason: the run record says so rather than leaving them out silently. */
  gatesNotRun?: Record<string, string>;
}
