// The run record: what a build did, kept with its output and printed by `--json`.
import type { StageRecord } from './run.js';
import type { DigestStats } from '../hub/local-digest.js';
import type { Json } from './stage.js';
import type { BuiltRevision } from '../recipe/schema.js';

export interface GateRecord {
  ok: boolean;
  [figure: string]: Json;
}

export interface RunRecord {
  recipe: string;
  arch: string;
  /** Nothing failed and nothing was interrupted (a --until run can be ok without being a build). */
  ok: boolean;
  /** ok: a gated bundle was made; partial: stopped after --until as asked, no bundle; failed; interrupted (SIGINT/SIGTERM). */
  status: 'ok' | 'partial' | 'failed' | 'interrupted';
  /** The stage a partial run stopped after. */
  until?: string;
  error?: string;
  /** Hub sources: the revision fetched, and whether the recipe pinned it or `--revision` gave it. */
  hubRevision?: BuiltRevision;
  /** The shared stage cache this build read and wrote (s3://bucket/prefix), when it used one. */
  remoteCache?: string;
  /** A local checkpoint's content digest, taken before any stage (its time is in no stage's). */
  checkpointDigest?: DigestStats;
  stages: StageRecord[];
  /** The smaller shard ceiling the user asked for (--shard-ceiling): the plan is not the device-optimal one. */
  shardCeilingBytes?: number;
  /** Re-plans after the compile ran out of HTP memory (at most two). */
  replans?: Array<{ reason: string; ceilingBytes: number }>;
  gates: Record<string, GateRecord>;
  /** Gates this build did not run, with why. */
  gatesNotRun?: Record<string, string>;
  /** The gates the recipe asks for: `forge publish` refuses a bundle missing any of them. */
  gatesRequired?: string[];
  /** Small per-stage summaries (plan sizes, fetched bytes …) of the stages that are not gates (those are in `gates`). */
  summaries: Record<string, Json>;
  tools: Record<string, string>;
  /** Absolute path of the bundle this run made; null when it made none (failed, interrupted, partial). */
  bundle: string | null;
  /** Absolute path of the build/ directory holding this record and the reports; null when it could not be written. */
  buildDir: string | null;
  seconds: number;
}

export const RUN_RECORD = 'build/run.json';
