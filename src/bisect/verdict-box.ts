// The box bisect.html opens with: what bisect found, in a few short rows a person reads without
// scrolling (the link of the chain, where the gate is left, the layer, the op and the matrix it
// multiplies, the proposed fix by tensor names, and whether a rebuild with it passed). The long
// finding (`message`) follows below the box; every figure here comes from the same BisectResult.
import type { BisectResult } from './run.js';
import { expertText } from './experts.js';
import type { Trial } from './fixes.js';
import { shortName } from './fixes.js';
import { divergenceText } from './runtime.js';
import { flipText } from '../gates/oracle.js';
import { runDivergenceText } from './runtime-run.js';
import { boundaryText } from './handoff.js';
import { sizeText } from '../units.js';

export interface VerdictBox {
  /** The word in the box's corner, and its colour. */
  word: 'NO FAULT' | 'FIX FOUND' | 'NOT FIXED' | 'EXPORT FAULT';
  tone: 'pass' | 'fixed' | 'fail';
  /** One line under the word: the link and the layer. */
  headline: string;
  rows: Array<[string, string]>;
}

/** What each link of the chain is, for a person who does not know forge's chain by heart. */
const LINKS: Record<string, string> = {
  export: 'the fp32 ONNX export already differs from HF',
  quantization: 'the shipped precision of the weights',
  'hand-off': 'the f16 residual passed between contexts',
  drift: 'small errors adding up along the free-running chain',
  runtime: 'the native runtime on this CPU (its KV cache and host code)',
  'compile/fp16': 'the compiled graph\'s fp16 arithmetic on the HTP',
  device: 'the runtime on the device',
};

const cos = (c: number) => c.toFixed(5);
/** A recipe pattern as the names it matches: `layers\.2/self_attn\.q_norm` → `layers.2/self_attn.q_norm`. */
export const patternText = (p: string) => p.replace(/\\(.)/g, '$1');

/** A fix by what it changes: tensor names with their precisions, op scopes rescaled, or the hand-off dtype. */
export function fixChanges(t: Trial, arch: string): string[] {
  return [
    ...t.tensors.map((x) => `${x.name}: ${x.from} → ${x.to}`),
    ...(t.rescale ?? []).map((x) => `rescale ${patternText(x.match)} by 2^${Math.log2(x.scale)}${t.what ? ` (${t.what})` : ''}`),
    ...(t.equalize ?? []).map((x) => `equalize ${patternText(x.match)}'s channels`),
    ...(t.handoff ? [`residual hand-off ${t.handoff} on ${arch}`] : []),
  ];
}

/** A fix in a line: its changes, or for many matrices (whole layers) its label and rungs, each matrix listed in the report's fix table. */
export function fixSummary(t: Trial, arch: string): string {
  if (t.tensors.length <= 4) return fixChanges(t, arch).join('; ');
  const rungs = [...new Set(t.tensors.map((x) => `${x.from} → ${x.to}`))].join(', ');
  return `${t.label}: ${t.tensors.length} matrices ${rungs}, each named under "The fix for the recipe"`;
}

/** What a fix costs, in words. */
export function fixCost(t: Trial): string {
  if (t.rescale) return `${t.addedOps ?? 0} op${t.addedOps === 1 ? '' : 's'} added, no weight bytes`;
  if (t.handoff) return `${t.handoffBytesPerToken} bytes per token of hand-off, no weight bytes`;
  if (t.equalize) return 'no weight bytes, no ops';
  return `${sizeText(t.addedBytes)} of weights added`;
}

/** Where the chain is first left, in one line. */
function whereText(r: BisectResult): string | undefined {
  const f = r.fault;
  if (f) {
    const seen = f.nonFinite ? `non-finite (${f.nonFinite})` : f.top1 ? `top-1 ${f.top1}` : `cosine ${cos(f.cosine)} < ${f.threshold}`;
    const step = r.steps?.first ? `, first at prompt ${r.steps.first.prompt} step ${r.steps.first.step}` : '';
    return `${f.variant} ${f.graph}${f.layer !== null ? ` layer ${f.layer}` : ''} ${f.output} (${f.what}): ${seen}${step}`;
  }
  const sf = r.simFault;
  if (sf) return `${sf.graph} ${sf.output} on the simulator: ${sf.nonFinite ?? `cosine ${cos(sf.cosine)} < ${sf.threshold}`}, while the CPU holds`;
  if (r.handoff?.boundary) return `the hand-off ${boundaryText(r.handoff.boundary)}`;
  const d = r.drift?.first;
  if (d) return `prompt ${d.prompt} step ${d.step}: HF picks ${d.hf.token} by ${d.hf.margin.toFixed(4)}, the shipped chain ${d.shippedToken}`;
  for (const [x, who] of [[r.device, r.device?.parity.target], [r.runtime, r.runtime?.parity.target]] as const) {
    if (x?.divergence) return divergenceText(x.divergence, who ?? '');
  }
  return undefined;
}

