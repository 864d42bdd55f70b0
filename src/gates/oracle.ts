// Stage `oracle`: the teacher-forced gate. Every exported graph, at every traced step, is fed the
// HF inputs through onnxruntime-node; each output (and the residual after each layer, through a
// probe copy of the graph) is compared with HF by cosine, logits also by top-1. Fails with a
// per-layer table saved as oracle-table.md / oracle.json, and each input's largest logit error with
// its one-token graphs chained end to end (`logitError`: the bound below which an HF top-1/top-2
// margin is a near-tie for that precision).
import { readFileSync, rmSync } from 'node:fs';
import { top1Text } from './top1.js';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import type { StageModule } from '../engine/stage.js';
import type { FamilyId } from '../recipe/schema.js';
import { getFamily } from '../families/index.js';
import { gateCasesOf } from '../families/types.js';
import type { Family } from '../families/types.js';
import { GRAPHS_JSON, type ExportManifest, type GraphEntry } from '../export/graphs.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { Trace } from './trace.js';
import { copyName, gateSessionOptions, windowRows, writeGateModel, WINDOW_INPUT, type CacheWindow, type CpuFormOptions } from './cpu-form.js';
import { MASKED } from '../families/blocks.js';
import { parseStateInput } from '../families/state-io.js';
import type { ChainRunner, GateCase, RoutingFlip, RoutingTally } from '../families/types.js';
import { GateTally, layerOf } from './compare.js';
import { greedySteps, StepChain, type ChainDecisions } from './step-chain.js';
import { roundToF16 } from '../io/dtype.js';

export interface OracleParams {
  family: FamilyId;
  /** Which export inputs to check, each with its cosine threshold; `handoff`: the one shipped (its hand-off dtype is chosen). */
  variants: Array<{ input: string; minCosine: number; handoff?: boolean }>;
  /** Fraction of logit rows whose argmax must match HF. */
  minTop1: number;
  /**
   * The recipe's residual hand-off (schema `handoff`): with 'auto' or 'f16' the variant marked
   * `handoff` is also chained with f16 hand-offs and the gate chooses their dtype (`chooseHandoff`);
   * 'f16' fails the gate when f16 does not hold. Absent: float32, nothing more is run.
   */
  handoff?: 'f16' | 'auto';
}

/** The residual hand-off dtype the gate chose for a variant, and the chained figures it chose by. */
export interface HandoffChoice {
  dtype: 'float16' | 'float32';
  why: string;
  f32: { logitError?: number; decisions?: ChainDecisions };
  f16: { logitError?: number; decisions?: ChainDecisions };
}

/** Why a model whose graphs hand no residual stream between contexts (PhiMoE: the host routes between them) has no f16 hand-off. */
export const NO_HANDOFF = 'no residual is handed from one context to another in these graphs (the host routes between them): there is no hand-off to make f16';

/**
 * f16 holds when the one-token graphs chained with every hand-off between them rounded to f16 stay
 * finite and pick HF's greedy token at every step the float32 chain does: the hand-off then moves
 * no decision the parity gate checks.
 */
export function chooseHandoff(f32: StepChain, f16: StepChain, handsOver = true): HandoffChoice {
  const figures = (c: StepChain) => ({ ...(c.logitError !== undefined ? { logitError: c.logitError } : {}), ...(c.decisions ? { decisions: c.decisions } : {}) });
  const base = { f32: figures(f32), f16: figures(f16) };
  if (!handsOver) return { dtype: 'float32', why: NO_HANDOFF, ...base };
  if (f16.logitError === undefined) return { dtype: 'float32', why: 'the chain with f16 hand-offs held a non-finite logit (a residual past f16 range)', ...base };
  const [a, b] = [f32.decisions, f16.decisions];
  if (a && (!b || b.agree < a.agree)) return { dtype: 'float32', why: `f16 hand-offs pick HF's greedy token at ${b?.agree ?? 0}/${a.steps} steps, float32 at ${a.agree}/${a.steps}`, ...base };
  const err = (x: number | undefined) => (x === undefined ? '-' : x.toExponential(2));
  return { dtype: 'float16', why: `f16 hand-offs keep every greedy decision (${b ? `${b.agree}/${b.steps}` : 'no greedy steps'}); chained logit error ${err(f16.logitError)} vs float32 ${err(f32.logitError)}`, ...base };
}

