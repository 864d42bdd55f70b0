// Stage `parity`: the strongest gate. The native runtime (qhx_generate, where the decode loop lives)
// runs each graph set greedily from HF's prompt tokens, teacher-forced on HF's greedy tokens: step k
// is fed HF's token k-1 whatever the runtime chose, so the comparison goes on past a mismatch, and
// the runtime's own choice at every step is compared with HF's (the oracle trace). Every mismatch is
// reported with HF's logits at that step. A mismatch is a tie when HF's own margin there (HF logit of
// HF's token − HF logit of the runtime's) is within what the precision's measured logit error can
// move (tieMargin); any other mismatch fails, and the recipe bounds the ties (maxTies, default 0).
// `matched` is the free-running prefix: the tokens equal to HF's before the first mismatch (forced
// decoding feeds the same tokens as a free run up to there). On a phone (adb) the bundle is the
// device bundle: the compiled QNN contexts of the shipped graphs, as `forge build` ships them.
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import type { FamilyId } from '../recipe/schema.js';
import { assembleBundle, readCompiled, TEXT_MANIFEST } from '../bundle/assemble.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { hostTarget } from '../targets/host.js';
import { adbTarget } from '../targets/adb.js';
import { NonFiniteLogitsError, type Target } from '../targets/target.js';
import { getArch } from '../arch/table.js';
import { Trace, type TracePrompt } from './trace.js';
import { writeCpuFormExport } from './cpu-form.js';
import { TRACE_AUDIO, TRACE_IMAGES } from './trace-stage.js';
import { checkPixels, type PixelCheck } from './pixels.js';
import { checkAudioFeatures, type AudioFeatureCheck } from './audio-features.js';
import type { NativeRecord } from './native-stage.js';

export type TargetSpec = { kind: 'host' } | { kind: 'adb'; serial: string; runner: string; libDir: string };

