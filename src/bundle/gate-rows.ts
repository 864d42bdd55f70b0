// The report's gate table: one row per gate and variant (gate, verdict, figure, threshold, detail),
// every value in words and numbers. The run record keeps nested figures (per-graph cosines, logit
// errors, tie margins, timings); here they are read with the same helpers as the build's last screen
// (verdict.ts) and written out, never dumped as objects.
import type { GateRecord, RunRecord } from '../engine/record.js';
import { cos, isObj, matchedText, num, parityRuleText, recipeOracleThreshold, type Obj } from './verdict.js';

export interface GateRow {
  gate: string;
  verdict: 'pass' | 'FAIL' | 'not run' | '';
  figure: string;
  threshold: string;
  detail: string;
}

type Threshold = (label: string, scheme: string) => number | undefined;

/** A logit error or margin: 4 significant figures, scientific below 0.001. */
const small = (v: number) => (v !== 0 && Math.abs(v) < 1e-3 ? v.toExponential(2) : Number(v.toPrecision(4)).toString());
const ms = (v: number) => (v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${v.toFixed(v < 10 ? 2 : 1)} ms`);
const verdictOf = (ok: unknown): GateRow['verdict'] => (ok === false ? 'FAIL' : 'pass');

/** A graph's figures in words: `shard0.decode 0.9996195`, with top-1 and a failure marked. */
function graphText(name: string, e: Obj): string {
  const c = num(e.minCosine);
  return `${name} ${c !== undefined ? cos(c) : 'no figure'}${typeof e.top1 === 'string' ? ` (top-1 ${e.top1})` : ''}${e.ok === false ? ' failed' : ''}`;
}

function oracleRows(g: GateRecord, threshold: Threshold, r: RunRecord): GateRow[] {
  const graphs = isObj(g.graphs) ? g.graphs : {};
  const variants = new Map<string, Array<[string, Obj]>>();
  for (const [key, e] of Object.entries(graphs)) {
    if (!isObj(e)) continue;
    const slash = key.indexOf('/');
    const variant = slash < 0 ? key : key.slice(0, slash);
    variants.set(variant, [...(variants.get(variant) ?? []), [slash < 0 ? key : key.slice(slash + 1), e]]);
  }
  const logitError = isObj(g.logitError) ? g.logitError : {};
  const miss = isObj(g.firstMiss) ? g.firstMiss : undefined;
  const rows: GateRow[] = [...variants].map(([variant, list]) => {
    const [label, scheme = ''] = variant.split(':');
    const min = Math.min(...list.map(([, e]) => num(e.minCosine) ?? Infinity));
    const t = threshold(label, scheme);
    const err = num(logitError[label]);
    const detail = [`per graph: ${list.map(([n, e]) => graphText(n, e)).join(', ')}`];
    if (err !== undefined) detail.push(`largest logit error ${small(err)}`);
    if (miss && miss.variant === variant) detail.push(`first miss: ${String(miss.graph)} layer ${String(miss.layer)} ${String(miss.output)}${num(miss.cosine) !== undefined ? ` at cosine ${cos(num(miss.cosine)!)}` : ''}${miss.nonFinite ? `, non-finite: ${String(miss.nonFinite)}` : ''}`);
    return {
      gate: `oracle ${variant}`, verdict: verdictOf(list.every(([, e]) => e.ok !== false)),
      figure: `min cosine ${Number.isFinite(min) ? cos(min) : 'none'}`, threshold: t !== undefined ? `≥ ${t}` : '', detail: `${detail.join('; ')}.`,
    };
  });
  if (!rows.length) rows.push({ gate: 'oracle', verdict: verdictOf(g.ok), figure: '', threshold: '', detail: 'No graph figures in the run record.' });
  const stage = isObj(r.summaries?.handoff) ? r.summaries.handoff : undefined;
  const chosen = isObj(g.handoff) ? g.handoff : {};
  if (stage && typeof stage.dtype === 'string') rows.push({ gate: 'hand-off', verdict: '', figure: `${stage.dtype} residual`, threshold: '', detail: typeof stage.why === 'string' ? stage.why : '' });
  else {
    for (const [label, c] of Object.entries(chosen)) {
      if (isObj(c)) rows.push({ gate: `hand-off ${label}`, verdict: '', figure: `${String(c.dtype)} residual`, threshold: '', detail: typeof c.why === 'string' ? c.why : '' });
    }
  }
  return rows;
}

/** A runtime's timings in words: load, prefill, decode per token. */
function timingsText(t: unknown): string | undefined {
  if (!isObj(t)) return undefined;
  const parts = [
    num(t.load_ms) !== undefined ? `load ${ms(num(t.load_ms)!)}` : '',
    num(t.prefill_ms) !== undefined ? `prefill ${ms(num(t.prefill_ms)!)}` : '',
    num(t.decode_ms_per_token) !== undefined ? `decode ${ms(num(t.decode_ms_per_token)!)} per token` : '',
  ].filter(Boolean);
  return parts.length ? parts.join(', ') : undefined;
}

function parityRows(g: GateRecord): GateRow[] {
  const t = isObj(g.thresholds) ? g.thresholds : {};
  const rule = parityRuleText(num(t.minMatch), num(t.maxTies));
  const target = typeof g.target === 'string' ? g.target : 'the runtime';
  const rows = Object.entries(isObj(g.variants) ? g.variants : {}).filter(([, v]) => isObj(v)).map(([name, v]) => {
    const o = v as Obj;
    const detail = [`greedy on ${target}, teacher-forced on HF's tokens`];
    if (num(o.tieMargin) !== undefined) detail.push(`a mismatch counts as a tie within a logit margin of ${small(num(o.tieMargin)!)}`);
    const time = timingsText(o.timings);
    if (time) detail.push(time);
    return { gate: `parity ${name}`, verdict: verdictOf(o.ok), figure: matchedText(o), threshold: rule, detail: `${detail.join('; ')}.` };
  });
  if (!rows.length) rows.push({ gate: 'parity', verdict: verdictOf(g.ok), figure: '', threshold: rule, detail: `No variants in the run record (on ${target}).` });
  if (isObj(g.nonFinite)) rows[rows.length - 1].detail += ` Non-finite in ${String(g.nonFinite.variant)}: ${String(g.nonFinite.message)}.`;
  return rows;
}

