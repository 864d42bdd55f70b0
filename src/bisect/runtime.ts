// forge bisect: the links after the ONNX graphs (issue 17). The oracle chain and the TypeScript drift
// scan feed the shipped graphs HF's past K/V rows; the parity gate runs the native runtime
// (qhx_generate, its decode loop in C++) teacher-forced on HF's greedy tokens with its own KV cache
// and host code (embedding lookup, the hand-offs between graphs). When both hold and the runtime's
// choice still leaves HF's, the link is `runtime`; on a phone (`--target adb`), with the host
// runtime and the x86 simulator holding, it is `device`. This module reads parity.json and names
// the step; it runs nothing.
import type { Mismatch, paritySummary, VariantResult } from '../gates/parity.js';
import type { DriftResult } from './drift.js';
import type { RoutingFlip } from '../families/types.js';

/** The chain's links in order; bisect names the first that breaks. */
export type Link = 'export' | 'quantization' | 'hand-off' | 'drift' | 'runtime' | 'compile/fp16' | 'device';

/**
 * What bisect learnt of each link, in chain order: `undefined` where that link was not run (a later
 * link is only built when the earlier ones hold, or the target does not reach it).
 */
export interface LinkVerdicts {
  /** The oracle gate's first miss (its link; hand-off when only the f16 hand-off chain failed it), or null when it holds. */
  oracle: 'export' | 'quantization' | 'hand-off' | null;
  /** The TypeScript-chained shipped graphs leave HF's greedy path. */
  drift?: boolean;
  /** The native runtime on the host CPU holds parity (no failure, no mismatch beyond the tie margin). */
  runtime?: boolean;
  /** The x86 HTP simulator's gate holds. */
  simulator?: boolean;
  /** The runtime on the phone holds parity. */
  device?: boolean;
}

/** The first broken link, or null when every link that was run holds. Pure: the decision bisect reports. */
export function firstBrokenLink(v: LinkVerdicts): Link | null {
  if (v.oracle) return v.oracle;
  if (v.drift === true) return 'drift';
  if (v.runtime === false) return 'runtime';
  if (v.simulator === false) return 'compile/fp16';
  if (v.device === false) return 'device';
  return null;
}

/** parity.json as the parity stage writes it. */
export type ParityJson = ReturnType<typeof paritySummary> & { ok: boolean; detail: Record<string, VariantResult> };

/** A variant's run stays on HF's path: every mismatch within the tie margin, no refused logits. */
const variantHolds = (v: VariantResult) => v.mismatchCount === v.ties && !v.nonFinite;

/** A run holds when its gate passed and no step left HF beyond the tie margin (a recipe with minMatch < 1 may pass with such steps). */
export function parityHolds(p: Pick<ParityJson, 'ok' | 'detail'>): boolean {
  return p.ok && Object.values(p.detail).every(variantHolds);
}

/**
 * The gate failed only on ties: every mismatch within the tie margin (HF's own margin there smaller
 * than the precision's measured logit error can move), more of them than the recipe allows. Not a
 * fault of any link: HF hesitates at those steps.
 */
export function tiesOnly(p: Pick<ParityJson, 'ok' | 'detail'>): boolean {
  const vs = Object.values(p.detail);
  return !p.ok && vs.every(variantHolds) && vs.some((v) => v.ties > 0);
}

/** What one runtime did at one step: HF's token, a token within the tie margin, another, or unknown (past the listed mismatches). */
export type StepVerdict =
  | { verdict: 'hf' }
  | { verdict: 'tie' | 'other'; token: number; margin: number }
  | { verdict: 'non-finite'; message: string }
  | { verdict: 'unknown'; why: string };

