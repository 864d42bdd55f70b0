// The last screen of `forge build`: the verdict, read off the run record. One line per gate with its
// headline figure against its threshold (oracle: min cosine per variant; parity: matched/total and
// ties per variant; emulation: min cosine and parity on the simulator; the hand-off dtype when one
// was chosen), then the bundle's size and context count, and where the report and run record are.
// The per-stage time table is for --verbose; so are forge's own diagnostics (memory prediction
// misses), which the run record keeps either way.
import type { GateRecord, RunRecord } from '../engine/record.js';
import type { StageRecord } from '../engine/run.js';
import { loadRecipe } from '../recipe/load.js';
import { shippedMinCosine, type LayerQuant } from '../recipe/schema.js';
import { sizeText, took } from '../units.js';

export interface VerdictOptions {
  /** Adds the per-stage table (status, seconds, shared cache) and the memory prediction misses. */
  verbose?: boolean;
  /**
   * The oracle's min-cosine threshold for a variant (`export`, `fp32`; `quantize`, `w8`), which the
   * record does not carry. Default: the recipe's, as the build used it.
   */
  oracleThreshold?: (label: string, scheme: string) => number | undefined;
}

export type Obj = Record<string, unknown>;
export const isObj = (v: unknown): v is Obj => !!v && typeof v === 'object' && !Array.isArray(v);
export const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) ? v : undefined);
/** A cosine to 7 decimals, as the card and report show it; one below 1 is never shown as a perfect 1.0000000. */
export const cos = (c: number) => (c < 1 && c.toFixed(7) === '1.0000000' ? '0.9999999' : c.toFixed(7));
const GATE_WIDTH = 10;

/** The recipe's oracle threshold for a variant, as nightly reads it; undefined when the recipe cannot be loaded. */
export function recipeOracleThreshold(recipeId: string): (label: string, scheme: string) => number | undefined {
  let o: ReturnType<typeof loadRecipe>['recipe']['gates']['oracle'] | undefined;
  try {
    o = loadRecipe(recipeId).recipe.gates.oracle;
  } catch {
    o = undefined;
  }
  return (label, scheme) => {
    if (!o) return undefined;
    if (label === 'export' || scheme === 'fp32') return o.fp32MinCosine;
    return ['w8', 'w4', 'auto', 'fp16'].includes(scheme) ? shippedMinCosine(o, scheme as LayerQuant) : undefined;
  };
}

/** The stage table `forge build --verbose` prints above the verdict. */
export function stageTable(stages: StageRecord[]): string[] {
  return stages.map((s) => {
    const status = s.source === 'remote' ? 'cached (remote)' : s.status;
    return `${s.name.padEnd(12)} ${status.padEnd(9)} ${took(s.seconds, s.queuedSeconds)}${s.remote ? `  remote: ${s.remote}` : ''}${s.evicted ? `  ${s.evicted}` : ''}`;
  });
}

function gateLine(name: string, verdict: string, text: string): string {
  return `  ${name.padEnd(GATE_WIDTH)} ${verdict.padEnd(7)}  ${text}`.trimEnd();
}

function oracleText(g: GateRecord, threshold: (label: string, scheme: string) => number | undefined): string {
  const graphs = isObj(g.graphs) ? g.graphs : {};
  // Per variant (`quantize:w8` of `quantize:w8/shard0.decode`), the smallest of its graphs' cosines.
  const variants = new Map<string, number>();
  const failed: string[] = [];
  for (const [key, e] of Object.entries(graphs)) {
    if (!isObj(e)) continue;
    const c = num(e.minCosine);
    const variant = key.includes('/') ? key.slice(0, key.indexOf('/')) : key;
    variants.set(variant, Math.min(variants.get(variant) ?? Infinity, c ?? Infinity));
    if (e.ok === false) failed.push(`${key}${c !== undefined ? ` cosine ${cos(c)}` : ''}${typeof e.top1 === 'string' ? ` top-1 ${e.top1}` : ''}`);
  }
  const parts = [...variants].map(([variant, min]) => {
    const [label, scheme = ''] = variant.split(':');
    const t = threshold(label, scheme);
    return `${variant} ${Number.isFinite(min) ? cos(min) : 'no figure'}${t !== undefined ? ` (threshold ${t})` : ''}`;
  });
  let text = parts.length ? `min cosine vs HF fp32: ${parts.join(', ')}` : 'no graph figures in the record';
  if (failed.length) text += `; failed: ${failed.join(', ')}`;
  const miss = isObj(g.firstMiss) ? g.firstMiss : undefined;
  if (miss) text += `; first miss: ${miss.variant} ${miss.graph} layer ${miss.layer} ${miss.output}${num(miss.cosine) !== undefined ? ` (cosine ${cos(num(miss.cosine)!)})` : ''}${miss.nonFinite ? ` non-finite: ${String(miss.nonFinite)}` : ''}`;
  return text;
}