export interface OracleRow {
  variant: string;
  graph: string;
  layer: string;
  output: string;
  what: string;
  minCosine: number;
  maxAbs: number;
  worst: string;
  /** Set when a compared value was NaN/Inf in forge's output or in the oracle: the row fails whatever its cosine. */
  nonFinite?: string;
  ok: boolean;
}

/**
 * Teacher-forced cases a one-token graph runs per call, as copies of the graph (cpu-form.ts): each
 * weight block is converted once for all of them. Measured at a real Qwen3-4B shard's size
 * (bench/README.md, 12 layers, maxContext 4096), CPU seconds per decode case: 1 per call 1.22 (fp32)
 * / 1.06 (W8), 8 per call 0.69 / 0.62, 16 per call 0.48 / 0.55; an lm-head case 4.5× (fp32) / 4.8×
 * (W8) less than alone (1 → 8 and 8 → 16 measured in two runs); private peak of the bench process
 * 0.61–0.69 GB alone, at most 0.77 GB with 16.
 */
export const GATE_COPIES = 16;

/** One case's feeds as the batch keeps them until its call: a copy of each, except the shared KV caches. */
function held(c: GateCase, shared: Set<string>): GateCase {
  const feeds: GateCase['feeds'] = {};
  // gateCases may refill a buffer in place for the next case: only the KV caches may be shared
  // (a case's own rows are all there, the later ones are masked: see runGateCases), the rest is copied.
  for (const [name, f] of Object.entries(c.feeds)) feeds[name] = shared.has(name) ? f : { ...f, data: f.data.slice() };
  return { ...c, feeds };
}

/** How the gate runs a graph's CPU form: cases per call (copies), the inputs they share, the cache window. */
export interface GateForm {
  copies: number;
  shared: Set<string>;
  window?: CacheWindow;
}

/** The kv-decoder's additive attention mask input (families/kv-decoder.ts binds it as `mask`). */
const MASK_INPUT = 'attn_mask';

/**
 * The form the gate runs `entry` in: a one-token graph as `copies` copies sharing its KV-cache
 * inputs, cut to the window its cases' masks open (cpu-form.ts); a multi-token graph one case a call,
 * whole. `windowed` false: the whole cache (tests compare the two).
 */
export function gateForm(entry: GraphEntry, copies: number, windowed = true): GateForm {
  // Copies share the caches that keep every position (maxContext slots, the mask's past part): a
  // ring cache's later rows overwrite earlier ones, so each copy gets its own.
  const mask = entry.inputs.find((t) => t.name === MASK_INPUT);
  const cache = entry.inputs.filter((t) => parseStateInput(t.name)?.recurrent === false && (!mask || t.shape[2] === mask.shape[3] - entry.n)).map((t) => t.name);
  const oneToken = entry.n === 1;
  const form: GateForm = { copies: oneToken ? copies : 1, shared: new Set(oneToken && copies > 1 ? cache : []) };
  if (windowed && oneToken && cache.length && entry.inputs.some((t) => t.name === MASK_INPUT)) form.window = { cache, mask: MASK_INPUT };
  return form;
}

/** writeGateModel's options for a graph run in `form`. */
export function formOptions(entry: GraphEntry, form: GateForm, blockBytes?: number): CpuFormOptions {
  return { tokensPerCall: entry.n, copies: form.copies, sharedInputs: [...form.shared], ...(form.window ? { window: form.window } : {}), ...(blockBytes ? { blockBytes } : {}) };
}

/**
 * Runs `cases` through a session of a graph's CPU form made for `form` (formOptions): with copies,
 * consecutive cases of one prompt per call; with a cache window, W fed per call from its cases' masks. They share the KV-cache inputs: gateCases fills one cache in place, so at the
 * call it holds the rows up to the last case's step, and an earlier case's attention mask hides the
 * rows past its own step (their softmax weights are exactly 0, as for the zeros it had alone): the
 * same numbers, which test/gates/cpu-form.test.ts holds bit for bit on the twins. `each` gets every
 * case with its outputs; `onCall` (timing) each call's case count, seconds in session.run and window.
 */