/** One variant's verdict at prompt `prompt`, generated token `step` (parity's step numbering). */
export function verdictAt(v: VariantResult, prompt: number, step: number): StepVerdict {
  const pp = v.perPrompt[prompt];
  if (pp?.nonFinite) return { verdict: 'non-finite', message: pp.nonFinite };
  const m = v.mismatches.find((x) => x.prompt === prompt && x.step === step);
  if (m) return { verdict: m.tie ? 'tie' : 'other', token: m.runtime.token, margin: m.margin };
  // Only the first MAX_LISTED_MISMATCHES are kept: past them, a step of a prompt with mismatches is not known.
  const listedAll = v.mismatches.length === v.mismatchCount;
  const last = v.mismatches[v.mismatches.length - 1];
  const beyond = !listedAll && last && (prompt > last.prompt || (prompt === last.prompt && step > last.step));
  if (beyond && (pp?.mismatches ?? 0) > 0) return { verdict: 'unknown', why: `past the ${v.mismatches.length} mismatches listed of ${v.mismatchCount}` };
  return { verdict: 'hf' };
}

export const verdictText = (s: StepVerdict | undefined): string => {
  if (!s) return 'not run';
  if (s.verdict === 'hf') return "HF's token";
  if (s.verdict === 'non-finite') return `non-finite logits (${s.message})`;
  if (s.verdict === 'unknown') return `unknown (${s.why})`;
  return `${s.token} (${s.verdict === 'tie' ? 'a tie' : 'beyond the tie margin'}: HF margin ${s.margin.toFixed(4)})`;
};

/** The first step where a runtime left HF, with what HF and the runtime gave there. */
export interface RuntimeDivergence {
  variant: string;
  prompt: number;
  /** The generated token's index (parity's step); `position` is the traced position (the drift scan's step). */
  step: number;
  position: number;
  /** HF's token, its runner-up and HF's margin between them (the trace's). */
  hf: { token: number; runnerUp?: number; margin?: number };
  /** The runtime's token; `hfMargin` = HF logit of HF's token − HF logit of the runtime's; `tie` when within `tieMargin`. */
  runtime: { token: number; hfMargin: number; tie: boolean; tieMargin: number | null };
  /** The run refused non-finite logits (first prompt's message): it has no step. */
  nonFinite?: string;
}

/** The step to name: the fp32 graphs' first (precision cannot fix those), else the shipped ones'; a non-tie first, else the first tie. */
export function firstDivergence(p: Pick<ParityJson, 'detail' | 'variants'>, promptLengths: number[], hfSteps?: Array<{ prompt: number; step: number; hf: { token: number; runnerUp: number; margin: number } }>): RuntimeDivergence | undefined {
  const order = ['export', ...Object.keys(p.detail).filter((k) => k !== 'export')].filter((k) => p.detail[k]);
  for (const variant of order) {
    const v = p.detail[variant];
    // A variant that holds (no failure, nothing beyond the tie margin) is not the one to name.
    if (p.variants[variant]?.ok !== false && variantHolds(v)) continue;
    const m: Mismatch | undefined = v.mismatches.find((x) => !x.tie) ?? v.mismatches[0];
    if (!m) {
      if (v.nonFinite) return { variant, prompt: -1, step: -1, position: -1, hf: { token: -1 }, runtime: { token: -1, hfMargin: NaN, tie: false, tieMargin: v.tieMargin }, nonFinite: v.nonFinite };
      continue;
    }
    const position = promptLengths[m.prompt] - 1 + m.step;
    const hf = hfSteps?.find((s) => s.prompt === m.prompt && s.step === position);
    return {
      variant, prompt: m.prompt, step: m.step, position,
      hf: { token: m.hf.token, ...(hf ? { runnerUp: hf.hf.runnerUp, margin: hf.hf.margin } : {}) },
      runtime: { token: m.runtime.token, hfMargin: m.margin, tie: m.tie, tieMargin: v.tieMargin },
    };
  }
  return undefined;
}

/** A parity run in brief, for bisect.json. */
export function paritySnapshot(p: ParityJson) {
  return {
    ok: p.ok, holds: parityHolds(p), tiesOnly: tiesOnly(p), target: p.target, matched: p.matched, total: p.total, ties: p.ties, mismatches: p.mismatches.count,
    variants: Object.fromEntries(Object.entries(p.variants).map(([k, v]) => [k, { ok: v.ok, matched: v.matched, total: v.total, ties: v.ties, mismatches: v.mismatches, tieMargin: v.tieMargin }])),
  };
}
export type ParitySnapshot = ReturnType<typeof paritySnapshot>;