/** "≤ 0 ties, no other mismatch" from the recipe's parity thresholds (per variant). */
export function parityRuleText(minMatch: number | undefined, maxTies: number | undefined): string {
  const ties = maxTies === undefined ? '' : `≤ ${maxTies} tie${maxTies === 1 ? '' : 's'}`;
  const others = minMatch === undefined ? '' : minMatch >= 1 ? 'no other mismatch' : `other mismatches on ≤ ${Math.round((1 - minMatch) * 100)}% of steps`;
  return [ties, others].filter(Boolean).join(', ');
}

export function matchedText(v: Obj): string {
  const mismatches = num(v.mismatches) ?? (isObj(v.mismatches) ? num(v.mismatches.count) : undefined);
  const ties = num(v.ties) ?? 0;
  const more = mismatches ? `, ${mismatches} mismatch${mismatches === 1 ? '' : 'es'} (${ties} tie${ties === 1 ? '' : 's'})` : `, ${ties} tie${ties === 1 ? '' : 's'}`;
  // Tokens equal to HF's of all (every step is teacher-forced), and, when some differ, the free-running prefix before the first.
  const total = num(v.total);
  const equal = total !== undefined && mismatches !== undefined ? total - mismatches : num(v.matched);
  const prefix = mismatches ? ` (the first ${num(v.matched) ?? '?'} in a row)` : '';
  return `${equal ?? '?'}/${total ?? '?'} equal to HF${prefix}${more}`;
}