export async function runGateCases(
  session: ort.InferenceSession, file: string, cases: AsyncIterable<GateCase>, form: GateForm,
  each: (c: GateCase, output: (name: string) => Float32Array) => void, onCall?: (cases: number, runSeconds: number, window?: number) => void,
): Promise<void> {
  const { copies, shared, window } = form;
  const run = async (batch: GateCase[]) => {
    const feeds: Record<string, ort.Tensor> = {};
    let w: number | undefined;
    if (window) {
      const masks = batch.map((c) => c.feeds[window.mask].data as Float32Array);
      w = windowRows(masks, masks[0].length - 1, MASKED);
      feeds[WINDOW_INPUT] = new ort.Tensor('int64', BigInt64Array.of(BigInt(w)), [1]);
    }
    for (let b = 0; b < copies; b++) {
      const c = batch[Math.min(b, batch.length - 1)]; // a short batch repeats its last case; those outputs are not read
      for (const [name, f] of Object.entries(c.feeds)) {
        if (shared.has(name) && b > 0) continue;
        feeds[shared.has(name) ? name : copyName(name, b)] = new ort.Tensor(f.dtype, f.data, f.dims);
      }
    }
    const t = performance.now();
    const out = await session.run(feeds);
    onCall?.(batch.length, (performance.now() - t) / 1000, w);
    batch.forEach((c, b) => each(c, (name) => {
      const actual = out[copyName(name, b)];
      if (!actual) throw new Error(`${file} has no output ${name}`);
      return actual.data as Float32Array;
    }));
  };
  let batch: GateCase[] = [];
  for await (const c of cases) {
    if (batch.length && c.prompt !== batch[0].prompt) {
      await run(batch);
      batch = [];
    }
    batch.push(copies > 1 ? held(c, shared) : c);
    if (batch.length === copies) {
      await run(batch); // before the next case is drawn: it would fill the shared cache further
      batch = [];
    }
  }
  if (batch.length) await run(batch);
}

async function checkGraph<C>(family: Family<C>, config: C, dir: string, entry: GraphEntry, trace: Trace, maxContext: number, scratch: string, form: GateForm, chain: StepChain, half?: StepChain) {
  // The graph's CPU-gate form (its own numbers, fast CPU kernels, weights left mapped; see
  // cpu-form.ts) with the probe outputs, run with the session options that form is made for.
  const { path: model, stats } = writeGateModel(join(dir, entry.file), Object.keys(entry.probes), scratch, formOptions(entry, form));
  const session = await ort.InferenceSession.create(model, gateSessionOptions(form.copies));
  const tally = new GateTally(trace.meta.vocab);
  // A graph every layer shares is tallied per layer it served (one row each): the tally's key, and the output and layer it stands for.
  const served = new Map<string, { output: string; layer: number }>();
  const keyOf = (name: string, c: GateCase) => {
    if (!c.served) return name;
    const key = `${name} layer ${c.served.layer}`;
    served.set(key, { output: name, layer: c.served.layer });
    return key;
  };
  let cases = 0;
  try {
    const chained = StepChain.applies(entry);
    const firstLink = chained && StepChain.source(entry) === null;
    await runGateCases(session, entry.file, gateCasesOf(family, config, entry, trace, maxContext, dir), form, (c, output) => {
      for (const [name, expected] of Object.entries(c.expected)) tally.add(keyOf(name, c), output(name), expected, `${entry.name} prompt ${c.prompt} step ${c.step}${c.served ? ` layer ${c.served.layer}` : ''}`, c.masks?.[name], !c.placeholder);
      if (firstLink) {
        chain.record(entry, c, output);
        half?.record(entry, c, output);
      }
      cases++;
    });
    // The same graph again, fed the chain's hidden state instead of HF's (step-chain.ts).
    if (chained && !firstLink) {
      await runGateCases(session, entry.file, chain.cases(entry, gateCasesOf(family, config, entry, trace, maxContext, dir)), form, (c, output) => chain.record(entry, c, output));
    }
    // Once more with f16 hand-offs (the first graph's own input is the host's float32 rows).
    if (chained && !firstLink && half) {
      await runGateCases(session, entry.file, half.cases(entry, gateCasesOf(family, config, entry, trace, maxContext, dir)), form, (c, output) => half.record(entry, c, output));
    }
  } finally {
    await session.release();
  }
  return { acc: tally.outputs, served, tops: tally.top1, cases, kept: stats.kept, model };
}

