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
  steps: number;
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
  tensors: string;
}

export class Trace {
  private constructor(readonly meta: TraceMeta, private readonly file: SafetensorsFile) {}

  static async open(dir: string): Promise<Trace> {
    const meta = JSON.parse(readFileSync(join(dir, 'trace.json'), 'utf8')) as TraceMeta;
    return new Trace(meta, await openSafetensors(join(dir, meta.tensors)));
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

  close(): Promise<void> {
    return this.file.close();
  }
}