function parityText(g: GateRecord): string {
  const variants = isObj(g.variants) ? g.variants : {};
  const parts = Object.entries(variants).filter(([, v]) => isObj(v)).map(([name, v]) => `${name} ${matchedText(v as Obj)}${(v as Obj).ok === false ? ' FAIL' : ''}`);
  const t = isObj(g.thresholds) ? g.thresholds : {};
  const rule = parityRuleText(num(t.minMatch), num(t.maxTies));
  let text = `greedy vs HF on ${typeof g.target === 'string' ? g.target : 'the runtime'}: ${parts.join('; ') || 'no variants in the record'}${rule ? ` (threshold: ${rule})` : ''}`;
  // Where it failed: the first listed mismatch that is not a tie (or the first tie), with HF's margin there.
  const listed = isObj(g.mismatches) && Array.isArray(g.mismatches.listed) ? (g.mismatches.listed as Obj[]) : [];
  const m = g.ok === false ? listed.find((x) => x.tie === false) ?? listed[0] : undefined;
  if (m && isObj(m.hf) && isObj(m.runtime)) {
    const margin = num(m.margin);
    text += `; first: ${String(m.variant ?? 'shipped')} prompt ${String(m.prompt)} generated token ${String(m.step)}: HF ${String(m.hf.token)}${margin !== undefined ? ` (HF's margin ${margin.toExponential(1)})` : ''}, the runtime ${String(m.runtime.token)}${m.tie ? ', a tie' : ''}`;
  }
  if (isObj(g.nonFinite)) text += `; non-finite in ${String(g.nonFinite.variant)}: ${String(g.nonFinite.message)}`;
  return text;
}

function emulationText(g: GateRecord): string {
  const graphs = isObj(g.graphs) ? g.graphs : {};
  let worst: { name: string; c: number } | undefined;
  const failed: string[] = [];
  for (const [name, e] of Object.entries(graphs)) {
    if (!isObj(e)) continue;
    const c = num(e.minCosine);
    if (c !== undefined && (!worst || c < worst.c)) worst = { name, c };
    if (e.ok === false) failed.push(`${name}${c !== undefined ? ` cosine ${cos(c)}` : ''}${typeof e.top1 === 'string' ? ` top-1 ${e.top1}` : ''}`);
  }
  const t = isObj(g.thresholds) ? g.thresholds : {};
  const minCosine = num(t.minCosine);
  const parts = [`min cosine ${worst ? `${cos(worst.c)} at ${worst.name}` : 'none'}${minCosine !== undefined ? ` (threshold ${minCosine})` : ''}`];
  if (isObj(g.parity)) {
    const rule = parityRuleText(num(t.minMatch), num(t.maxTies));
    parts.push(`parity ${matchedText(g.parity)}${g.parity.ok === false ? ' FAIL' : ''}${rule ? ` (threshold: ${rule})` : ''}`);
  }
  const ms = num(g.msPerToken);
  if (ms !== undefined) parts.push(`${ms.toFixed(1)} ms/token simulated`);
  if (failed.length) parts.push(`failed: ${failed.join(', ')}`);
  return `on the x86 HTP simulator: ${parts.join(', ')}`;
}

/** The hand-off dtype chosen between contexts: the handoff stage's, else the oracle's choice per variant. */
function handoffText(r: RunRecord): string | undefined {
  const stage = r.summaries?.handoff;
  if (isObj(stage) && typeof stage.dtype === 'string') return `${stage.dtype} residual between contexts${typeof stage.why === 'string' ? ` (${stage.why})` : ''}`;
  const chosen = isObj(r.gates?.oracle?.handoff) ? (r.gates.oracle.handoff as Obj) : undefined;
  if (!chosen) return undefined;
  const parts = Object.entries(chosen).filter(([, c]) => isObj(c)).map(([label, c]) => `${label} ${String((c as Obj).dtype)}${typeof (c as Obj).why === 'string' ? ` (${(c as Obj).why})` : ''}`);
  return parts.length ? `residual between contexts: ${parts.join('; ')}` : undefined;
}

function gateText(name: string, g: GateRecord, threshold: (label: string, scheme: string) => number | undefined): string {
  if (name === 'oracle') return oracleText(g, threshold);
  if (name === 'parity') return parityText(g);
  if (name === 'emulation') return g.ran === false ? `not run: ${String(g.reason ?? '')}` : emulationText(g);
  return Object.entries(g).filter(([k, v]) => k !== 'ok' && typeof v !== 'object').map(([k, v]) => `${k} ${String(v)}`).join(', ');
}

/** The bundle's size, file count and context count, from the bundle and compile (else plan) summaries. */
export function bundleFacts(r: RunRecord): string[] {
  const b = isObj(r.summaries?.bundle) ? r.summaries.bundle : {};
  const compile = isObj(r.summaries?.compile) ? r.summaries.compile : {};
  const plan = isObj(r.summaries?.plan) ? r.summaries.plan : {};
  const contexts = Array.isArray(compile.contexts) ? compile.contexts.length : num(plan.contexts);
  const bytes = num(b.bytes);
  const files = num(b.files);
  return [bytes !== undefined ? sizeText(bytes) : undefined, files !== undefined ? `${files} files` : undefined, contexts !== undefined ? `${contexts} context${contexts === 1 ? '' : 's'}` : undefined].filter((x): x is string => !!x);
}

function bundleText(r: RunRecord): string {
  const facts = bundleFacts(r);
  return `bundle: ${r.bundle}${facts.length ? ` (${facts.join(', ')})` : ''}`;
}

/** The build's verdict in one line: ok, partial, FAILED or INTERRUPTED with the error. */
export function headline(r: RunRecord): string {
  if (r.status === 'ok') return `ok: ${r.recipe} for ${r.arch}, every gate passed`;
  if (r.status === 'partial') {
    const ran = Object.keys(isObj(r.gates) ? r.gates : {});
    return `partial: stopped after ${r.until} as asked; no bundle made, ${ran.length ? `only gates ${ran.join(', ')} ran` : 'no gate ran'}`;
  }
  return `${r.status === 'interrupted' ? 'INTERRUPTED' : 'FAILED'}: ${r.error}`;
}

export interface GateVerdict {
  /** The gate, or `hand-off` for the residual dtype the oracle chose (no verdict of its own). */
  name: string;
  verdict: 'pass' | 'FAIL' | 'not run' | '';
  /** Its headline figures against their thresholds, in words. */
  text: string;
}

/** One verdict per gate, in the order a build runs them, then any other; the hand-off dtype after the oracle. */
export function gateVerdicts(r: RunRecord, threshold: (label: string, scheme: string) => number | undefined = recipeOracleThreshold(r.recipe)): GateVerdict[] {
  const gates = isObj(r.gates) ? r.gates : {};
  const order = ['oracle', 'parity', 'emulation'];
  const names = [...new Set([...order.filter((n) => n in gates || n in (r.gatesNotRun ?? {})), ...Object.keys(gates), ...Object.keys(r.gatesNotRun ?? {})])];
  const out: GateVerdict[] = [];
  for (const name of names) {
    const g = gates[name];
    if (!g) {
      out.push({ name, verdict: 'not run', text: String(r.gatesNotRun?.[name] ?? '') });
      continue;
    }
    out.push({ name, verdict: g.ok === true ? 'pass' : g.ran === false ? 'not run' : 'FAIL', text: gateText(name, g, threshold) });
    if (name === 'oracle') {
      const h = handoffText(r);
      if (h) out.push({ name: 'hand-off', verdict: '', text: h });
    }
  }
  return out;
}

/** The whole last screen of `forge build` (without --json), as lines. */
export function verdictLines(r: RunRecord, opts: VerdictOptions = {}): string[] {
  const lines: string[] = [];
  if (opts.verbose) {
    lines.push(...stageTable(r.stages));
    for (const s of r.stages) if (s.overPrediction) lines.push(`memory: ${s.name}: ${s.overPrediction}`);
    lines.push('');
  }
  lines.push(headline(r));
  const verdicts = gateVerdicts(r, opts.oracleThreshold ?? recipeOracleThreshold(r.recipe));
  for (const v of verdicts) lines.push(gateLine(v.name, v.verdict, v.text));
  if (r.bundle) lines.push(bundleText(r));
  const failed = verdicts.filter((v) => v.verdict === 'FAIL').map((v) => v.name);
  if (failed.length) lines.push(`next: ./forge bisect ${r.recipe} --arch ${r.arch} names where the shipped graphs first leave Hugging Face and tries the cheapest fix (docs/bisect.md)${failed.includes('parity') ? "; a mismatch where HF's own margin is tiny may be allowed with gates.parity.maxTies and tiesWhy (docs/gates.md#parity)" : ''}`);
  if (r.buildDir) lines.push(`report: ${r.buildDir}/report.html`, `run record: ${r.buildDir}/run.json`); else lines.push('the run record could not be written (it is printed by --json)');
  return lines;
}