function markdownTable(rows: OracleRow[], failed: boolean): string {
  const head = failed ? 'ORACLE GATE FAILED: rows marked ✗ are under their threshold or hold non-finite values.\n\n' : '';
  const lines = ['| variant | graph | layer | output | min cosine | max abs err | worst at | |', '|---|---|---|---|---|---|---|---|'];
  for (const r of rows) lines.push(`| ${r.variant} | ${r.graph} | ${r.layer} | ${r.output} (${r.what}) | ${r.minCosine.toFixed(7)} | ${r.maxAbs.toExponential(2)} | ${r.nonFinite ?? r.worst} | ${r.ok ? '✓' : '✗'} |`);
  return head + lines.join('\n') + '\n';
}

export interface OracleResult {
  ok: boolean;
  rows: OracleRow[];
  graphs: Record<string, { minCosine: number; ok: boolean; top1?: string }>;
  /** Nodes the CPU form left as exported (correct, but on ORT's slow kernels), as `variant/graph: node: why`. */
  slowNodes?: string[];
  /**
   * Per export input (`export` = the fp32 reference graphs, `quantize` = the shipped ones): the
   * largest |forge logit − HF logit| at any traced step with the input's one-token graphs chained
   * end to end (step-chain.ts: each fed the previous one's output, and HF's caches). The precision's
   * measured logit error: a step whose HF top-1 − top-2 margin is below twice this may flip its
   * token. Absent for an input whose chained logits held a non-finite value (no bound was measured).
   */
  logitError: Record<string, number>;
  /** Per export input, the graphs its logitError chained, in order. */
  logitChain: Record<string, string[]>;
  /** Per export input, whether its chained logits pick HF's greedy tokens (step-chain.ts). */
  decisions?: Record<string, ChainDecisions>;
  /**
   * Per export input checked for it, the residual hand-off dtype chosen. Where it is float16, that
   * input's logitError and decisions are the f16 chain's (what the shipped bundle hands over).
   */
  handoff?: Record<string, HandoffChoice>;
  /**
   * Per export input, for a family that routes on the host (PhiMoE): how often its router, fed the
   * chained graphs' numbers, picks HF's experts, and where it does not (Family.chain).
   */
  routing?: Record<string, RoutingTally>;
}

/** A routing flip in words: `step 7 layer 2 (HF's experts 1,3, the shipped router's 1,0; HF's own gap 0.0123)`. */
export const flipText = (f: RoutingFlip) => `step ${f.step} layer ${f.layer} (HF's experts ${f.hf.join(',')}, the shipped router's ${f.shipped.join(',')}; HF's own gap ${f.hfGap.toPrecision(3)})`;

/** A routing tally in a line, with its first `most` flips (none: the tally alone). */
export function routingText(r: RoutingTally, most = 3): string {
  const head = `the shipped router picks HF's experts at ${r.decisions - r.flips.length}/${r.decisions} decisions`;
  if (!r.flips.length || most === 0) return head;
  const named = r.flips.slice(0, most).map((f) => `prompt ${f.prompt} ${flipText(f)}`);
  return `${head}; routing flips at ${named.join(', ')}${r.flips.length > most ? ` and ${r.flips.length - most} more` : ''}`;
}

/**
 * Checks each variant's graphs against the trace. `variants` maps an export directory to its
 * threshold; `scratch` holds probe copies (same filesystem as the exports, removed after);
 * `copies`: cases per call of a one-token graph, `windowed` false: the whole KV cache each call
 * (bench/oracle.ts compares; the numbers are the same either way, and for any copies).
 */