export interface ParityParams {
  recipe: { id: string; family: FamilyId };
  arch: string;
  tokens: number;
  /** Fraction of steps (teacher-forced) whose token equals HF's or is a tie; 1 means N/N. Every variant. */
  minMatch: number;
  /** Ties allowed per variant (and target); above 0 only with the recipe's reason. */
  maxTies: number;
  tiesWhy?: string;
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

/** One step where the runtime chose another token than HF, with HF's margin between the two. */
export interface Mismatch extends Divergence {
  /** HF logit of HF's token − HF logit of the runtime's token (NaN when the runtime gave no token). */
  margin: number;
  tie: boolean;
}

/** Mismatches listed per variant in parity.json and the run record; the count says how many there were. */
export const MAX_LISTED_MISMATCHES = 20;

export interface VariantResult {
  /** Tokens equal to HF's before each prompt's first mismatch (the free-running prefix), summed. */
  matched: number;
  total: number;
  perPrompt: Array<{ matched: number; total: number; mismatches?: number; nonFinite?: string }>;
  firstDivergence: Divergence | null;
  /** Mismatches within the tie margin, and all mismatches (ties included). */
  ties: number;
  mismatchCount: number;
  /** The first MAX_LISTED_MISMATCHES mismatches, in prompt and step order. */
  mismatches: Mismatch[];
  /** The precision's largest |logit − HF logit| (null when none was measured: then nothing is a tie), and 2× it. */
  logitError: number | null;
  tieMargin: number | null;
  /** The runtime refused NaN/Inf logits (first prompt where it did, and its message): the variant fails whatever it matched. */
  nonFinite?: string;
  /** Means over the prompts; load_ms is the fastest start-up (a device's first run after a push also hashes every file). */
  timings: { load_ms: number; prefill_ms: number; decode_ms_per_token: number; host_overhead_ms_per_token: number };
}

/**
 * The widest HF margin a mismatch may have and still be a tie: twice the largest logit error the
 * precision showed against HF, because both logits of the pair may move by up to that error, in
 * opposite directions (HF's token down, the runtime's up), and so swap their order. Null (no tie
 * possible) when no finite error was measured.
 */
export function tieMarginFor(logitError: number | null | undefined): number | null {
  return typeof logitError === 'number' && Number.isFinite(logitError) && logitError >= 0 ? 2 * logitError : null;
}

/** The rule the gate applies, in words, for parity.json and the card. */
export function parityRule(minMatch: number, maxTies: number): string {
  const others = minMatch >= 1 ? 'any other mismatch fails' : `other mismatches fail beyond ${Math.round((1 - minMatch) * 100)}% of the steps (recipe minMatch ${minMatch})`;
  return 'every step teacher-forced on HF\'s greedy token, the runtime\'s own choice compared with HF\'s at each; ' +
    'a mismatch is a tie when HF\'s margin there (HF logit of HF\'s token − HF logit of the runtime\'s) is at most 2 × the precision\'s ' +
    `measured largest |logit − HF logit| (both logits may move by that much, in opposite directions); ${others}; ` +
    `at most ${maxTies} tie${maxTies === 1 ? '' : 's'} per variant`;
}

/** Per qhx_generate call on the host: a real-size model's prefill and 64 tokens on one CPU thread take minutes. */
const HOST_CALL_TIMEOUT_S = 1800;

function makeTarget(spec: TargetSpec, qhxGenerate: string, arch: string): Target {
  if (spec.kind === 'host') return hostTarget(qhxGenerate, HOST_CALL_TIMEOUT_S);
  return adbTarget({ serial: spec.serial, arch: getArch(arch), runner: spec.runner, libDir: spec.libDir });
}

/**
 * Runs one bundle over every traced prompt, teacher-forced on HF's greedy tokens, and compares the
 * runtime's choice at every step with HF's; `logitError` is the precision's measured largest logit
 * error (the tie margin is twice it).
 */
export async function checkParity(target: Target, bundleDir: string, trace: Trace, tokens: number, logitError: number | null,
  o: { manifest?: string; prompts?: (p: TracePrompt) => boolean } = {}): Promise<VariantResult> {
  const tieMargin = tieMarginFor(logitError);
  const r: VariantResult = {
    matched: 0, total: 0, perPrompt: [], firstDivergence: null, ties: 0, mismatchCount: 0, mismatches: [],
    logitError: tieMargin === null ? null : logitError, tieMargin,
    timings: { load_ms: Infinity, prefill_ms: 0, decode_ms_per_token: 0, host_overhead_ms_per_token: 0 },
  };
  const prompts = trace.meta.prompts;
  const runs = prompts.filter((x) => !o.prompts || o.prompts(x)).length;
  for (let p = 0; p < prompts.length; p++) {
    if (o.prompts && !o.prompts(prompts[p])) continue;
    const want = prompts[p].generated.slice(0, tokens);
    if (want.length < tokens) throw new Error(`the trace has ${want.length} generated tokens for prompt ${p}, the gate wants ${tokens}`);
    let got;
    try {
      // An image or audio prompt runs on the file the oracle traced (the trace stage keeps it beside the trace).
      const media = {
        ...(prompts[p].image ? { image: join(trace.dir, TRACE_IMAGES, prompts[p].image!.file) } : {}),
        ...(prompts[p].audio ? { audio: join(trace.dir, TRACE_AUDIO, prompts[p].audio!.file) } : {}),
      };
      got = await target.generate({ bundleDir, promptIds: prompts[p].prompt_tokens, maxNewTokens: tokens, forceIds: want, ...media, ...(o.manifest ? { manifest: o.manifest } : {}) });
    } catch (e) {
      if (!(e instanceof NonFiniteLogitsError)) throw e;
      const message = `prompt ${p}: ${e.message}`;
      r.perPrompt.push({ matched: 0, total: tokens, nonFinite: message });
      r.total += tokens;
      r.nonFinite ??= message;
      continue;
    }
    let prefix = -1;
    let mismatches = 0;
    for (let k = 0; k < tokens; k++) {
      const theirs = got.generatedIds[k] ?? -1;
      if (theirs === want[k]) continue;
      if (prefix < 0) prefix = k;
      mismatches++;
      const logits = await trace.get(p, prompts[p].prompt_tokens.length - 1 + k, 'logits');
      const hfLogit = theirs >= 0 && theirs < logits.length ? logits[theirs] : NaN;
      const margin = logits[want[k]] - hfLogit;
      const m: Mismatch = { prompt: p, step: k, hf: { token: want[k], logit: logits[want[k]] }, runtime: { token: theirs, hfLogit }, margin, tie: tieMargin !== null && margin <= tieMargin };
      if (m.tie) r.ties++;
      r.mismatchCount++;
      if (r.mismatches.length < MAX_LISTED_MISMATCHES) r.mismatches.push(m);
      if (!r.firstDivergence) r.firstDivergence = { prompt: m.prompt, step: m.step, hf: m.hf, runtime: m.runtime };
    }
    const matched = prefix < 0 ? tokens : prefix;
    r.perPrompt.push({ matched, total: tokens, ...(mismatches ? { mismatches } : {}) });
    r.matched += matched;
    r.total += tokens;
    r.timings.load_ms = Math.min(r.timings.load_ms, got.timings.load_ms);
    for (const key of ['prefill_ms', 'decode_ms_per_token', 'host_overhead_ms_per_token'] as const) r.timings[key] += got.timings[key] / runs;
  }
  return r;
}

/**
 * A variant passes with no refused (non-finite) logits, at least minMatch of its steps equal to HF's
 * token or a tie (minMatch 1, every recipe's: no mismatch beyond the tie margin at all), and at most
 * maxTies ties.
 */
export function variantOk(v: VariantResult, minMatch: number, maxTies: number): boolean {
  const held = v.total - (v.mismatchCount - v.ties);
  return !v.nonFinite && held >= minMatch * v.total && v.ties <= maxTies;
}

/** The oracle gate's largest |logit − HF logit| per export input (oracle.json `logitError`). */
export function oracleLogitErrors(oracleDir: string): Record<string, number | null> {
  const o = JSON.parse(readFileSync(join(oracleDir, 'oracle.json'), 'utf8')) as { logitError?: Record<string, number | null> };
  if (!o.logitError) throw new Error(`${join(oracleDir, 'oracle.json')} has no logitError: the oracle stage predates it (rebuild it)`);
  return o.logitError;
}

/** The gate's record: per variant its verdict, counts and tie margin; the mismatches listed (capped) with their count; the rule. */
export function paritySummary(target: string, variants: Record<string, VariantResult>, p: Pick<ParityParams, 'minMatch' | 'maxTies' | 'tiesWhy'>) {
  const entries = Object.entries(variants);
  const sum = (f: (v: VariantResult) => number) => entries.reduce((a, [, v]) => a + f(v), 0);
  const nonFinite = entries.find(([, v]) => v.nonFinite);
  const first = entries.find(([, v]) => v.firstDivergence);
  return {
    target, matched: sum((v) => v.matched), total: sum((v) => v.total),
    ties: sum((v) => v.ties), maxTies: p.maxTies, ...(p.tiesWhy && p.maxTies > 0 ? { tiesWhy: p.tiesWhy } : {}),
    rule: parityRule(p.minMatch, p.maxTies),
    variants: Object.fromEntries(entries.map(([k, v]) => [k, {
      ok: variantOk(v, p.minMatch, p.maxTies), matched: v.matched, total: v.total, ties: v.ties, mismatches: v.mismatchCount,
      logitError: v.logitError, tieMargin: v.tieMargin, timings: v.timings,
    }])),
    mismatches: {
      count: sum((v) => v.mismatchCount),
      listed: entries.flatMap(([k, v]) => v.mismatches.map((m) => ({ variant: k, ...m }))).slice(0, MAX_LISTED_MISMATCHES),
    },
    firstDivergence: first ? { variant: first[0], ...first[1].firstDivergence! } : null,
    ...(nonFinite ? { nonFinite: { variant: nonFinite[0], message: nonFinite[1].nonFinite! } } : {}),
    thresholds: { minMatch: p.minMatch, maxTies: p.maxTies },
  };
}

export const stage: StageModule<ParityParams> = {
  name: 'parity',
  version: '3',
  async run(ctx) {
    const p = ctx.params;
    const native = JSON.parse(readFileSync(join(ctx.inputs.native, 'native.json'), 'utf8')) as NativeRecord;
    const target = makeTarget(p.target, native.qhxGenerate, p.arch);
    const arch = getArch(p.arch);
    const checkpointDir = readCheckpointRef(ctx.inputs.checkpoint).absDir;
    // The precision's largest logit error against HF, as the oracle gate measured it, per variant.
    const logitErrors = oracleLogitErrors(ctx.inputs.oracle);
    const trace = await Trace.open(ctx.inputs.trace);
    const scratch = join(ctx.out, '.scratch');
    const variants: Record<string, VariantResult> = {};
    let pixels: PixelCheck[] = [];
    let audio: AudioFeatureCheck[] = [];
    const textManifest: Record<string, VariantResult> = {};
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
        variants[v] = await checkParity(target, bundle, trace, p.tokens, logitErrors[v] ?? null);
        // The runtime's image front-end against HF's processor, on the files the oracle traced (once: every variant shares it).
        if (!pixels.length && trace.meta.prompts.some((x) => x.image)) {
          pixels = await checkPixels(join(native.buildDir, 'qhx_pixels'), JSON.parse(readFileSync(join(bundle, 'manifest.json'), 'utf8')), trace);
          for (const c of pixels) ctx.log(`pixels of ${c.image}: cosine ${c.cosine.toFixed(7)}, max |error| ${c.maxAbs.toExponential(2)} against Hugging Face's processor`);
        }
        // Likewise the audio front-end against HF's feature extractor.
        if (!audio.length && trace.meta.prompts.some((x) => x.audio)) {
          audio = await checkAudioFeatures(join(native.buildDir, 'qhx_features'), trace);
          for (const c of audio) ctx.log(`features of ${c.clip}: cosine ${c.cosine.toFixed(7)}, max |error| ${c.maxAbs.toExponential(2)} against Hugging Face's feature extractor${c.ok ? '' : ' — FAIL'}`);
        }
        // A vision bundle's text-only manifest (the encoder left out) on the text prompts: what a text app runs.
        if (existsSync(join(bundle, TEXT_MANIFEST))) {
          textManifest[v] = await checkParity(target, bundle, trace, p.tokens, logitErrors[v] ?? null, { manifest: TEXT_MANIFEST, prompts: (x) => !x.image && !x.audio });
          const t = textManifest[v];
          ctx.log(`${v} under ${TEXT_MANIFEST}: ${t.matched}/${t.total} before the first mismatch on the text prompts; ${t.mismatchCount} mismatches, ${t.ties} ties`);
        }
        const r = variants[v];
        ctx.log(`${v}: ${r.matched}/${r.total} before the first mismatch; ${r.mismatchCount} mismatch${r.mismatchCount === 1 ? '' : 'es'} teacher-forced, ${r.ties} tie${r.ties === 1 ? '' : 's'} (tie margin ${r.tieMargin ?? 'none: no logit error measured'})`);
      }
    } finally {
      await trace.close();
      rmSync(scratch, { recursive: true, force: true });
    }
    const text = Object.keys(textManifest).length ? paritySummary(target.name, textManifest, p) : undefined;
    const summary = { ...paritySummary(target.name, variants, p), ...(pixels.length ? { pixels } : {}), ...(audio.length ? { audioFeatures: audio } : {}), ...(text ? { textManifest: { file: TEXT_MANIFEST, ...text } } : {}) };
    const ok = Object.values(summary.variants).every((v) => v.ok) && pixels.every((c) => c.ok) && audio.every((c) => c.ok) && (!text || Object.values(text.variants).every((v) => v.ok));
    if (summary.nonFinite) ctx.log(`${summary.nonFinite.variant} graphs: ${summary.nonFinite.message}`);
    await writeFile(join(ctx.out, 'parity.json'), JSON.stringify({ ok, ...summary, detail: variants }, null, 2));
    return { gate: { name: 'parity', ok }, summary: JSON.parse(JSON.stringify(summary)) };
  },
};
