// Read access to an oracle trace (oracles/trace.py): trace.json plus trace.safetensors with tensors
// named p{prompt}/s{step}/<what>.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { openSafetensors, type SafetensorsFile } from '../io/safetensors.js';
import { toFloat32 } from '../io/dtype.js';

export interface TracePrompt {
  text: string;
  prompt_tokens: number[];
  generated: number[];
  /** Per generated token: the token with the second-highest logit at the step that chose it. */
  runner_up: number[];
  /** Per generated token: HF's top-1 − top-2 logit margin there (float32 logits subtracted in double). */
  margins: number[];
  steps: number;
  /**
   * An image prompt (oracles/trace.py's "image" input): the file, the size it was stretched to, the
   * patch grid, its image tokens and where the first one sits in prompt_tokens.
   */
  image?: { file: string; sha256: string; size: [number, number]; grid: [number, number, number]; tokens: number; start: number };
  /**
   * An audio prompt (oracles/trace.py's "audio" input): the file, the mel frames the encoder was fed
   * (the recipe's budget) and how many were the clip's, its audio tokens and where the first sits.
   */
  audio?: { file: string; sha256: string; frames: number; valid_frames: number; tokens: number; start: number };
}

/**
 * How confident the reference is along its greedy continuations: the distribution of the margins
 * over every generated token of every prompt (oracles/trace.py margin_summary). p5/p50 are
 * nearest-rank, so each is a margin that occurred.
 */
export interface MarginSummary {
  count: number;
  min: number;
  p5: number;
  p50: number;
  max: number;
  /** 2^-8: fp16's spacing for magnitudes in [4, 8), where logits typically lie. */
  fp16_spacing: number;
  below_fp16_spacing: number;
  below_0_1: number;
  /** The step with the smallest margin (the first in prompt, step order): trace step and generated index. */
  smallest: { prompt: number; step: number; generated_index: number; margin: number; token: number; runner_up: number; token_text: string; runner_up_text: string };
}

export interface TraceMeta {
  family: string;
  layers: number;
  hidden: number;
  vocab: number;
  kv_heads: number | number[];
  head_dim: number | number[];
  max_context: number;
  new_tokens: number;
  prompts: TracePrompt[];
  margins: MarginSummary;
  tensors: string;
}

/** trace.json of a trace directory (the metadata only: gates that need no tensors read just this). */
export function readTraceMeta(dir: string): TraceMeta {
  return JSON.parse(readFileSync(join(dir, 'trace.json'), 'utf8')) as TraceMeta;
}

export class Trace {
  /** `dir`: the trace directory (its images/ holds the images an image prompt traced). */
  private constructor(readonly meta: TraceMeta, private readonly file: SafetensorsFile, readonly dir: string) {}

  static async open(dir: string): Promise<Trace> {
    const meta = readTraceMeta(dir);
    return new Trace(meta, await openSafetensors(join(dir, meta.tensors)), dir);
  }

  has(p: number, t: number, what: string): boolean {
    return this.file.tensors.has(`p${p}/s${t}/${what}`);
  }

  async get(p: number, t: number, what: string): Promise<Float32Array> {
    const name = `p${p}/s${t}/${what}`;
    const info = this.file.tensors.get(name);
    if (!info) throw new Error(`trace has no tensor ${name}`);
    return toFloat32(info.dtype, await this.file.read(name));
  }

  /** A tensor of a whole prompt, not of one step (an image prompt's pixels and vision outputs: `p{p}/<what>`). */
  async getPrompt(p: number, what: string): Promise<Float32Array> {
    const name = `p${p}/${what}`;
    const info = this.file.tensors.get(name);
    if (!info) throw new Error(`trace has no tensor ${name}`);
    return toFloat32(info.dtype, await this.file.read(name));
  }

  close(): Promise<void> {
    return this.file.close();
  }
}
