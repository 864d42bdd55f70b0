// Stage `oracle`: the teacher-forced gate. Every exported graph, at every traced step, is fed the
// HF inputs through onnxruntime-node; each output (and the residual after each layer, through a
// probe copy of the graph) is compared with HF by cosine, logits also by top-1. Fails with a
// per-layer table saved as oracle-table.md / oracle.json, and each input's largest logit error
// (`logitError`: the bound below which an HF top-1/top-2 margin is a near-tie for that precision).
import { readFileSync, rmSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import type { StageModule } from '../engine/stage.js';
import type { FamilyId } from '../recipe/schema.js';
import { getFamily } from '../families/index.js';
import type { Family } from '../families/types.js';
import { GRAPHS_JSON, type ExportManifest, type GraphEntry } from '../families/export-stage.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { Trace } from './trace.js';
import { CPU_GATE_SESSION_OPTIONS, writeGateModel } from './cpu-form.js';
import { GateTally, layerOf, type OutputTally } from './compare.js';

export interface OracleParams {
  family: FamilyId;
  /** Which export inputs to check, each with its cosine threshold. */
  variants: Array<{ input: string; minCosine: number }>;
  /** Fraction of logit rows whose argmax must match HF. */
  minTop1: number;
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

async function checkGraph<C>(family: Family<C>, config: C, dir: string, entry: GraphEntry, trace: Trace, maxContext: number, scratch: string) {
  // The graph's CPU-gate form (its own numbers, fast CPU kernels, weights left mapped; see
  // cpu-form.ts) with the probe outputs, run with the session options that form is made for.
  const { path: model, stats } = writeGateModel(join(dir, entry.file), Object.keys(entry.probes), scratch, { tokensPerCall: entry.n });
  const session = await ort.InferenceSession.create(model, CPU_GATE_SESSION_OPTIONS);
  const tally = new GateTally(trace.meta.vocab);
  let cases = 0;
  try {
    for await (const c of family.gateCases(config, entry, trace, maxContext)) {
      const feeds: Record<string, ort.Tensor> = {};
      for (const [name, f] of Object.entries(c.feeds)) feeds[name] = new ort.Tensor(f.dtype, f.data, f.dims);
      const out = await session.run(feeds);
      for (const [name, expected] of Object.entries(c.expected)) {
        const actual = out[name];
        if (!actual) throw new Error(`${entry.file} has no output ${name}`);
        tally.add(name, actual.data as Float32Array, expected, `${entry.name} prompt ${c.prompt} step ${c.step}`, c.masks?.[name]);
      }
      cases++;
    }
  } finally {
    await session.release();
  }
  return { acc: tally.outputs, tops: tally.top1, cases, kept: stats.kept };
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
   * largest |forge logit − HF logit| over every traced case of every graph's `logits` output,
   * padding rows masked out as for the cosines. The precision's measured logit error: a step whose
   * HF top-1 − top-2 margin is below twice this may flip its token. Absent for an input whose
   * logits held a non-finite value (that graph failed; no bound was measured).
   */
  logitError: Record<string, number>;
}

/** The largest |forge − HF| of a graph's `logits` output over its compared entries (the tally's masks applied), if it has one. */
export function largestLogitError(outputs: ReadonlyMap<string, OutputTally>): number | undefined {
  return outputs.get('logits')?.maxAbs;
}

/**
 * Checks each variant's graphs against the trace. `variants` maps an export directory to its
 * threshold; `scratch` holds probe copies (same filesystem as the exports, removed after).
 */
export async function runOracleGate(
  familyId: FamilyId, checkpointDir: string, traceDir: string,
  variants: Array<{ label: string; dir: string; minCosine: number }>, minTop1: number, scratch: string,
  progress: (done: number, total: number, label?: string) => void = () => {},
): Promise<OracleResult> {
  const family = getFamily(familyId) as Family<unknown>;
  const config = family.parseConfig(JSON.parse(readFileSync(join(checkpointDir, 'config.json'), 'utf8')), 'config.json');
  const trace = await Trace.open(traceDir);
  const rows: OracleRow[] = [];
  const graphs: OracleResult['graphs'] = {};
  const slowNodes: string[] = [];
  const logitError: Record<string, number> = {};
  const nonFiniteLogits = new Set<string>();
  let ok = true;
  try {
    const work = variants.flatMap((v) => {
      const manifest = JSON.parse(readFileSync(join(v.dir, GRAPHS_JSON), 'utf8')) as ExportManifest;
      return manifest.contexts.flatMap((c) => c.graphs.map((g) => ({ v, manifest, g })));
    });
    let done = 0;
    for (const { v, manifest, g } of work) {
      progress(done++, work.length, g.name);
      const variant = `${v.label}:${manifest.scheme}`;
      const r = await checkGraph(family, config, v.dir, g, trace, manifest.maxContext, join(scratch, v.label));
      if (r.cases === 0) throw new Error(`no traced step reaches ${g.name}: the trace is empty`);
      slowNodes.push(...r.kept.map((k) => `${variant}/${g.name}: ${k}`));
      const err = largestLogitError(r.acc);
      if (err !== undefined && !Number.isFinite(err)) nonFiniteLogits.add(v.label);
      else if (err !== undefined) logitError[v.label] = Math.max(logitError[v.label] ?? 0, err);
      let graphMin = Infinity;
      let graphOk = true;
      for (const [output, a] of r.acc) {
        const { layer, what } = layerOf(output in g.probes ? g.probes[output].name : output, g.last);
        const rowOk = a.minCosine >= v.minCosine && !a.nonFinite;
        rows.push({ variant, graph: g.name, layer, output, what, minCosine: a.minCosine, maxAbs: a.maxAbs, worst: a.worst, ...(a.nonFinite ? { nonFinite: a.nonFinite } : {}), ok: rowOk });
        graphMin = Math.min(graphMin, a.minCosine);
        graphOk &&= rowOk;
      }
      const entry: { minCosine: number; ok: boolean; top1?: string } = { minCosine: graphMin, ok: graphOk };
      if (r.tops.rows) {
        entry.top1 = `${r.tops.agree}/${r.tops.rows}`;
        if (r.tops.agree < minTop1 * r.tops.rows) entry.ok = false;
      }
      ok &&= entry.ok;
      graphs[`${variant}/${g.name}`] = entry;
    }
  } finally {
    await trace.close();
    rmSync(scratch, { recursive: true, force: true });
  }
  const num = (s: string) => (s === '-' ? Infinity : Number(s));
  rows.sort((a, b) => a.variant.localeCompare(b.variant) || a.graph.localeCompare(b.graph) || num(a.layer) - num(b.layer) || a.output.localeCompare(b.output));
  for (const label of nonFiniteLogits) delete logitError[label];
  return { ok, rows, graphs, slowNodes, logitError };
}

/** The first failed row, in layer order: where the graph first leaves the oracle (a non-finite value first of all). */
export function firstMiss(rows: OracleRow[]): OracleRow | undefined {
  return rows.find((r) => r.nonFinite) ?? rows.find((r) => !r.ok);
}

export const stage: StageModule<OracleParams> = {
  name: 'oracle',
  version: '3',
  async run(ctx) {
    const { family, variants, minTop1 } = ctx.params;
    const ref = readCheckpointRef(ctx.inputs.checkpoint);
    const result = await runOracleGate(family, ref.absDir, ctx.inputs.trace,
      variants.map((v) => ({ label: v.input, dir: ctx.inputs[v.input], minCosine: v.minCosine })), minTop1, join(ctx.out, '.scratch'), ctx.progress);
    await writeFile(join(ctx.out, 'oracle.json'), JSON.stringify(result, null, 2));
    await writeFile(join(ctx.out, 'oracle-table.md'), markdownTable(result.rows, !result.ok));
    for (const s of result.slowNodes ?? []) ctx.log(`left on ORT's slow kernel (the CPU form does not cover it): ${s}`);
    const bad = firstMiss(result.rows);
    if (bad) ctx.log(bad.nonFinite ? `non-finite: ${bad.variant} ${bad.nonFinite}` : `first miss: ${bad.variant} ${bad.graph} layer ${bad.layer} ${bad.output} cosine ${bad.minCosine}`);
    return {
      gate: { name: 'oracle', ok: result.ok },
      summary: {
        graphs: result.graphs,
        logitError: result.logitError,
        ...(bad ? { firstMiss: { variant: bad.variant, graph: bad.graph, layer: bad.layer, output: bad.output, cosine: bad.minCosine, ...(bad.nonFinite ? { nonFinite: bad.nonFinite } : {}) } } : {}),
      },
    };
  },
};