export async function runOracleGate(
  familyId: FamilyId, checkpointDir: string, traceDir: string,
  variants: Array<{ label: string; dir: string; minCosine: number; handoff?: boolean }>, minTop1: number, scratch: string,
  progress: (done: number, total: number, label?: string) => void = () => {},
  copies = GATE_COPIES, windowed = true,
): Promise<OracleResult> {
  const family = getFamily(familyId) as Family<unknown>;
  const config = family.parseConfig(JSON.parse(readFileSync(join(checkpointDir, 'config.json'), 'utf8')), 'config.json');
  const trace = await Trace.open(traceDir);
  const rows: OracleRow[] = [];
  const graphs: OracleResult['graphs'] = {};
  const slowNodes: string[] = [];
  const logitError: Record<string, number> = {};
  const chains = new Map<string, StepChain>();
  const halves = new Map<string, StepChain>();
  // Each gated graph's CPU form (in scratch until the end), which a family's own chain runs again.
  const cpuForms = new Map<string, { model: string; form: GateForm }>();
  const routing: Record<string, RoutingTally> = {};
  // The variants with a graph that takes the residual from another context or gives it to one (quant/handoff.ts rewrites those).
  const handing = new Set<string>();
  let ok = true;
  try {
    const work = variants.flatMap((v) => {
      const manifest = JSON.parse(readFileSync(join(v.dir, GRAPHS_JSON), 'utf8')) as ExportManifest;
      return manifest.contexts.flatMap((c) => c.graphs.map((g) => ({ v, manifest, g })));
    });
    for (const { v, g } of work) if (g.stream && (g.stream.from !== null || g.stream.output)) handing.add(v.label);
    let done = 0;
    for (const { v, manifest, g } of work) {
      progress(done++, work.length, g.name);
      const variant = `${v.label}:${manifest.scheme}`;
      if (!chains.has(v.label)) chains.set(v.label, new StepChain(greedySteps(trace.meta.prompts)));
      if (v.handoff && !halves.has(v.label)) halves.set(v.label, new StepChain(greedySteps(trace.meta.prompts), roundToF16));
      const form = gateForm(g, copies, windowed && family.gateWindow !== false);
      const r = await checkGraph(family, config, v.dir, g, trace, manifest.maxContext, join(scratch, v.label), form, chains.get(v.label)!, halves.get(v.label));
      cpuForms.set(`${v.label}/${g.name}`, { model: r.model, form });
      if (r.cases === 0) throw new Error(`no traced step reaches ${g.name}: the trace is empty`);
      slowNodes.push(...r.kept.map((k) => `${variant}/${g.name}: ${k}`));
      let graphMin = Infinity;
      let graphOk = true;
      for (const [key, a] of r.acc) {
        const served = r.served.get(key);
        const output = served?.output ?? key;
        const { layer, what } = served ? { layer: String(served.layer), what: 'its output for this layer' } : layerOf(output in g.probes ? g.probes[output].name : output, g.last, g.first === g.last ? g.first : undefined);
        const rowOk = a.minCosine >= v.minCosine && !a.nonFinite;
        rows.push({ variant, graph: g.name, layer, output, what, minCosine: a.minCosine, maxAbs: a.maxAbs, worst: a.worst, ...(a.nonFinite ? { nonFinite: a.nonFinite } : {}), ok: rowOk });
        graphMin = Math.min(graphMin, a.minCosine);
        graphOk &&= rowOk;
      }
      const entry: { minCosine: number; ok: boolean; top1?: string } = { minCosine: graphMin, ok: graphOk };
      if (r.tops.rows) {
        entry.top1 = top1Text(r.tops);
        if (r.tops.agree < minTop1 * r.tops.rows) entry.ok = false;
      }
      ok &&= entry.ok;
      graphs[`${variant}/${g.name}`] = entry;
    }
    // A family whose graphs the host routes between chains them itself (its graphs have no residual stream for StepChain).
    if (family.chain) {
      for (const v of variants) {
        const mine = work.filter((w) => w.v === v);
        const chain = chains.get(v.label)!;
        const run: ChainRunner = async (entry, cases, each) => {
          if (chain.graphs.at(-1) !== entry.name) chain.graphs.push(entry.name);
          const gated = cpuForms.get(`${v.label}/${entry.name}`);
          if (!gated) throw new Error(`oracle: ${entry.name} of ${v.label} was not gated, so the chain has no CPU form of it`);
          const { model, form } = gated;
          const session = await ort.InferenceSession.create(model, gateSessionOptions(form.copies));
          try {
            await runGateCases(session, entry.file, cases, form, each);
          } finally {
            await session.release();
          }
        };
        const notes = await family.chain(config, mine.map((w) => w.g), trace, mine[0].manifest.maxContext, v.dir, run, (c, got) => chain.logits(c, got));
        if (notes?.routing) routing[v.label] = notes.routing;
      }
    }
  } finally {
    await trace.close();
    rmSync(scratch, { recursive: true, force: true });
  }
  const num = (s: string) => (s === '-' ? Infinity : Number(s));
  rows.sort((a, b) => a.variant.localeCompare(b.variant) || a.graph.localeCompare(b.graph) || num(a.layer) - num(b.layer) || a.output.localeCompare(b.output));
  for (const [label, chain] of chains) if (chain.logitError !== undefined) logitError[label] = chain.logitError;
  const logitChain = Object.fromEntries([...chains].map(([label, chain]) => [label, chain.graphs]));
  const decisions = Object.fromEntries([...chains].flatMap(([label, chain]) => (chain.decisions ? [[label, chain.decisions]] : [])));
  const handoff: Record<string, HandoffChoice> = {};
  for (const [label, half] of halves) {
    handoff[label] = chooseHandoff(chains.get(label)!, half, handing.has(label));
    if (handoff[label].dtype !== 'float16') continue;
    // The shipped bundle hands over f16: the parity gates' tie bound is that chain's error.
    if (half.logitError !== undefined) logitError[label] = half.logitError;
    if (half.decisions) decisions[label] = half.decisions;
  }
  return { ok, rows, graphs, slowNodes, logitError, logitChain, decisions, ...(halves.size ? { handoff } : {}), ...(Object.keys(routing).length ? { routing } : {}) };
}

