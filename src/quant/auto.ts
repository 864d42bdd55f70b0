// Stage `precision` (quant 'auto', lmHead.quant 'auto'): which layers take W4 and which need W8
// (or fp16), and the same for the lm-head, chosen by the oracle. Every layer is exported as a graph
// of its own, so the oracle gate feeds each one HF's own inputs and measures it alone (teacher-forced
// per layer; the lm-head is fed HF's final hidden states); the same graphs, assembled into a bundle
// and run by the runtime on the host, say whether greedy decoding keeps HF's tokens by the recipe's
// parity rule (the runtime's own caches and states carry each step's error to the next, which a
// teacher-forced chain does not see: tiny-qwen3.5 at w4 chains HF's token at 256/256 steps and
// still fails parity at 254/256).
//  1. Every matrix the stage may move starts at w4 (a recipe override pins its own; a matrix the W4
//     block cannot take falls back by itself). A layer whose graph keeps a cosine under
//     autoMinCosine, or a non-finite value, is promoted one step (w4 → w8 → fp16) until it does; so
//     is the lm-head while its logits pick HF's token less often than gates.oracle.minTop1 or keep a
//     cosine under what the oracle gate holds the shipped graphs to. fp16 failing too is an error
//     naming the part.
//  2. If host parity then fails, the remaining w4 parts are ranked by the cosine they lose per byte
//     W8 would add, and the shortest prefix of that ranking that passes is promoted (found by
//     doubling, then bisection: it assumes promoting more never loses a token; the shipped graphs'
//     own gates check the result anyway). With everything at w8 and parity still failing, an auto
//     lm-head gets one last try at fp16.
// Layers under a fixed quant (lmHead.quant 'auto' alone) stay in it: only the lm-head moves.
// The result (precision.json) is the map the plan, the quantize export and the card read.
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import { baseScheme, type FamilyId, type LayerQuant, type LmHeadQuant, type PrecisionOverride } from '../recipe/schema.js';
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
import { parseTop1, top1Text, type Top1 } from '../gates/top1.js';

