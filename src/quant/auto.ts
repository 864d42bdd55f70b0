// Stage `precision` (quant 'auto'): which layers take W4 and which need W8 (or fp16), chosen by the
// oracle. Every layer is exported as a graph of its own, so the oracle gate feeds each one HF's own
// inputs and measures it alone (teacher-forced per layer); the same graphs, assembled into a bundle
// and run by the runtime on the host, say whether greedy decoding keeps HF's tokens by the recipe's
// parity rule (the runtime's own caches and states carry each step's error to the next, which a
// teacher-forced chain does not see: tiny-qwen3.5 at w4 chains HF's token at 256/256 steps and
// still fails parity at 254/256).
//  1. Every matrix starts at w4 (a recipe override pins its own; a matrix the W4 block cannot take
//     falls back by itself). A layer whose graph keeps a cosine under autoMinCosine, or a
//     non-finite value, is promoted one step (w4 → w8 → fp16) until it does; fp16 failing too is an
//     error naming the layer.
//  2. If host parity then fails, the remaining w4 layers are ranked by the cosine they lose per byte
//     W8 would add, and the shortest prefix of that ranking that passes is promoted (found by
//     doubling, then bisection: it assumes promoting more layers never loses a token; the shipped
//     graphs' own gates check the result anyway).
// The result (precision.json) is the map the plan, the quantize export and the card read.
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import type { FamilyId, PrecisionOverride, QuantScheme } from '../recipe/schema.js';
import { getFamily } from '../families/index.js';
import type { Family, TensorSpec } from '../families/types.js';
import { modelTensors } from '../families/tensors.js';
import { GRAPHS_JSON, type ExportManifest, type ExportPlan } from '../export/graphs.js';
import { runExport } from '../export/stage.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { runOracleGate, type OracleResult } from '../gates/oracle.js';
import type { ChainDecisions } from '../gates/step-chain.js';
import { checkParity, variantOk, type ParityParams } from '../gates/parity.js';
import { writeCpuFormExport } from '../gates/cpu-form.js';
import { Trace } from '../gates/trace.js';
import { assembleBundle } from '../bundle/assemble.js';
import { hostTarget } from '../targets/host.js';
import { getArch } from '../arch/table.js';
import type { NativeRecord } from '../gates/native-stage.js';
import { sumBytes } from './bytes.js';
import { PrecisionChooser, PRECISION_JSON, type PrecisionMap } from './precision.js';

export interface AutoParams {
  family: FamilyId;
  lmHeadScheme: QuantScheme;
  maxContext: number;
  overrides: PrecisionOverride[];
  /** gates.oracle.autoMinCosine: what every layer alone must keep. */
  minCosine: number;
  minTop1: number;
  /** The recipe's parity rule, which the chosen precisions must pass on the host. */
  parity: Pick<ParityParams, 'recipe' | 'arch' | 'tokens' | 'minMatch' | 'maxTies'>;
}

/** Each layer's precision rung: its unpinned matrices are stored in LADDER[rung]. */
const LADDER = ['w4', 'w8', 'fp16'] as const;
type Rung = (typeof LADDER)[number];

export interface LayerChoice {
  layer: number;
  scheme: Rung;
  /** The layer alone at w4: its graph's smallest cosine (every output, every traced step). */
  w4Cosine: number;
  /** The same in its final precision. */
  cosine: number;
  /** Its matmul weights' bytes in its final precision, and at w4 and w8. */
  bytes: number;
  w4Bytes: number;
  w8Bytes: number;
  why?: string;
}

