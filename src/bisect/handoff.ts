// forge bisect: the hand-off link. A recipe may ship the residual that one context gives the next
// (shard → shard → lm-head) as f16 (`handoff: f16 | auto`); the oracle gate chains the shipped
// one-token graphs with every hand-off rounded to f16 and keeps f16 only when that chain stays finite
// and picks HF's greedy tokens (gates/oracle.ts chooseHandoff). Its result says that f16 failed, not
// where: this module chains the same graphs again, float32 and f16, and names the hand-off (the
// context boundary: the giving graph and its last layer) and the first traced step where the f16
// chain leaves HF — a residual past f16's range (|value| > 65504 rounds to Inf), or, when every
// hand-off stays in range, the first greedy step that f16 flips and float32 does not, with margins.
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { gateCasesOf } from '../families/types.js';
import type { Family } from '../families/types.js';
import type { GateCase } from '../families/types.js';
import { GRAPHS_JSON, type ExportManifest, type GraphEntry } from '../export/graphs.js';
import { Trace } from '../gates/trace.js';
import { gateSessionOptions, writeGateModel } from '../gates/cpu-form.js';
import { formOptions, gateForm, runGateCases, GATE_COPIES } from '../gates/oracle.js';
import { greedySteps, StepChain } from '../gates/step-chain.js';
import { roundToF16 } from '../io/dtype.js';

/** A finite float32 |value| that a hand-off as f16 turns into Inf (past 65504 by more than half an ulp: roundToF16's own rounding decides the edge). */
export const pastF16 = (m: number) => Number.isFinite(m) && !Number.isFinite(roundToF16(Float32Array.of(m))[0]);

/** One hand-off between contexts: the residual `value` that graph `from` gives graph `to`. */
export interface HandoffBoundary {
  /** The trace value handed over (`h.3`: the residual after layer 2). */
  value: string;
  from: string;
  to: string;
  /** The giving graph's last layer: the hand-off is after it. */
  afterLayer: number | null;
  /** The largest finite |value| the float32 chain hands over here, over every traced step, and where. */
  maxAbs: number;
  maxAt: string;
  /** Traced steps whose residual here is past f16's range (its own, not an Inf carried from an earlier hand-off). */
  overflowSteps: number;
  steps: number;
}

export interface HandoffStep {
  prompt: number;
  step: number;
  kind: 'non-finite' | 'greedy-flip';
  /** non-finite: the hand-off that overflowed first, in model order, and its largest |value| at that step. */
  boundary?: string;
  maxAbs?: number;
  /** greedy-flip: HF's token and margin (top-1 − runner-up), and each chain's margin for HF's token (negative: another wins). */
  hf?: { token: number; margin: number };
  f32Margin?: number;
  f16Margin?: number;
  f16Token?: number;
}

export interface HandoffScan {
  boundaries: HandoffBoundary[];
  /** The first traced step (prompt, then step order) where the f16 chain leaves HF; absent when it does not in this scan. */
  first?: HandoffStep;
  /** The hand-off bisect names: the one that overflows first, or for a flip the first whose f16 alone flips a decision. */
  boundary?: HandoffBoundary;
  /** Why no single hand-off is named, when none is. */
  unnamed?: string;
  /** Hidden size: a float32 hand-off costs 2 bytes × hidden more per hand-off per token than f16. */
  hidden: number;
}

const key = (c: Pick<GateCase, 'prompt' | 'step'>) => `${c.prompt}:${c.step}`;
const order = (k: string) => k.split(':').map(Number);
const byStep = (a: string, b: string) => order(a)[0] - order(b)[0] || order(a)[1] - order(b)[1];

function argmax(x: Float32Array, skip = -1): number {
  let best = -1;
  for (let i = 0; i < x.length; i++) if (i !== skip && (best < 0 || x[i] > x[best])) best = i;
  return best;
}

/** At a step that chose a token: HF's token and margin, and the chain's margin for it and own choice. */
export interface Decision { hfToken: number; hfMargin: number; margin: number; token: number }