export interface AutoParams {
  family: FamilyId;
  /** The recipe's quant: 'auto' lets this stage move the layers; a scheme keeps every layer in it. */
  layerQuant: LayerQuant;
  /** The recipe's lmHead.quant: 'auto' lets this stage move the lm-head. */
  lmHeadQuant: LmHeadQuant;
  maxContext: number;
  overrides: PrecisionOverride[];
  /** gates.oracle.autoMinCosine: what every layer alone must keep. */
  minCosine: number;
  /** What the oracle gate holds the shipped graphs to (the lm-head's logits among them). */
  lmHeadMinCosine: number;
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

/** The lm-head under lmHead.quant 'auto': its rung, its logits' cosine and top-1 alone (fed HF's final hidden states). */
export interface LmHeadChoice {
  scheme: Rung;
  w4Cosine: number;
  cosine: number;
  /** HF's greedy token picked, of the traced steps, at w4 and as chosen. */
  w4Top1: Top1;
  top1: Top1;
  bytes: number;
  w4Bytes: number;
  w8Bytes: number;
  why?: string;
}

export interface PrecisionResult {
  scheme: 'auto';
  /** The recipe's quant and lmHead.quant (what this stage was free to move). */
  layerQuant: LayerQuant;
  lmHeadQuant: LmHeadQuant;
  minCosine: number;
  /** The layers' choices (empty when the recipe fixes the layers' quant). */
  layers: LayerChoice[];
  /** Present when lmHead.quant is 'auto'. */
  lmHead?: LmHeadChoice;
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
  /** Per part (the layers in order, then the lm-head when it is one): its graph's smallest cosine. */
  cosine: number[];
  nonFinite: Array<string | undefined>;
  /** The lm-head graph's top-1 against HF's greedy tokens. */
  top1?: Top1;
  parity: ParityFigures;
  decisions?: ChainDecisions;
}

const passes = (e: Evaluation) => e.parity.ok;
export const parityText = (f: ParityFigures) => `${f.matched}/${f.total} before the first mismatch, ${f.mismatches} mismatch${f.mismatches === 1 ? '' : 'es'} (${f.ties} tie${f.ties === 1 ? '' : 's'})`;
const fmt = (c: number) => c.toFixed(5);

/** A plan with one layer per graph, the lm-head alone: every layer is teacher-forced on its own. */
const perLayerPlan = (n: number): ExportPlan => ({ shards: Array.from({ length: n }, (_, i) => ({ first: i, last: i })), lmHead: { placement: 'separate' } });

/** A unit the stage moves as one: a layer's unpinned matrices, or the lm-head's. */
interface Part {
  label: string;
  layer?: number;
  movable: TensorSpec[];
}

/** What an evaluation varies: each part's rung and why it is there. */
class Rungs {
  readonly rung: Rung[];
  readonly why: Array<string | undefined>;
  constructor(readonly parts: Part[]) {
    this.rung = new Array(parts.length).fill('w4');
    this.why = new Array(parts.length).fill(undefined);
  }
  set(i: number, rung: Rung, why: string | undefined): void {
    this.rung[i] = rung;
    this.why[i] = why;
  }
  /** The promoted parts' movable matrices, as the export and the plan read them. */
  map(): PrecisionMap {
    return Object.fromEntries(this.parts.flatMap((pt, i) => (this.rung[i] === 'w4' ? [] : pt.movable.map((t) => [t.name, { scheme: this.rung[i], why: this.why[i]! }]))));
  }
  bytes(i: number, rung: Rung = this.rung[i]): number {
    return sumBytes(this.parts[i].movable, rung);
  }
  text(): string {
    return this.parts.map((pt, i) => `${pt.layer ?? 'lm-head'}:${this.rung[i]}`).join(' ');
  }
}

const top1Or = (t: Top1 | undefined) => (t ? top1Text(t) : 'none');

/**
 * Exports the layers one per graph in the rungs' precisions, gates each alone (oracle) and runs the
 * lot in the runtime on the host (parity); the files are removed after.
 */
async function evaluate(p: AutoParams & { layers: number }, at: { checkpointDir: string; traceDir: string; trace: Trace; qhxGenerate: string; work: string }, rungs: Rungs, index: number, progress: (done: number, total: number, label?: string) => void): Promise<Evaluation> {
  const n = rungs.parts.length;
  const dir = join(at.work, `eval${index}`);
  mkdirSync(dir, { recursive: true });
  const scheme = baseScheme(p.layerQuant);
  try {
    await runExport({ family: p.family, scheme, lmHeadScheme: baseScheme(p.lmHeadQuant), maxContext: p.maxContext, prefillLength: 0, hostTables: true, overrides: p.overrides }, at.checkpointDir, perLayerPlan(p.layers), dir, { log: () => {}, progress: () => {} }, rungs.map());
    const graphs = (JSON.parse(readFileSync(join(dir, GRAPHS_JSON), 'utf8')) as ExportManifest).contexts.flatMap((c) => c.graphs);
    const r: OracleResult = await runOracleGate(p.family, at.checkpointDir, at.traceDir, [{ label: 'auto', dir, minCosine: p.minCosine }], p.minTop1, join(at.work, 'scratch'), progress);
    const cosine = new Array<number>(n).fill(Infinity);
    const nonFinite = new Array<string | undefined>(n).fill(undefined);
    let top1: Top1 | undefined;
    for (const g of graphs) {
      // A one-layer graph, or the lm-head standing alone (graphs every layer shares are neither).
      const head = g.first === undefined && g.component === 'lm_head';
      const i = rungs.parts.findIndex((pt) => (head ? pt.layer === undefined : g.first !== undefined && g.first === g.last && pt.layer === g.first));
      if (i < 0) continue;
      const entry = r.graphs[`auto:${scheme}/${g.name}`];
      cosine[i] = Math.min(cosine[i], entry.minCosine);
      nonFinite[i] ??= r.rows.find((x) => x.graph === g.name && x.nonFinite)?.nonFinite;
      if (head) top1 = parseTop1(entry.top1);
    }
    // The same graphs in the runtime, greedy on its own caches, under the recipe's parity rule.
    writeCpuFormExport(dir, `${dir}.cpu`);
    await assembleBundle({ recipe: p.parity.recipe, arch: getArch(p.parity.arch), graphsDir: `${dir}.cpu`, dataDigestsDir: dir, embeddingDir: dir, checkpointDir: at.checkpointDir, maxNewTokens: p.parity.tokens }, `${dir}.bundle`);
    const v = await checkParity(hostTarget(at.qhxGenerate, 1800), `${dir}.bundle`, at.trace, p.parity.tokens, r.logitError.auto ?? null);
    const parity = { ok: variantOk(v, p.parity.minMatch, p.parity.maxTies), matched: v.matched, total: v.total, mismatches: v.mismatchCount, ties: v.ties };
    return { cosine, nonFinite, ...(top1 ? { top1 } : {}), parity, ...(r.decisions?.auto ? { decisions: r.decisions.auto } : {}) };
  } finally {
    for (const x of [dir, `${dir}.cpu`, `${dir}.bundle`]) rmSync(x, { recursive: true, force: true });
  }
}

/** Why a part fails alone, or undefined: a layer against autoMinCosine, the lm-head against the shipped threshold and minTop1. */
function failsAlone(p: AutoParams, pt: Part, e: Evaluation, i: number): string | undefined {
  if (e.nonFinite[i]) return `a non-finite value (${e.nonFinite[i]})`;
  if (pt.layer !== undefined) return e.cosine[i] < p.minCosine ? `cosine ${fmt(e.cosine[i])} < autoMinCosine ${p.minCosine}` : undefined;
  const t = e.top1;
  if (t && t.agree < p.minTop1 * t.rows) return `HF's token at ${top1Text(t)} steps < gates.oracle.minTop1 ${p.minTop1}`;
  return e.cosine[i] < p.lmHeadMinCosine ? `cosine ${fmt(e.cosine[i])} < ${p.lmHeadMinCosine}, the shipped graphs' threshold` : undefined;
}

export async function choosePrecision(p: AutoParams, checkpointDir: string, traceDir: string, qhxGenerate: string, work: string, log: (m: string) => void, progress: (done: number, total: number, label?: string) => void = () => {}): Promise<PrecisionResult> {
  const family = getFamily(p.family) as Family<unknown>;
  const configFile = join(checkpointDir, 'config.json');
  const config = family.parseConfig(JSON.parse(readFileSync(configFile, 'utf8')), configFile);
  const pins = new PrecisionChooser(p.overrides);
  // The matrices auto may move: each part's matmul weights no override pins.
  const movable = (ts: TensorSpec[]) => ts.filter((t) => t.role === 'matmul' && !pins.override(t.name));
  const tensors = await modelTensors(family, config);
  const parts: Part[] = [
    ...(p.layerQuant === 'auto' ? tensors.layers.map((ts, l) => ({ label: `layer ${l}`, layer: l, movable: movable(ts) })) : []),
    ...(p.lmHeadQuant === 'auto' ? [{ label: 'the lm-head', movable: movable(tensors.lmHead) }] : []),
  ];
  const rungs = new Rungs(parts);
  const head = parts.findIndex((pt) => pt.layer === undefined);
  const trace = await Trace.open(traceDir);
  const q = { ...p, layers: tensors.layers.length };
  let evaluations = 0;
  const run = async (label: string): Promise<Evaluation> => {
    const e = await evaluate(q, { checkpointDir, traceDir, trace, qhxGenerate, work }, rungs, evaluations++, (d, t, g) => progress(d, t, `${label}: ${g ?? ''}`));
    const d = e.decisions;
    const cos = e.cosine.filter((_, i) => parts[i].layer !== undefined);
    log(`${label}: ${rungs.text()}; ${cos.length ? `smallest layer cosine ${fmt(Math.min(...cos))}; ` : ''}${head >= 0 ? `lm-head cosine ${fmt(e.cosine[head])}, HF's token at ${top1Or(e.top1)}; ` : ''}host parity ${parityText(e.parity)}${e.parity.ok ? '' : ' ✗'}; chained on HF's caches: HF's token at ${d ? `${d.agree}/${d.steps}` : 'no'} greedy steps`);
    return e;
  };
  try {
    const first = await run('all w4');
    let e = first;
    // 1. Every part alone within its bounds.
    for (;;) {
      const failing = parts.flatMap((pt, i) => (failsAlone(p, pt, e, i) ? [i] : []));
      if (!failing.length) break;
      for (const i of failing) {
        const at = LADDER.indexOf(rungs.rung[i]);
        const seen = failsAlone(p, parts[i], e, i)!;
        if (at === LADDER.length - 1) throw new Error(`auto: ${parts[i].label} alone keeps ${seen} even in fp16: lower the threshold, or pin it with an override ("fp32")`);
        rungs.set(i, LADDER[at + 1], `auto: ${parts[i].label} alone at ${LADDER[at]} keeps ${seen}`);
      }
      e = await run(`promoted ${failing.map((i) => parts[i].layer ?? 'lm-head').join(', ')}`);
    }
    // 2. Host parity: the shortest prefix of the ranking that passes.
    if (!passes(e)) {
      const before = e.parity;
      const cost = (i: number) => (1 - first.cosine[i]) / Math.max(1, rungs.bytes(i, 'w8') - rungs.bytes(i, 'w4'));
      const ranked = rungs.rung.flatMap((r, i) => (r === 'w4' ? [i] : [])).sort((a, b) => cost(b) - cost(a) || a - b);
      const base = rungs.rung.map((r, i) => ({ r, why: rungs.why[i] }));
      const applyPrefix = (k: number) => {
        base.forEach((b, i) => rungs.set(i, b.r, b.why));
        ranked.slice(0, k).forEach((i, j) => rungs.set(i, 'w8', `auto: promoted (${j + 1} of the ${k} that cost the most cosine per byte saved) so that host parity passes (${parityText(before)} without them)`));
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
      if (found) {
        while (hi - lo > 1) {
          const mid = (lo + hi) >> 1;
          const t = await tryPrefix(mid);
          if (passes(t)) { hi = mid; found = t; } else lo = mid;
        }
        applyPrefix(hi);
      } else if (head >= 0 && rungs.rung[head] === 'w8') {
        // Everything at w8 or above and still failing: the lm-head's last rung.
        rungs.set(head, 'fp16', `auto: with every part at w8 or above host parity still fails (${parityText(before)} before), so the lm-head is kept in fp16`);
        const t = await run('lm-head fp16');
        if (passes(t)) found = t;
      }
      if (!found) throw new Error(`auto: with every part it may move at w8 or above host parity still fails (${parityText(before)} before): ${head >= 0 ? 'an override costs it (pin fewer matrices)' : `the lm-head (lmHead.quant ${p.lmHeadQuant}) or an override costs it; use lmHead.quant 'auto' or 'w8', pin fewer matrices`}, or build w8`);
      e = found;
    }
    const layers: LayerChoice[] = parts.flatMap((pt, i) => (pt.layer === undefined ? [] : [{
      layer: pt.layer, scheme: rungs.rung[i], w4Cosine: first.cosine[i], cosine: e.cosine[i], bytes: rungs.bytes(i), w4Bytes: rungs.bytes(i, 'w4'), w8Bytes: rungs.bytes(i, 'w8'), ...(rungs.why[i] ? { why: rungs.why[i] } : {}),
    }]));
    const sum = (k: 'bytes' | 'w4Bytes' | 'w8Bytes') => layers.reduce((a, l) => a + l[k], 0);
    // The lm-head graph's logits are always compared with HF's greedy tokens: no top-1 is a broken gate, not a zero.
    if (head >= 0 && (!first.top1 || !e.top1)) throw new Error('auto: the oracle gate gave the lm-head graph no top-1 against HF\'s tokens');
    const lmHead: LmHeadChoice | undefined = head < 0 ? undefined : {
      scheme: rungs.rung[head], w4Cosine: first.cosine[head], cosine: e.cosine[head], w4Top1: first.top1!, top1: e.top1!,
      bytes: rungs.bytes(head), w4Bytes: rungs.bytes(head, 'w4'), w8Bytes: rungs.bytes(head, 'w8'), ...(rungs.why[head] ? { why: rungs.why[head] } : {}),
    };
    return {
      scheme: 'auto', layerQuant: p.layerQuant, lmHeadQuant: p.lmHeadQuant, minCosine: p.minCosine, layers, ...(lmHead ? { lmHead } : {}),
      layerBytes: { auto: sum('bytes'), w4: sum('w4Bytes'), w8: sum('w8Bytes') }, matrices: rungs.map(), parity: { w4: first.parity, chosen: e.parity },
      decisions: { ...(first.decisions ? { w4: first.decisions } : {}), ...(e.decisions ? { chosen: e.decisions } : {}) }, evaluations,
    };
  } finally {
    await trace.close();
  }
}

export const stage: StageModule<AutoParams> = {
  name: 'precision',
  version: '2',
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
          ...(r.lmHead ? { lmHead: { scheme: r.lmHead.scheme, w4Cosine: r.lmHead.w4Cosine, w4Top1: top1Text(r.lmHead.w4Top1), top1: top1Text(r.lmHead.top1), why: r.lmHead.why ?? '' } } : {}),
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
