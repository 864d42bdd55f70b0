// forge bisect, quantization link, op by op: once a layer is named, which op of it loses the
// numbers. The layer is exported alone twice (alone.ts's one-layer graphs): at fp32 and at the
// shipped precision (the recipe's scheme, overrides and auto map), every op's output made a graph
// output (op-match.ts pairs the ops of the two graphs), both fed the same HF-traced inputs for that
// layer, and per op the cosine of the shipped output with the fp32 one is kept, the smallest over
// the traced cases.
//
// The op named is where the cosine drops, not the first under a threshold: a quantized matrix's
// error enters at its MatMul and every later op carries it (the residual Add, the next norm, the
// next projection all show a low cosine), so "first under" names whatever op the error reaches
// first, and an op fed a value already under would be named for what it merely carries. The drop
// is its inputs' cosine (the lowest among its activation inputs; a graph input is HF's own: 1) less
// its own; the op with the largest drop is where the damage is done.
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import * as ort from 'onnxruntime-node';
import { gateCasesOf } from '../families/types.js';
import type { Family } from '../families/types.js';
import { GRAPHS_JSON, graphName, layoutOf, type ExportManifest, type GraphEntry } from '../export/graphs.js';
import { runExport, type ExportParams } from '../export/stage.js';
import type { FamilyId, PrecisionOverride, QuantScheme } from '../recipe/schema.js';
import type { PrecisionMap } from '../quant/precision.js';
import type { W8Form } from '../quant/weights.js';
import { gateSessionOptions, writeGateModel } from '../gates/cpu-form.js';
import { formOptions, gateForm } from '../gates/oracle.js';
import { compare } from '../gates/compare.js';
import { Trace } from '../gates/trace.js';
import { perLayerPlan } from './alone.js';
import { graphOps, OpKeys, pairOps, type GraphOp } from './op-match.js';
import { layerOf, scopeOf } from './probe.js';
import { shortName } from './fixes.js';
import { familyConfig } from './family-config.js';

export interface QuantOpFigure {
  /** The shipped graph's node and op type (`layers.2/MatMulNBits_6`, MatMulNBits), its scope and layer. */
  node: string;
  op: string;
  scope: string;
  layer: number | null;
  /** The value it makes in the shipped graph (a node with several outputs has one figure each). */
  value: string;
  /** The fp32 graph's node computing the same (`layers.2/Gemm_6`). */
  fp32Node: string;
  /** A matmul's matrix (checkpoint tensor name). */
  matrix?: string;
  /** Smallest cosine over the traced cases, shipped vs fp32 (−1: a non-finite entry). */
  cosine: number;
  /** The lowest cosine among its activation inputs (1 for graph inputs: both graphs are fed HF's). */
  inputsCosine: number;
}

export interface QuantOpProbe {
  layer: number;
  graph: string;
  scheme: QuantScheme;
  cases: number;
  /** Every paired op of the layer, in the shipped graph's order. */
  ops: QuantOpFigure[];
  /** Ops of the shipped graph with no fp32 counterpart (not compared). */
  unpaired: number;
  /** Where the cosine drops most: the op named. */
  drop?: QuantOpFigure;
  /** The first op (graph order) under the threshold, for comparison. */
  firstUnder?: QuantOpFigure;
  threshold: number;
  seconds: number;
}

/** `layers.2/MatMulNBits_3 (self_attn.o_proj, MatMulNBits) cosine 0.74584 from inputs at 0.99060`. */
export const opText = (o: QuantOpFigure) => `${o.node} (${[o.matrix && o.layer !== null ? shortName(o.matrix, o.layer) : o.matrix, o.op].filter(Boolean).join(', ')}) cosine ${o.cosine.toFixed(5)} from inputs at ${o.inputsCosine.toFixed(5)}`;

/** An op's figures for the pure search: its value, the values it reads, its cosine. */
export interface DropInput {
  value: string;
  inputs: string[];
  cosine: number;
}

/**
 * Per op, the lowest cosine among its inputs (a value no op makes: 1), and the index of the op whose
 * cosine falls most below its inputs' (the first of equal drops); none when no op loses anything.
 * Pure: the tests give it numbers.
 */
