// Stage `parity`: the strongest gate. The native runtime (qhx_generate, where the decode loop lives)
// runs each graph set free-running and greedy from HF's prompt tokens; its tokens must equal HF's
// (the oracle trace) — N/N by default. Reports the first divergent step with both tokens and what
// HF's logits said about each. On a phone (adb) the bundle is the device bundle: the compiled QNN
// contexts of the shipped graphs (the compile stage's output), as `forge build` ships them.
import { readFileSync, rmSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import type { FamilyId } from '../recipe/schema.js';
import { assembleBundle, readCompiled } from '../bundle/assemble.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { hostTarget } from '../targets/host.js';
import { adbTarget } from '../targets/adb.js';
import { NonFiniteLogitsError, type Target } from '../targets/target.js';
import { getArch } from '../arch/table.js';
import { Trace } from './trace.js';
import { writeCpuFormExport } from './cpu-form.js';
import type { NativeRecord } from './native-stage.js';

export type TargetSpec = { kind: 'host' } | { kind: 'adb'; serial: string; runner: string; libDir: string };

export interface ParityParams {
  recipe: { id: string; family: FamilyId };
  arch: string;
  tokens: number;
  minMatch: number;
  /** Threshold for the `quantize` (W8) variant when the recipe lowers it, with its reason. */
  w8?: { minMatch: number; why: string };
  /** Export inputs whose graphs are run (each assembled into a bundle). */
  variants: string[];
  target: TargetSpec;
}

export interface Divergence {
  prompt: number;
  step: number;
  hf: { token: number; logit: number };
  runtime: { token: number; hfLogit: number };
}

export interface VariantResult {
  matched: number;
  total: number;
  perPrompt: Array<{ matched: number; total: number; nonFinite?: string }>;
  firstDivergence: Divergence | null;
  /** The runtime refused NaN/Inf logits (first prompt where it did, and its message): the variant fails whatever it matched. */
  nonFinite?: string;
  /** Means over the prompts; load_ms is the fastest start-up (a device's first run after a push also hashes every file). */
  timings: { load_ms: number; prefill_ms: number; decode_ms_per_token: number; host_overhead_ms_per_token: number };
}

/** Per qhx_generate call on the host: a real-size model's prefill and 64 tokens on one CPU thread take minutes. */
const HOST_CALL_TIMEOUT_S = 1800;

function makeTarget(spec: TargetSpec, qhxGenerate: string, arch: string): Target {
  if (spec.kind === 'host') return hostTarget(qhxGenerate, HOST_CALL_TIMEOUT_S);
  return adbTarget({ serial: spec.serial, arch: getArch(arch), runner: spec.runner, libDir: spec.libDir });
}

/** Runs one bundle over every traced prompt and compares with HF's greedy tokens. */
export async function checkParity(target: Target, bundleDir: string, trace: Trace, tokens: number): Promise<VariantResult> {
  const r: VariantResult = { matched: 0, total: 0, perPrompt: [], firstDivergence: null, timings: { load_ms: Infinity, prefill_ms: 0, decode_ms_per_token: 0, host_overhead_ms_per_token: 0 } };
  const prompts = trace.meta.prompts;
  for (let p = 0; p < prompts.length; p++) {
    const want = prompts[p].generated.slice(0, tokens);
    if (want.length < tokens) throw new Error(`the trace has ${want.length} generated tokens for prompt ${p}, the gate wants ${tokens}`);
    let got;
    try {
      got = await target.generate({ bundleDir, promptIds: prompts[p].prompt_tokens, maxNewTokens: tokens });
    } catch (e) {
      if (!(e instanceof NonFiniteLogitsError)) throw e;
      const message = `prompt ${p}: ${e.message}`;
      r.perPrompt.push({ matched: 0, total: tokens, nonFinite: message });
      r.total += tokens;
      r.nonFinite ??= message;
      continue;
    }
    let k = 0;
    while (k < tokens && got.generatedIds[k] === want[k]) k++;
    r.perPrompt.push({ matched: k, total: tokens });
    r.matched += k;
    r.total += tokens;
    if (k < tokens && !r.firstDivergence) {
      const step = prompts[p].prompt_tokens.length - 1 + k;
      const logits = await trace.get(p, step, 'logits');
      const theirs = got.generatedIds[k] ?? -1;
      r.firstDivergence = { prompt: p, step: k, hf: { token: want[k], logit: logits[want[k]] }, runtime: { token: theirs, hfLogit: theirs >= 0 ? logits[theirs] : NaN } };
    }
    r.timings.load_ms = Math.min(r.timings.load_ms, got.timings.load_ms);
    for (const key of ['prefill_ms', 'decode_ms_per_token', 'host_overhead_ms_per_token'] as const) r.timings[key] += got.timings[key] / prompts.length;
  }
  return r;
}

/** A variant passes with enough matched tokens and no refused (non-finite) logits. */
export function variantOk(v: VariantResult, minMatch: number): boolean {
  return !v.nonFinite && v.matched >= minMatch * v.total;
}

export const stage: StageModule<ParityParams> = {
  name: 'parity',
  version: '2',
  async run(ctx) {
    const p = ctx.params;
    const native = JSON.parse(readFileSync(join(ctx.inputs.native, 'native.json'), 'utf8')) as NativeRecord;
    const target = makeTarget(p.target, native.qhxGenerate, p.arch);
    const arch = getArch(p.arch);
    const checkpointDir = readCheckpointRef(ctx.inputs.checkpoint).absDir;
    const trace = await Trace.open(ctx.inputs.trace);
    const scratch = join(ctx.out, '.scratch');
    const variants: Record<string, VariantResult> = {};
    try {
      for (const v of p.variants) {
        ctx.log(`assembling and running the ${v} graphs on ${target.name}`);
        const bundle = join(scratch, v);
        const compiled = ctx.inputs.compile ? { compiled: readCompiled(ctx.inputs.compile) } : {};
        // On a CPU the graphs run in their CPU-gate form, as the oracle ran them: the same numbers,
        // without MatMulNBits' slow 8-bit kernel or fp32 copies of bf16 weights (cpu-form.ts).
        const graphsDir = compiled.compiled ? ctx.inputs[v] : join(scratch, `${v}.cpu-form`);
        if (!compiled.compiled) writeCpuFormExport(ctx.inputs[v], graphsDir);
        await assembleBundle({ recipe: p.recipe, arch, graphsDir, dataDigestsDir: ctx.inputs[v], embeddingDir: ctx.inputs.quantize, checkpointDir, maxNewTokens: p.tokens, ...compiled }, bundle);
        variants[v] = await checkParity(target, bundle, trace, p.tokens);
      }
    } finally {
      await trace.close();
      rmSync(scratch, { recursive: true, force: true });
    }
    const matched = Object.values(variants).reduce((a, v) => a + v.matched, 0);
    const total = Object.values(variants).reduce((a, v) => a + v.total, 0);
    const threshold = (v: string) => (v === 'quantize' && p.w8 ? p.w8.minMatch : p.minMatch);
    const ok = Object.entries(variants).every(([k, v]) => variantOk(v, threshold(k)));
    const nonFinite = Object.entries(variants).find(([, v]) => v.nonFinite);
    if (nonFinite) ctx.log(`${nonFinite[0]} graphs: ${nonFinite[1].nonFinite}`);
    const first = Object.entries(variants).find(([, v]) => v.firstDivergence);
    const summary = {
      target: target.name, matched, total,
      variants: Object.fromEntries(Object.entries(variants).map(([k, v]) => [k, { matched: v.matched, total: v.total, timings: v.timings }])),
      firstDivergence: first ? { variant: first[0], ...first[1].firstDivergence! } : null,
      ...(nonFinite ? { nonFinite: { variant: nonFinite[0], message: nonFinite[1].nonFinite! } } : {}),
      thresholds: Object.fromEntries(Object.keys(variants).map((k) => [k, threshold(k)])),
      ...(p.w8 ? { w8Why: p.w8.why } : {}),
    };
    await writeFile(join(ctx.out, 'parity.json'), JSON.stringify({ ok, ...summary, detail: variants }, null, 2));
    return { gate: { name: 'parity', ok }, summary: JSON.parse(JSON.stringify(summary)) };
  },
};