export interface PrecisionResult {
  scheme: 'auto';
  minCosine: number;
  layers: LayerChoice[];
  /** The layers' matmul bytes summed: as chosen, all w4 and all w8 (the card's ratios, the run record's). */
  layerBytes: { auto: number; w4: number; w8: number };
  /** The promoted layers' unpinned matrices, with why (the plan and the quantize export apply it). */
  matrices: PrecisionMap;
  /** Host parity (tokens equal to HF's before the first mismatch, of all; mismatches, ties), all w4 and as chosen. */
  parity: { w4: ParityFigures; chosen: ParityFigures };
  /** The one-token graphs chained end to end on HF's caches (step-chain.ts), all w4 and as chosen. */
  decisions: { w4?: ChainDecisions; chosen?: ChainDecisions };
  /** How many times the layers were exported and gated. */
  evaluations: number;
}

export interface ParityFigures {
  ok: boolean;
  matched: number;
  total: number;
  mismatches: number;
  ties: number;
}

interface Evaluation {
  cosine: number[];
  nonFinite: Array<string | undefined>;
  parity: ParityFigures;
  decisions?: ChainDecisions;
}

const passes = (e: Evaluation) => e.parity.ok;
export const parityText = (f: ParityFigures) => `${f.matched}/${f.total} before the first mismatch, ${f.mismatches} mismatch${f.mismatches === 1 ? '' : 'es'} (${f.ties} tie${f.ties === 1 ? '' : 's'})`;
const fmt = (c: number) => c.toFixed(5);

/** A plan with one layer per graph, the lm-head alone: every layer is teacher-forced on its own. */
const perLayerPlan = (n: number): ExportPlan => ({ shards: Array.from({ length: n }, (_, i) => ({ first: i, last: i })), lmHead: { placement: 'separate' } });

/** What an evaluation varies: each layer's rung and why it is there. */
class Rungs {
  readonly rung: Rung[];
  readonly why: Array<string | undefined>;
  constructor(readonly movable: TensorSpec[][]) {
    this.rung = new Array(movable.length).fill('w4');
    this.why = new Array(movable.length).fill(undefined);
  }
  set(l: number, rung: Rung, why: string | undefined): void {
    this.rung[l] = rung;
    this.why[l] = why;
  }
  /** The promoted layers' movable matrices, as the export and the plan read them. */
  map(): PrecisionMap {
    return Object.fromEntries(this.movable.flatMap((ts, l) => (this.rung[l] === 'w4' ? [] : ts.map((t) => [t.name, { scheme: this.rung[l], why: this.why[l]! }]))));
  }
  bytes(l: number, rung: Rung = this.rung[l]): number {
    return sumBytes(this.movable[l], rung);
  }
}

/**
 * Exports the layers one per graph in the rungs' precisions, gates each alone (oracle) and runs the
 * lot in the runtime on the host (parity); the files are removed after.
 */
async function evaluate(p: AutoParams, at: { checkpointDir: string; traceDir: string; trace: Trace; qhxGenerate: string; work: string }, rungs: Rungs, index: number, progress: (done: number, total: number, label?: string) => void): Promise<Evaluation> {
  const n = rungs.rung.length;
  const dir = join(at.work, `eval${index}`);
  mkdirSync(dir, { recursive: true });
  try {
    await runExport({ family: p.family, scheme: 'w4', lmHeadScheme: p.lmHeadScheme, maxContext: p.maxContext, prefillLength: 0, hostTables: true, overrides: p.overrides }, at.checkpointDir, perLayerPlan(n), dir, { log: () => {}, progress: () => {} }, rungs.map());
    const graphs = (JSON.parse(readFileSync(join(dir, GRAPHS_JSON), 'utf8')) as ExportManifest).contexts.flatMap((c) => c.graphs);
    const r: OracleResult = await runOracleGate(p.family, at.checkpointDir, at.traceDir, [{ label: 'auto', dir, minCosine: p.minCosine }], p.minTop1, join(at.work, 'scratch'), progress);
    const cosine = new Array<number>(n).fill(Infinity);
    const nonFinite = new Array<string | undefined>(n).fill(undefined);
    for (const g of graphs) {
      if (g.first === undefined || g.first !== g.last) continue; // the lm-head, graphs every layer shares
      cosine[g.first] = Math.min(cosine[g.first], r.graphs[`auto:w4/${g.name}`].minCosine);
      nonFinite[g.first] ??= r.rows.find((x) => x.graph === g.name && x.nonFinite)?.nonFinite;
    }
    // The same graphs in the runtime, greedy on its own caches, under the recipe's parity rule.
    writeCpuFormExport(dir, `${dir}.cpu`);
    await assembleBundle({ recipe: p.parity.recipe, arch: getArch(p.parity.arch), graphsDir: `${dir}.cpu`, dataDigestsDir: dir, embeddingDir: dir, checkpointDir: at.checkpointDir, maxNewTokens: p.parity.tokens }, `${dir}.bundle`);
    const v = await checkParity(hostTarget(at.qhxGenerate, 1800), `${dir}.bundle`, at.trace, p.parity.tokens, r.logitError.auto ?? null);
    const parity = { ok: variantOk(v, p.parity.minMatch, p.parity.maxTies), matched: v.matched, total: v.total, mismatches: v.mismatchCount, ties: v.ties };
    return { cosine, nonFinite, parity, ...(r.decisions?.auto ? { decisions: r.decisions.auto } : {}) };
  } finally {
    for (const x of [dir, `${dir}.cpu`, `${dir}.bundle`]) rmSync(x, { recursive: true, force: true });
  }
}