/** The op named, with the matrix it multiplies where it is a matmul of a checkpoint matrix. */
function opRow(r: BisectResult): string | undefined {
  const q = r.quantOp?.drop;
  if (q) {
    const matrix = q.matrix ? `, multiplying ${q.layer !== null ? shortName(q.matrix, q.layer) : q.matrix}` : '';
    return `${q.node} (${q.op}${matrix}): cosine ${cos(q.cosine)} from inputs at ${cos(q.inputsCosine)}`;
  }
  if (r.op) return `${r.op.node} (${r.op.op}${r.op.scope ? `, in ${r.op.scope}` : ''}): ${r.op.why}`;
  return undefined;
}

/** The expert named in a graph every layer shares (PhiMoE's experts), from the cases that read each. */
function expertRow(r: BisectResult): string | undefined {
  const e = r.experts?.figures[0];
  return e?.failing ? `layer ${r.experts!.layer}'s ${expertText(e, r.experts!.threshold)}` : undefined;
}

function layerRow(r: BisectResult): string | undefined {
  const at = r.fault?.layer ?? r.simFault?.layer ?? null;
  const layer = r.layer ?? r.op?.layer ?? r.quantOp?.layer ?? r.handoff?.boundary?.afterLayer ?? at;
  if (layer === undefined || layer === null) return r.fault && r.fault.layer === null ? `none: ${r.fault.graph} (every layer's outputs hold)` : undefined;
  return at !== null && at !== layer ? `${layer} (where the damage is done; the gate is first left at layer ${at}, which carries it)` : String(layer);
}

function verifiedRow(r: BisectResult): string {
  const c = r.chosen;
  if (c) {
    const onSimulator = !!r.simFault;
    const gate = onSimulator ? 'the simulator gate' : r.runtime?.routing ? "the parity gate (the runtime's own routing)" : 'the oracle gate';
    const threshold = onSimulator ? r.simulator?.threshold : r.thresholds.shipped;
    const figure = c.minCosine !== undefined ? `: min cosine ${cos(c.minCosine)}${threshold !== undefined ? ` ≥ ${threshold}` : ''}` : '';
    return `${c.ok ? 'yes' : 'no'}, rebuilt with the fix, ${gate} ${c.ok ? 'holds' : 'still fails'}${figure}${r.drift?.first ? ' and the chain follows HF again' : ''} (${r.fixes.length} of ${r.trials.length} candidates pass)`;
  }
  if (r.verdict === 'no-fault') return 'nothing to fix';
  return r.trials.length ? `no: none of ${r.trials.length} candidates passes` : 'no fix tried';
}

export function verdictBox(r: BisectResult): VerdictBox {
  const link = r.link ?? r.fault?.link ?? r.simFault?.link ?? r.handoff?.link;
  const word = r.verdict === 'no-fault' ? 'NO FAULT' : r.verdict === 'fixed' ? 'FIX FOUND' : r.verdict === 'export' ? 'EXPORT FAULT' : 'NOT FIXED';
  // --from a runtime run: the run can leave HF while every link bisect rebuilt follows it.
  const runLeft = !!r.run?.first;
  const tone = r.verdict === 'no-fault' ? (runLeft ? 'fixed' : 'pass') : r.verdict === 'fixed' ? 'fixed' : 'fail';
  const layer = layerRow(r);
  const headline = r.verdict === 'no-fault'
    ? `${r.recipe} for ${r.arch} on ${r.target}: every link tested follows HF${runLeft ? ', the run given does not' : ''}`
    : `${r.recipe} for ${r.arch} on ${r.target}: ${link ? `link ${link}` : 'a fault'}${layer && /^\d/.test(layer) ? `, layer ${layer.split(' ')[0]}` : ''}`;
  const rows: Array<[string, string | undefined]> = [
    ['the run', r.run ? runDivergenceText(r.run) : undefined],
    ['checked', r.verdict === 'no-fault' ? r.message.replace(/^.*?no fault: /, '').replace(/; worth a look: .*$/, '') : undefined],
    // Each thing still worth a look on its own row: the verdict stays one line.
    ...(r.verdict === 'no-fault' ? (r.warnings ?? []).map((w): [string, string] => ['worth a look', w.text]) : []),
    ['link', link ? `${link}: ${LINKS[link] ?? ''}`.replace(/: $/, '') : undefined],
    ['first left at', whereText(r)],
    ['layer', layer],
    ['op', opRow(r)],
    ['expert', expertRow(r)],
    ['routing', r.runtime?.routing?.length ? `the shipped router leaves HF's experts at ${flipText(r.runtime.routing[0])}` : undefined],
    ['proposed fix', r.chosen ? `${fixSummary(r.chosen, r.arch)} (${fixCost(r.chosen)})` : r.verdict === 'no-fault' ? undefined : 'none found'],
    ['verified', r.verdict === 'no-fault' ? undefined : verifiedRow(r)],
    ['recipe', r.applied ? `written into ${r.applied.file}` : r.chosen ? 'not changed: forge bisect --apply writes the fix into it' : undefined],
  ];
  return { word, tone, headline, rows: rows.filter((x): x is [string, string] => !!x[1]) };
}