interface ChainRun {
  decisions: Map<string, Decision>;
  /** Per hand-off value, per step: the largest |entry| handed over, NaN when the row already held a non-finite value. */
  handed: Map<string, Map<string, number>>;
}

function maxAbsOf(row: Float32Array): number {
  let m = 0;
  for (const v of row) {
    if (!Number.isFinite(v)) return NaN;
    m = Math.max(m, Math.abs(v));
  }
  return m;
}

async function* fed(cases: AsyncIterable<GateCase>, input: string, rows: Map<string, Float32Array>, graph: string): AsyncIterable<GateCase> {
  for await (const c of cases) {
    const row = rows.get(key(c));
    const feed = c.feeds[input];
    if (!row || !feed) throw new Error(`forge bisect: no chained ${input} for ${graph} at prompt ${c.prompt} step ${c.step}`);
    yield { ...c, feeds: { ...c.feeds, [input]: { ...feed, data: row } } };
  }
}

/** The variant's one-token graphs on the residual stream, in the manifest's (model) order: the chain the oracle runs. */
export function chainGraphs(manifest: ExportManifest): GraphEntry[] {
  return manifest.contexts.flatMap((c) => c.graphs).filter((g) => StepChain.applies(g));
}

/**
 * Runs the chain once over every traced step; `round(value)` says whether the hand-off of that
 * residual is f16 (rounded as roundToF16 does) or float32.
 */
async function runChain<C>(family: Family<C>, config: C, exportDir: string, manifest: ExportManifest, trace: Trace, scratch: string, round: (value: string) => boolean): Promise<ChainRun> {
  const greedy = greedySteps(trace.meta.prompts);
  const rows = new Map<string, Map<string, Float32Array>>();
  const run: ChainRun = { decisions: new Map(), handed: new Map() };
  for (const g of chainGraphs(manifest)) {
    const s = g.stream!;
    const form = gateForm(g, GATE_COPIES, family.gateWindow !== false);
    const { path } = writeGateModel(join(exportDir, g.file), [], join(scratch, g.name), formOptions(g, form));
    const session = await ort.InferenceSession.create(path, gateSessionOptions(form.copies));
    const cases = gateCasesOf(family, config, g, trace, manifest.maxContext, exportDir);
    const source = s.from === null ? null : rows.get(s.from);
    if (s.from !== null && !source) throw new Error(`forge bisect: ${g.name} reads ${s.from}, which no earlier one-token graph wrote (graphs.json lists the graphs out of model order)`);
    const out = new Map<string, Float32Array>();
    const handed = new Map<string, number>();
    try {
      await runGateCases(session, g.file, source ? fed(cases, s.input, source, g.name) : cases, form, (c, output) => {
        if (s.output && s.to) {
          const row = output(s.output);
          handed.set(key(c), maxAbsOf(row));
          out.set(key(c), round(s.to) ? roundToF16(row) : row.slice());
        }
        const want = c.expected.logits;
        if (!want || !greedy(c.prompt, c.step)) return;
        const got = output('logits');
        const hfToken = argmax(want);
        const token = argmax(got);
        run.decisions.set(key(c), { hfToken, hfMargin: want[hfToken] - want[argmax(want, hfToken)], margin: got[hfToken] - got[argmax(got, hfToken)], token });
      });
    } finally {
      await session.release();
    }
    if (s.to) {
      rows.set(s.to, out);
      run.handed.set(s.to, handed);
    }
  }
  return run;
}

/** A decision the f16 chain loses where float32 keeps it (a non-finite f16 logit loses it too). */
const flips = (f32: Decision | undefined, f16: Decision | undefined) => !!f32 && f32.token === f32.hfToken && (!f16 || f16.token !== f16.hfToken || !Number.isFinite(f16.margin));

/** The first step (`prompt:step`, prompt then step order) whose decision float32 hand-offs keep and f16 ones lose. */
export function firstFlip(f32: Pick<ChainRun, 'decisions'>, f16: Pick<ChainRun, 'decisions'>): string | undefined {
  return [...f32.decisions.keys()].sort(byStep).find((k) => flips(f32.decisions.get(k), f16.decisions.get(k)));
}

