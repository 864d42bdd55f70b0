// The run record: what a build did, kept with its output and printed by `--json`.
import type { StageRecord } from './run.js';
import type { Json } from './stage.js';

export interface GateRecord {
  ok: boolean;
  [figure: string]: Json;
}

export interface RunRecord {
  recipe: string;
  arch: string;
  ok: boolean;
  error?: string;
  stages: StageRecord[];
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
  /** Absolute path of the build's output directory. */
  bundle: string;
  seconds: number;
}

export const RUN_RECORD = 'build/run.json';