export function cosineDrops(ops: DropInput[]): { inputsCosine: number[]; largest?: number } {
  const cos = new Map(ops.map((o) => [o.value, o.cosine]));
  const inputsCosine = ops.map((o) => Math.min(1, ...o.inputs.map((i) => cos.get(i) ?? 1)));
  let largest: number | undefined;
  let best = 0;
  ops.forEach((o, i) => {
    const d = inputsCosine[i] - o.cosine;
    if (d > best) [best, largest] = [d, i];
  });
  return { inputsCosine, ...(largest !== undefined ? { largest } : {}) };
}

export interface QuantOpParams {
  family: FamilyId;
  layer: number;
  /** The shipped precision: scheme, lm-head scheme, the recipe's overrides and the auto map. */
  scheme: QuantScheme;
  lmHeadScheme: QuantScheme;
  overrides: PrecisionOverride[];
  precision?: PrecisionMap;
  w8Form?: W8Form;
  maxContext: number;
  threshold: number;
}

/** Exports layer `layer` alone (its decode graph only) under `dir` and returns its entry. */
async function exportLayer(p: ExportParams, family: Family<unknown>, config: unknown, n: number, layer: number, checkpointDir: string, dir: string, precision?: PrecisionMap): Promise<GraphEntry> {
  const plan = perLayerPlan(n);
  const keep = (first: number | undefined) => first === layer;
  const dropped = family.components(config, layoutOf(plan, p)).flatMap((c) => c.variants.filter((v) => !keep(c.entry.first)).map((v) => ({ graph: graphName(c.name, v.name), why: 'not the probed layer' })));
  mkdirSync(dir, { recursive: true });
  await runExport(p, checkpointDir, { ...plan, dropped }, dir, { log: () => {}, progress: () => {} }, precision);
  const graphs = (JSON.parse(readFileSync(join(dir, GRAPHS_JSON), 'utf8')) as ExportManifest).contexts.flatMap((c) => c.graphs);
  const entry = graphs.find((g) => g.first === layer && g.last === layer && g.n === 1);
  if (!entry) throw new Error(`${join(dir, GRAPHS_JSON)}: no one-token graph of layer ${layer} (graphs: ${graphs.map((g) => g.name).join(', ')})`);
  return entry;
}

/**
 * Probes layer `p.layer` op by op: exports it at fp32 and at the shipped precision under `work`,
 * runs both on the CPU (the oracle gate's CPU form, one case a call, whole cache) over every traced
 * case, and names the op where the cosine drops. Removes its files.
 */