/** The first failed row, in layer order: where the graph first leaves the oracle (a non-finite value first of all). */
export function firstMiss(rows: OracleRow[]): OracleRow | undefined {
  return rows.find((r) => r.nonFinite) ?? rows.find((r) => !r.ok);
}

export const stage: StageModule<OracleParams> = {
  name: 'oracle',
  version: '5',
  async run(ctx) {
    const { family, variants, minTop1, handoff } = ctx.params;
    const ref = readCheckpointRef(ctx.inputs.checkpoint);
    const result = await runOracleGate(family, ref.absDir, ctx.inputs.trace,
      variants.map((v) => ({ label: v.input, dir: ctx.inputs[v.input], minCosine: v.minCosine, ...(handoff && v.handoff ? { handoff: true } : {}) })), minTop1, join(ctx.out, '.scratch'), ctx.progress);
    for (const [label, choice] of Object.entries(result.handoff ?? {})) {
      ctx.log(`hand-off for ${label}: ${choice.dtype} (${choice.why})`);
      if (handoff === 'f16' && choice.dtype !== 'float16') {
        result.ok = false;
        ctx.log(choice.why === NO_HANDOFF
          ? `the recipe requires f16 hand-offs (handoff: f16) and ${NO_HANDOFF}: set handoff to 'auto' or 'f32'`
          : `the recipe requires f16 hand-offs and they do not hold for ${label}: set handoff to 'auto' (or 'f32')`);
      }
    }
    await writeFile(join(ctx.out, 'oracle.json'), JSON.stringify(result, null, 2));
    await writeFile(join(ctx.out, 'oracle-table.md'), markdownTable(result.rows, !result.ok));
    for (const [label, r] of Object.entries(result.routing ?? {})) ctx.log(`routing for ${label}: ${routingText(r)}`);
    for (const s of result.slowNodes ?? []) ctx.log(`left on ORT's slow kernel (the CPU form does not cover it): ${s}`);
    const bad = firstMiss(result.rows);
    if (bad) ctx.log(bad.nonFinite ? `non-finite: ${bad.variant} ${bad.nonFinite}` : `first miss: ${bad.variant} ${bad.graph} layer ${bad.layer} ${bad.output} cosine ${bad.minCosine}`);
    return {
      gate: { name: 'oracle', ok: result.ok },
      summary: {
        graphs: result.graphs,
        logitError: result.logitError,
        logitChain: result.logitChain,
        ...(result.routing ? { routing: Object.fromEntries(Object.entries(result.routing).map(([k, r]) => [k, { decisions: r.decisions, flips: r.flips.length }])) } : {}),
        ...(result.handoff ? { handoff: Object.fromEntries(Object.entries(result.handoff).map(([k, c]) => [k, { dtype: c.dtype, why: c.why }])) } : {}),
        ...(bad ? { firstMiss: { variant: bad.variant, graph: bad.graph, layer: bad.layer, output: bad.output, cosine: bad.minCosine, ...(bad.nonFinite ? { nonFinite: bad.nonFinite } : {}) } } : {}),
      },
    };
  },
};