export async function choosePrecision(p: AutoParams, checkpointDir: string, traceDir: string, qhxGenerate: string, work: string, log: (m: string) => void, progress: (done: number, total: number, label?: string) => void = () => {}): Promise<PrecisionResult> {
  const family = getFamily(p.family) as Family<unknown>;
  const configFile = join(checkpointDir, 'config.json');
  const config = family.parseConfig(JSON.parse(readFileSync(configFile, 'utf8')), configFile);
  const pins = new PrecisionChooser(p.overrides);
  // The matrices auto may move: each layer's matmul weights no override pins.
  const rungs = new Rungs((await modelTensors(family, config)).layers.map((ts) => ts.filter((t) => t.role === 'matmul' && !pins.override(t.name))));
  const n = rungs.rung.length;
  const trace = await Trace.open(traceDir);
  let evaluations = 0;
  const run = async (label: string): Promise<Evaluation> => {
    const e = await evaluate(p, { checkpointDir, traceDir, trace, qhxGenerate, work }, rungs, evaluations++, (d, t, g) => progress(d, t, `${label}: ${g ?? ''}`));
    const d = e.decisions;
    log(`${label}: ${rungs.rung.map((x, l) => `${l}:${x}`).join(' ')}; smallest layer cosine ${fmt(Math.min(...e.cosine))}; host parity ${parityText(e.parity)}${e.parity.ok ? '' : ' ✗'}; chained on HF's caches: HF's token at ${d ? `${d.agree}/${d.steps}` : 'no'} greedy steps`);
    return e;
  };
  try {
    const first = await run('all w4');
    let e = first;
    // 1. Every layer alone at or above the threshold.
    for (;;) {
      const failing = e.cosine.flatMap((c, l) => (c < p.minCosine || e.nonFinite[l] ? [l] : []));
      if (!failing.length) break;
      for (const l of failing) {
        const at = LADDER.indexOf(rungs.rung[l]);
        const seen = e.nonFinite[l] ? `a non-finite value (${e.nonFinite[l]})` : `cosine ${fmt(e.cosine[l])}`;
        if (at === LADDER.length - 1) throw new Error(`auto: layer ${l} alone keeps ${seen} even in fp16, under gates.oracle.autoMinCosine ${p.minCosine}: lower the threshold, or pin the layer with an override ("fp32")`);
        rungs.set(l, LADDER[at + 1], `auto: layer ${l} alone at ${LADDER[at]} keeps ${seen} < autoMinCosine ${p.minCosine}`);
      }
      e = await run(`promoted ${failing.join(', ')}`);
    }
    // 2. Host parity: the shortest prefix of the ranking that passes.
    if (!passes(e)) {
      const before = e.parity;
      const cost = (l: number) => (1 - first.cosine[l]) / Math.max(1, rungs.bytes(l, 'w8') - rungs.bytes(l, 'w4'));
      const ranked = rungs.rung.flatMap((r, l) => (r === 'w4' ? [l] : [])).sort((a, b) => cost(b) - cost(a) || a - b);
      const base = rungs.rung.map((r, l) => ({ r, why: rungs.why[l] }));
      const applyPrefix = (k: number) => {
        base.forEach((b, l) => rungs.set(l, b.r, b.why));
        ranked.slice(0, k).forEach((l, i) => rungs.set(l, 'w8', `auto: promoted, ${i + 1} of the ${k} layers that cost the most cosine per byte saved, so that host parity passes (${parityText(before)} without them)`));
      };
      const tryPrefix = (k: number) => (applyPrefix(k), run(`top ${k} of ${ranked.length} ranked promoted`));
      // Doubling, then bisection between the last prefix that failed and the first that passed.
      let lo = 0;
      let hi = 0;
      let found: Evaluation | undefined;
      for (let k = 1; k <= ranked.length; k = k === ranked.length ? k + 1 : Math.min(k * 2, ranked.length)) {
        const t = await tryPrefix(k);
        if (passes(t)) { hi = k; found = t; break; }
        lo = k;
      }
      if (!found) throw new Error(`auto: with every layer at w8 or above host parity still fails (${parityText(before)} before): the lm-head (lmHead.quant ${p.lmHeadScheme}) or an override costs it; use w8 there, pin fewer matrices, or build w8`);
      while (hi - lo > 1) {
        const mid = (lo + hi) >> 1;
        const t = await tryPrefix(mid);
        if (passes(t)) { hi = mid; found = t; } else lo = mid;
      }
      applyPrefix(hi);
      e = found;
    }
    const layers: LayerChoice[] = rungs.rung.map((scheme, l) => ({
      layer: l, scheme, w4Cosine: first.cosine[l], cosine: e.cosine[l], bytes: rungs.bytes(l), w4Bytes: rungs.bytes(l, 'w4'), w8Bytes: rungs.bytes(l, 'w8'), ...(rungs.why[l] ? { why: rungs.why[l] } : {}),
    }));
    const sum = (k: 'bytes' | 'w4Bytes' | 'w8Bytes') => layers.reduce((a, l) => a + l[k], 0);
    return {
      scheme: 'auto', minCosine: p.minCosine, layers, layerBytes: { auto: sum('bytes'), w4: sum('w4Bytes'), w8: sum('w8Bytes') }, matrices: rungs.map(), parity: { w4: first.parity, chosen: e.parity },
      decisions: { ...(first.decisions ? { w4: first.decisions } : {}), ...(e.decisions ? { chosen: e.decisions } : {}) }, evaluations,
    };
  } finally {
    await trace.close();
  }
}

export const stage: StageModule<AutoParams> = {
  name: 'precision',
  version: '1',
  async run(ctx) {
    const ref = readCheckpointRef(ctx.inputs.checkpoint);
    const work = join(ctx.out, '.work');
    try {
      const native = JSON.parse(readFileSync(join(ctx.inputs.native, 'native.json'), 'utf8')) as NativeRecord;
      const r = await choosePrecision(ctx.params, ref.absDir, ctx.inputs.trace, native.qhxGenerate, work, (m) => ctx.log(m), ctx.progress);
      await writeFile(join(ctx.out, PRECISION_JSON), JSON.stringify(r, null, 2));
      const promoted = r.layers.filter((l) => l.scheme !== 'w4');
      return {
        summary: {
          promoted: promoted.map((l) => ({ layer: l.layer, scheme: l.scheme, w4Cosine: l.w4Cosine, why: l.why ?? '' })),
          layerBytes: r.layerBytes,
          parity: r.parity as any,
          decisions: r.decisions as any,
          evaluations: r.evaluations,
        },
      };
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  },
};