export async function probeQuantOps(p: QuantOpParams, checkpointDir: string, traceDir: string, work: string): Promise<QuantOpProbe> {
  const t0 = performance.now();
  const { family, config, configFile } = familyConfig(p.family, checkpointDir);
  const n = family.numLayers(config);
  if (!Number.isInteger(p.layer) || p.layer < 0 || p.layer >= n) throw new Error(`op probe: layer ${p.layer} is not one of ${configFile}'s ${n} layers`);
  const base = { family: p.family, maxContext: p.maxContext, prefillLength: 0, hostTables: false, ...(p.w8Form ? { w8Form: p.w8Form } : {}) };
  const dir = join(work, 'quant-op');
  rmSync(dir, { recursive: true, force: true });
  try {
    // The reference: every matrix fp32, no pins (an override would move the reference itself).
    const ref = await exportLayer({ ...base, scheme: 'fp32', lmHeadScheme: 'fp32' }, family, config, n, p.layer, checkpointDir, join(dir, 'fp32'));
    const shipped = await exportLayer({ ...base, scheme: p.scheme, lmHeadScheme: p.lmHeadScheme, overrides: p.overrides }, family, config, n, p.layer, checkpointDir, join(dir, 'shipped'), p.precision);
    const keys = new OpKeys();
    const sOps = graphOps(join(dir, 'shipped', shipped.file), keys);
    const pairs = pairOps(sOps, graphOps(join(dir, 'fp32', ref.file), keys));
    if (!pairs.length) throw new Error(`op probe of layer ${p.layer}: no op of ${shipped.file} pairs with one of the fp32 graph's`);
    const min = await runPairs(family, config, p.maxContext, traceDir, { dir: join(dir, 'fp32'), entry: ref }, { dir: join(dir, 'shipped'), entry: shipped }, pairs, join(dir, 'scratch'));
    return { layer: p.layer, graph: shipped.name, scheme: p.scheme, ...figures(pairs, min.cosines, p.threshold), cases: min.cases, unpaired: sOps.length - pairs.length, threshold: p.threshold, seconds: (performance.now() - t0) / 1000 };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The figures of the paired ops compared (cosines by shipped value): the op where the cosine drops and the first under `threshold`. */
export function figures(pairs: Array<{ shipped: GraphOp; fp32: GraphOp }>, cosines: Map<string, number>, threshold: number): Pick<QuantOpProbe, 'ops' | 'drop' | 'firstUnder'> {
  const compared = pairs.filter((x) => cosines.has(x.shipped.value));
  const { inputsCosine, largest } = cosineDrops(compared.map(({ shipped: o }) => ({ value: o.value, inputs: o.inputs, cosine: cosines.get(o.value)! })));
  const ops: QuantOpFigure[] = compared.map(({ shipped: o, fp32 }, i) => ({
    node: o.node, op: o.op, scope: scopeOf(o.node), layer: layerOf(o.node), value: o.value, fp32Node: fp32.node, ...(o.matrix ? { matrix: o.matrix } : {}), cosine: cosines.get(o.value)!, inputsCosine: inputsCosine[i],
  }));
  const firstUnder = ops.find((f) => f.cosine < threshold);
  return { ops, ...(largest !== undefined ? { drop: ops[largest] } : {}), ...(firstUnder ? { firstUnder } : {}) };
}

interface Side { dir: string; entry: GraphEntry }

/**
 * Runs both graphs' CPU forms over the layer's traced cases, case by case (the fp32 graph's cases fed
 * to both: the same HF inputs), and keeps per paired op the smallest cosine, by shipped value.
 */
async function runPairs(family: Family<unknown>, config: unknown, maxContext: number, traceDir: string, ref: Side, shipped: Side, pairs: Array<{ shipped: GraphOp; fp32: GraphOp }>, scratch: string): Promise<{ cosines: Map<string, number>; cases: number }> {
  const names = (ns: string[]) => [...new Set(ns)];
  const session = async (s: Side, values: string[]) => {
    const form = gateForm(s.entry, 1, false);
    const { path } = writeGateModel(join(s.dir, s.entry.file), values, join(scratch, s.dir.split('/').pop()!), formOptions(s.entry, form));
    return ort.InferenceSession.create(path, gateSessionOptions(1));
  };
  const a = await session(ref, names(pairs.map((x) => x.fp32.value)));
  const cosines = new Map<string, number>();
  let cases = 0;
  try {
    const b = await session(shipped, names(pairs.map((x) => x.shipped.value)));
    try {
      const trace = await Trace.open(traceDir);
      try {
        for await (const c of gateCasesOf(family, config, ref.entry, trace, maxContext, ref.dir)) {
          const feeds = Object.fromEntries(Object.entries(c.feeds).map(([k, f]) => [k, new ort.Tensor(f.dtype, f.data, f.dims)]));
          const [x, y] = [await a.run(feeds), await b.run(feeds)];
          for (const { fp32, shipped: s } of pairs) {
            const f = x[fp32.value]?.data as Float32Array | undefined, q = y[s.value]?.data as Float32Array | undefined;
            if (!f || !q) throw new Error(`op probe: ${!f ? `${ref.entry.file} gave no ${fp32.value}` : `${shipped.entry.file} gave no ${s.value}`}`);
            // A value whose CPU form has another size than the other side's is not compared (none seen on the twins).
            if (f.length !== q.length) continue;
            cosines.set(s.value, Math.min(cosines.get(s.value) ?? 1, compare(q, f).cosine));
          }
          cases++;
        }
      } finally {
        await trace.close();
      }
    } finally {
      await b.release();
    }
  } finally {
    await a.release();
  }
  if (!cases) throw new Error(`op probe: no traced case for ${ref.entry.name} in ${traceDir}`);
  return { cosines, cases };
}
