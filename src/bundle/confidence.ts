// How confident the reference is along the traced continuations, beside the logit error each
// precision showed: the "Confidence" figures of the model card and the build report. A step whose HF
// top-1 − top-2 margin is below twice a precision's largest logit error is a near-tie: each of the
// two logits may move by up to that error, so that precision may pick the other token there.
import type { MarginSummary, TraceMeta } from '../gates/trace.js';
import type { OracleResult } from '../gates/oracle.js';

export interface LogitError {
  /** Which graphs: "fp32 reference" or "shipped (w8)". */
  precision: string;
  /** Where the error was measured. */
  where: string;
  /** The graphs whose `logits` output it is (each fed HF's own inputs). */
  graphs: string[];
  /** Largest |forge logit − HF logit| over the traced cases. */
  error: number;
}

export interface Confidence {
  margins: MarginSummary;
  /** Every generated token's margin, prompt after prompt. */
  stepMargins: number[];
  prompts: number;
  errors: LogitError[];
}

type EmulationJson = { ran?: boolean; simulator?: { fp16?: boolean }; oracle?: { graphs: Record<string, { outputs?: Record<string, { maxAbs: number | null }> }> } };

/** The emulation gate's teacher-forced logits error (emulation.json): the largest over the graphs with a `logits` output, and those graphs. */
export function simulatorLogitError(emulation: EmulationJson): { error: number; graphs: string[] } | undefined {
  if (!emulation.ran || !emulation.oracle) return undefined;
  let error: number | undefined;
  const graphs: string[] = [];
  for (const [name, g] of Object.entries(emulation.oracle.graphs)) {
    const e = g.outputs?.logits?.maxAbs;
    if (e === undefined) continue;
    // JSON writes a non-finite error as null: that gate failed, there is no bound to show.
    if (e === null || !Number.isFinite(e)) return undefined;
    error = Math.max(error ?? 0, e);
    graphs.push(name);
  }
  return error === undefined ? undefined : { error, graphs };
}

const ORACLE_WHERE = 'oracle gate (ONNX Runtime CPU, each step end to end on the traced tokens and caches)';

/**
 * The figures, from the trace's metadata, the oracle's result (its graph keys name each input's
 * scheme: `quantize:w8/lm_head`; its rows, the graphs with logits) and, when the simulator gate
 * ran, emulation.json.
 */
export function buildConfidence(trace: Pick<TraceMeta, 'prompts' | 'margins'>, oracle: Pick<OracleResult, 'logitError' | 'graphs' | 'rows'> & Partial<Pick<OracleResult, 'logitChain'>>, emulation?: EmulationJson): Confidence {
  const scheme = (input: string) => Object.keys(oracle.graphs).find((k) => k.startsWith(`${input}:`))?.split('/')[0].slice(input.length + 1);
  const name = (input: string) => (input === 'export' ? 'fp32 reference' : input === 'quantize' ? `shipped (${scheme(input) ?? '?'})` : input);
  const logitGraphs = (input: string) => oracle.rows.filter((r) => r.output === 'logits' && r.variant.startsWith(`${input}:`)).map((r) => r.graph);
  const errors: LogitError[] = Object.entries(oracle.logitError).map(([input, error]) => ({ precision: name(input), where: ORACLE_WHERE, graphs: oracle.logitChain?.[input] ?? logitGraphs(input), error }));
  const sim = emulation ? simulatorLogitError(emulation) : undefined;
  if (sim) errors.push({ precision: name('quantize'), where: `emulation gate (x86 HTP simulator${emulation?.simulator?.fp16 ? ', fp16 activations' : ''}, teacher-forced)`, ...sim });
  return { margins: trace.margins, stepMargins: trace.prompts.flatMap((p) => p.margins), prompts: trace.prompts.length, errors };
}

/** Steps whose margin is below twice `error`: where that error may flip HF's token. */
export function nearTies(c: Pick<Confidence, 'stepMargins'>, error: number): number {
  return c.stepMargins.filter((m) => m < 2 * error).length;
}

/** A margin in three significant digits, as a plain decimal down to 1e-4. */
export const fmtMargin = (x: number) => (x !== 0 && Math.abs(x) < 1e-4 ? x.toExponential(2) : String(Number(x.toPrecision(3))));
const code = (s: string) => (s.includes('`') ? `\`\` ${s} \`\`` : `\`${s}\``);

/** The distribution in one sentence (markdown). */
export function marginSentence(c: Confidence): string {
  const m = c.margins;
  const s = m.smallest;
  return `Hugging Face fp32's top-1 − top-2 logit margin at each of the ${m.count} greedy steps the gates trace (${c.prompts} prompt${c.prompts === 1 ? '' : 's'}): `
    + `min ${fmtMargin(m.min)}, p5 ${fmtMargin(m.p5)}, median ${fmtMargin(m.p50)}, max ${fmtMargin(m.max)}; `
    + `${m.below_fp16_spacing} below ${fmtMargin(m.fp16_spacing)} (2⁻⁸, fp16's spacing between 4 and 8), ${m.below_0_1} below 0.1. `
    + `Smallest: prompt ${s.prompt}, step ${s.step} (generated token ${s.generated_index}), token ${s.token} ${code(JSON.stringify(s.token_text))} over ${s.runner_up} ${code(JSON.stringify(s.runner_up_text))} by ${fmtMargin(s.margin)}.`;
}

export const MEANING = 'A step whose margin is below twice a precision\'s largest logit error is a near-tie: an error of that size on each of the two logits may flip the token there; a larger margin cannot be overturned by it.';

/** What a teacher-forced error leaves out, where the logits come from a graph of their own. */
export const SCOPE = 'The oracle\'s error is one step end to end: the graphs listed run in order, each fed the previous one\'s output, with Hugging Face\'s tokens and caches, so every layer\'s error (e.g. its quantization) is in it. The simulator\'s is teacher-forced per graph: the graph producing the logits is fed Hugging Face\'s own inputs, so where that is a separate lm-head the decoder layers\' error is not in it.';

/** The error table: precision, where measured, the graphs with logits, largest error, near-ties. */
export function errorTable(c: Confidence): { head: string[]; rows: string[][] } {
  return {
    head: ['graphs', 'measured in', 'logits of', 'largest logit error', 'near-ties (margin < 2 × error)'],
    rows: c.errors.map((e) => [e.precision, e.where, e.graphs.join(', '), e.error.toExponential(2), `${nearTies(c, e.error)}/${c.stepMargins.length}`]),
  };
}

/** The card's section, as markdown lines. */
export function confidenceSection(c: Confidence): string[] {
  const t = errorTable(c);
  return [
    '## Confidence', '', marginSentence(c), '',
    `| ${t.head.join(' | ')} |`, `|${t.head.map(() => '---').join('|')}|`,
    ...t.rows.map((r) => `| ${r.join(' | ')} |`), '', `${MEANING} ${SCOPE}`, '',
  ];
}