function emulationRows(g: GateRecord): GateRow[] {
  if (g.ran === false) return [{ gate: 'emulation', verdict: 'not run', figure: '', threshold: '', detail: String(g.reason ?? '') }];
  const t = isObj(g.thresholds) ? g.thresholds : {};
  const graphs = Object.entries(isObj(g.graphs) ? g.graphs : {}).filter(([, e]) => isObj(e)) as Array<[string, Obj]>;
  const worst = graphs.reduce<[string, number] | undefined>((w, [n, e]) => {
    const c = num(e.minCosine);
    return c !== undefined && (!w || c < w[1]) ? [n, c] : w;
  }, undefined);
  const per = graphs.map(([n, e]) => `${graphText(n, e)}${num(e.msPerCall) !== undefined ? `, ${ms(num(e.msPerCall)!)} a call` : ''}`);
  const where = typeof g.simulator === 'string' ? `the ${g.simulator.replace(/, fp16 true$/, ', fp16 activations').replace(/, fp16 false$/, ', fp32 activations')}` : 'the x86 HTP simulator';
  const rows: GateRow[] = [{
    gate: 'emulation cosine', verdict: verdictOf(graphs.every(([, e]) => e.ok !== false)),
    figure: `min cosine ${worst ? `${cos(worst[1])} at ${worst[0]}` : 'none'}`, threshold: num(t.minCosine) !== undefined ? `≥ ${num(t.minCosine)}` : '',
    detail: `On ${where}, against HF; per graph: ${per.join('; ')}.`,
  }];
  if (isObj(g.parity)) {
    const p = g.parity;
    const detail = [`greedy on the simulator${num(t.tokens) !== undefined ? ` over ${num(t.tokens)} tokens a prompt` : ''}`];
    if (num(g.msPerToken) !== undefined) detail.push(`${ms(num(g.msPerToken)!)} per token simulated`);
    if (num(g.prefillMs) !== undefined) detail.push(`prefill ${ms(num(g.prefillMs)!)} simulated`);
    rows.push({ gate: 'emulation parity', verdict: verdictOf(p.ok), figure: matchedText(p), threshold: parityRuleText(num(t.minMatch), num(t.maxTies)), detail: `${detail.join('; ')}.` });
  }
  return rows;
}

/** A gate forge does not know by name: its scalar figures as `name value`; nested figures stay in the run record. */
function otherRow(name: string, g: GateRecord): GateRow {
  const figures = Object.entries(g).filter(([k, v]) => k !== 'ok' && v !== null && typeof v !== 'object').map(([k, v]) => `${k} ${String(v)}`);
  return { gate: name, verdict: verdictOf(g.ok), figure: figures.join(', '), threshold: '', detail: '' };
}

/** Every gate of the record as rows, in the order a build runs them; the gates not run with why. */
export function gateRows(r: RunRecord, threshold: Threshold = recipeOracleThreshold(r.recipe)): GateRow[] {
  const gates = isObj(r.gates) ? (r.gates as Record<string, GateRecord>) : {};
  const order = ['oracle', 'parity', 'emulation'];
  const names = [...new Set([...order.filter((n) => n in gates || n in (r.gatesNotRun ?? {})), ...Object.keys(gates), ...Object.keys(r.gatesNotRun ?? {})])];
  return names.flatMap((name): GateRow[] => {
    const g = gates[name];
    if (!g) return [{ gate: name, verdict: 'not run', figure: '', threshold: '', detail: String(r.gatesNotRun?.[name] ?? '') }];
    if (name === 'oracle') return oracleRows(g, threshold, r);
    if (name === 'parity') return parityRows(g);
    if (name === 'emulation') return emulationRows(g);
    return [otherRow(name, g)];
  });
}