export interface RuntimeFindings {
  /** The host runtime's parity run (target host). */
  parity: ParitySnapshot;
  divergence?: RuntimeDivergence;
  /** The TypeScript chain of the shipped graphs at the same step (the drift scan's), HF's past K/V rows fed. */
  chain?: { shippedToken: number; shippedMargin: number };
  /** At the divergent step: per layer, its part of HF logit[HF's token] − logit[the runtime's] moved by the shipped graphs (drift.ts's attribution). */
  attribution?: { layers: NonNullable<DriftResult['layers']>; logitDelta: NonNullable<DriftResult['logitDelta']> };
  /** A family that routes on the host: the chained router's flips in the divergent prompt up to that step, the likeliest first (routing.ts). */
  routing?: RoutingFlip[];
}

export interface DeviceFindings {
  parity: ParitySnapshot;
  divergence?: RuntimeDivergence;
  /** At the device's divergent step: the x86 simulator's and the host runtime's choice. */
  simulatorAt?: StepVerdict;
  hostAt?: StepVerdict;
  /** Why bisect goes no further on a device. */
  note: string;
}

export const DEVICE_NOTE = 'no op-level resolution on a device: the phone returns tokens only (no activations), so bisect names the step, not a graph or an op';

const f4 = (x: number | undefined) => (x === undefined || Number.isNaN(x) ? '-' : x.toFixed(4));

/** The step in words: prompt, step, HF's token and margin, the runtime's token and whether it is a tie. */
export function divergenceText(d: RuntimeDivergence, who: string): string {
  if (d.nonFinite) return `the ${d.variant} graphs on ${who} gave non-finite logits (${d.nonFinite})`;
  return `the ${d.variant} graphs on ${who} leave HF first at prompt ${d.prompt} step ${d.step}: HF picks ${d.hf.token}${d.hf.margin !== undefined ? ` by a margin of ${f4(d.hf.margin)} over ${d.hf.runnerUp}` : ''}, the run picks ${d.runtime.token} (HF's logit gap between the two ${f4(d.runtime.hfMargin)}, ${d.runtime.tie ? 'within' : 'beyond'} the tie margin ${d.runtime.tieMargin === null ? '(none measured)' : f4(d.runtime.tieMargin)})`;
}

/** The runtime link's message head: the step, the TS chain's margin there and what differs between the two. */
export function runtimeMessage(r: RuntimeFindings): string {
  const d = r.divergence;
  const step = d ? divergenceText(d, 'the native runtime') : `the native runtime's parity fails (${r.parity.matched}/${r.parity.total} before the first mismatch)`;
  const chain = r.chain ? `; the TypeScript chain of the shipped graphs at that step picks ${r.chain.shippedToken} (its margin for HF's token ${f4(r.chain.shippedMargin)})` : '';
  const fp32 = d?.variant === 'export' ? '; the fp32 graphs diverge too: no precision change can fix that' : '';
  return `link runtime: every teacher-forced graph holds and the TypeScript-chained shipped graphs follow HF's greedy path (fed HF's past K/V rows), yet ${step}${chain}; what differs: the runtime's own KV cache carried across steps and its host code (embedding lookup, the hand-offs between graphs)${fp32}`;
}

export function deviceMessage(d: DeviceFindings): string {
  const step = d.divergence ? divergenceText(d.divergence, `the device (${d.parity.target})`) : `the device's parity fails (${d.parity.matched}/${d.parity.total})`;
  const sim = d.divergence && !d.divergence.nonFinite ? `; at that step the x86 simulator gave ${verdictText(d.simulatorAt)}, the host runtime ${verdictText(d.hostAt)}` : '';
  return `link device: the host runtime and the x86 HTP simulator hold, ${step}${sim}: the phone's HTP or its libraries (QNN, ORT) differ from the x86 simulator's; ${DEVICE_NOTE}`;
}

/** The drift scan's step at a runtime divergence (same prompt and traced position). */
export function chainAt(drift: DriftResult | undefined, d: RuntimeDivergence | undefined): RuntimeFindings['chain'] {
  const s = d && drift?.steps.find((x) => x.prompt === d.prompt && x.step === d.position);
  return s ? { shippedToken: s.shippedToken, shippedMargin: s.shippedMargin } : undefined;
}