/**
 * Chains the shipped graphs of `exportDir` with float32 and with f16 hand-offs and says where the
 * f16 chain leaves HF. For a greedy flip without an overflow, each hand-off is also tried alone as f16.
 */
export async function scanHandoffs<C>(family: Family<C>, config: C, traceDir: string, exportDir: string, scratch: string): Promise<HandoffScan> {
  const manifest = JSON.parse(readFileSync(join(exportDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  const graphs = chainGraphs(manifest);
  // A hand-off is a residual one chained graph gives and a later one takes.
  const edges = graphs.flatMap((g) => {
    const taker = g.stream!.to ? graphs.find((t) => t.stream!.from === g.stream!.to) : undefined;
    return taker ? [{ value: g.stream!.to!, from: g, to: taker }] : [];
  });
  const trace = await Trace.open(traceDir);
  try {
    const f32 = await runChain(family, config, exportDir, manifest, trace, join(scratch, 'f32'), () => false);
    const f16 = await runChain(family, config, exportDir, manifest, trace, join(scratch, 'f16'), () => true);
    // Overflows are measured on the float32 chain: each hand-off's own residual, none carried.
    const boundaries: HandoffBoundary[] = edges.map((e) => {
      const per = f32.handed.get(e.value) ?? new Map<string, number>();
      let maxAbs = 0, maxAt = '', overflowSteps = 0;
      for (const [k, m] of per) {
        if (m > maxAbs) [maxAbs, maxAt] = [m, k];
        if (pastF16(m)) overflowSteps++;
      }
      const [p, s] = order(maxAt || '0:0');
      return { value: e.value, from: e.from.name, to: e.to.name, afterLayer: e.from.last ?? null, maxAbs, maxAt: `prompt ${p} step ${s}`, overflowSteps, steps: per.size };
    });
    const hidden = trace.meta.hidden;
    const overflowAt = (b: HandoffBoundary, k: string) => pastF16(f32.handed.get(b.value)?.get(k) ?? 0);
    const overflowKeys = [...new Set(boundaries.flatMap((b) => [...(f32.handed.get(b.value)?.keys() ?? [])].filter((k) => overflowAt(b, k))))].sort(byStep);
    if (overflowKeys.length) {
      const k = overflowKeys[0];
      const b = boundaries.find((x) => overflowAt(x, k))!;
      const [prompt, step] = order(k);
      return { boundaries, boundary: b, first: { prompt, step, kind: 'non-finite', boundary: b.value, maxAbs: f32.handed.get(b.value)!.get(k)! }, hidden };
    }
    const k = firstFlip(f32, f16);
    if (!k) return { boundaries, hidden, unnamed: 'the f16 chain stays finite and keeps every greedy decision float32 keeps in this scan' };
    const [prompt, step] = order(k);
    const a = f32.decisions.get(k)!, h = f16.decisions.get(k);
    const first: HandoffStep = { prompt, step, kind: 'greedy-flip', hf: { token: a.hfToken, margin: a.hfMargin }, f32Margin: a.margin, ...(h ? { f16Margin: h.margin, f16Token: h.token } : {}) };
    // Which hand-off moves it: each alone as f16, the first in model order that loses a decision.
    for (const b of boundaries) {
      const alone = await runChain(family, config, exportDir, manifest, trace, join(scratch, `alone-${b.value}`), (v) => v === b.value);
      if (firstFlip(f32, alone)) return { boundaries, first, boundary: b, hidden };
    }
    return { boundaries, first, hidden, unnamed: 'no hand-off alone as f16 flips a decision: only all of them together do' };
  } finally {
    await trace.close();
    rmSync(scratch, { recursive: true, force: true });
  }
}

/** The hand-off as the report says it: `h.3, after layer 2 (decoder_0 → decoder_1)`. */
export const boundaryText = (b: HandoffBoundary) => `${b.value}${b.afterLayer !== null ? `, after layer ${b.afterLayer}` : ''} (${b.from} → ${b.to})`;
