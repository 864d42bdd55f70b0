// forge bisect: free-running drift. Every graph can hold its teacher-forced cosines and the greedy
// chain still pick another token than HF somewhere along a continuation: small errors, a small
// margin. This runs the shipped decode graphs chained (shard k's hidden_out feeds shard k+1, the last
// one feeds the lm-head), fed HF's tokens and KV rows as the gates feed them, and compares each
// step's choice with HF's. Up to the first step where they differ, free-running greedy sees the same
// tokens, so that step is its first divergent token — with one difference: the past K/V rows here are
// HF's, where the free-running chain reads its own, so error carried through the cache is left out
// (the native parity gate runs the runtime's own cache).
//
// Which layers push it over: direct logit attribution through the lm-head. At that step, with a the
// token HF picks and b the one the shipped chain picks, u = W[a] − W[b] (the lm-head rows), and the
// final norm linearised at HF's residual (γ / rms). Layer i's part of the logit difference is
// u·(γ ⊙ Δi)/rms, Δi the error layer i adds to the residual (shipped h.i+1 − h.i less HF's). It is
// exact for the linear part and sums to the whole residual error; chosen over patching each layer
// with HF's output (one rerun per layer) because it needs no rerun, and it says which layer's own
// error moved the logits, not which layer happened to carry the sum.
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { gateCasesOf } from '../families/types.js';
import type { Family } from '../families/types.js';
import type { GateCase } from '../families/types.js';
import { GRAPHS_JSON, type ExportManifest, type GraphEntry } from '../export/graphs.js';
import { Trace } from '../gates/trace.js';
import { gateSessionOptions, writeGateModel } from '../gates/cpu-form.js';
import { formOptions, gateForm, runGateCases } from '../gates/oracle.js';
import { openCheckpoint } from '../io/checkpoint.js';

export interface DriftStep {
  prompt: number;
  step: number;
  /** HF's choice and its runner-up, with HF's margin (top-1 − runner-up logit). */
  hf: { token: number; runnerUp: number; margin: number };
  /** The shipped chain's logit for HF's token less its best other token's (negative: it picks another). */
  shippedMargin: number;
  shippedToken: number;
}

export interface DriftResult {
  /** Every generated step's margins, per prompt in order (the greedy part of each traced prompt). */
  steps: DriftStep[];
  /** The first step whose shipped choice is not HF's. */
  first?: DriftStep;
  /**
   * At `first` (or `attributedAt`): per layer, its part of logit[a] − logit[b] moved by the shipped graphs, largest first
   * by size: `own`, the layer alone fed HF's inputs (where the error is made; the ranking), and
   * `carried`, its increment along the chain (what it adds, its input's error included).
   */
  layers?: Array<{ layer: number; contribution: number; carried?: number }>;
  /** At `first` (or `attributedAt`): the shipped chain's change of logit[a] − logit[b] against HF's, and the part the layers' sum explains. */
  logitDelta?: { actual: number; attributed: number };
  /** Why the chain was not scanned, when it was not. */
  notScanned?: string;
  /**
   * When the attribution was asked for at another step than `first` (the runtime's first divergence,
   * whose token b is the runtime's choice): that step and both tokens; `layers` and `logitDelta` are there.
   */
  attributedAt?: { prompt: number; step: number; hfToken: number; otherToken: number };
}

/** A step to attribute at instead of the chain's own first divergence: HF's token against `token`. */
export interface AttributionStep { prompt: number; step: number; token: number }

const argmax2 = (x: Float32Array, not = -1) => {
  let a = -1, b = -1;
  for (let i = 0; i < x.length; i++) {
    if (i === not) continue;
    if (a < 0 || x[i] > x[a]) { b = a; a = i; } else if (b < 0 || x[i] > x[b]) b = i;
  }
  return [a, b];
};

/**
 * Per layer, the same map applied to its own error: the layer's graph alone (`aloneDir`: one graph per
 * layer, exported at the shipped precision, alone.ts) fed HF's residual and KV rows at the step, its
 * output less HF's. A later layer's increment carries what an earlier one's error does to it (on
 * the planted twin, the layer after the perturbed one shows the larger increment); its own error does
 * not, so this names where the error is made.
 */
export async function ownContributions<C>(family: Family<C>, config: C, traceDir: string, aloneDir: string, scratch: string, at: { prompt: number; step: number }, u: Float32Array, gamma: Float32Array, eps: number): Promise<Array<{ layer: number; contribution: number }>> {
  const manifest = JSON.parse(readFileSync(join(aloneDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  const graphs = manifest.contexts.flatMap((c) => c.graphs).filter((g) => g.n === 1 && g.first !== undefined && g.first === g.last);
  const trace = await Trace.open(traceDir);
  try {
    const last = await trace.get(at.prompt, at.step, `h.${trace.meta.layers}`);
    let ss = 0;
    for (const v of last) ss += v * v;
    const inv = 1 / Math.sqrt(ss / last.length + eps);
    const out: Array<{ layer: number; contribution: number }> = [];
    for (const g of graphs) {
      const form = gateForm(g, 1, false);
      const { path } = writeGateModel(join(aloneDir, g.file), [], join(scratch, g.name), formOptions(g, form));
      const s = await ort.InferenceSession.create(path, gateSessionOptions(form.copies));
      let h: Float32Array | undefined;
      try {
        await runGateCases(s, g.file, atStep(gateCasesOf(family, config, g, trace, manifest.maxContext, aloneDir), at), form, (_c, o) => void (h = o('hidden_out').slice()));
      } finally {
        await s.release();
      }
      const hf = await trace.get(at.prompt, at.step, `h.${g.first! + 1}`);
      let c = 0;
      for (let j = 0; j < hf.length; j++) c += u[j] * gamma[j] * (h![j] - hf[j]);
      out.push({ layer: g.first!, contribution: c * inv });
    }
    return out;
  } finally {
    await trace.close();
  }
}

async function* atStep(cases: AsyncIterable<GateCase>, at: { prompt: number; step: number }): AsyncIterable<GateCase> {
  for await (const c of cases) if (c.prompt === at.prompt && c.step === at.step) yield c;
}

/** Per layer, its share of u·(γ⊙(hS_L − hHF_L))/rms: Δi = (hS_{i+1} − hS_i) − (hHF_{i+1} − hHF_i). Pure: tests give it numbers. */
export function attribute(hS: Float32Array[], hHF: Float32Array[], first: number, u: Float32Array, gamma: Float32Array, eps: number): Array<{ layer: number; contribution: number }> {
  const last = hHF[hHF.length - 1];
  let ss = 0;
  for (const v of last) ss += v * v;
  const inv = 1 / Math.sqrt(ss / last.length + eps);
  return hS.slice(1).map((h, k) => {
    let c = 0;
    for (let j = 0; j < h.length; j++) c += u[j] * gamma[j] * ((h[j] - hS[k][j]) - (hHF[k + 1][j] - hHF[k][j]));
    return { layer: first + k, contribution: c * inv };
  });
}

async function* only(cases: AsyncIterable<GateCase>, hidden: Map<string, Float32Array> | null): AsyncIterable<GateCase> {
  for await (const c of cases) {
    const key = `${c.prompt}/${c.step}`;
    // The chain: the previous graph's output instead of HF's input (the first shard keeps HF's embedding row).
    yield hidden ? { ...c, feeds: { ...c.feeds, ...(hidden.has(key) ? { [Object.keys(c.feeds).find((k) => k === 'hidden_in' || k === 'hidden')!]: { ...c.feeds.hidden_in ?? c.feeds.hidden, data: hidden.get(key)! } } : {}) } } : c;
  }
}

/**
 * Chains the shipped decode graphs of `exportDir` over every traced step. `lmHead`: where the final
 * norm's weight and the lm-head rows are in the checkpoint (tied models read the embedding).
 */
export async function scanDrift<C>(family: Family<C>, config: C, checkpointDir: string, traceDir: string, exportDir: string, scratch: string, names: { finalNorm: string; lmHead: string; eps: number; alone?: string; at?: AttributionStep }): Promise<DriftResult> {
  const manifest = JSON.parse(readFileSync(join(exportDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  const graphs = manifest.contexts.flatMap((c) => c.graphs);
  const shards = graphs.filter((g) => g.n === 1 && g.first !== undefined).sort((a, b) => a.first! - b.first!);
  const head = graphs.find((g) => g.first === undefined && g.outputs.some((o) => o.name === 'logits'));
  // Not scanned (and said so): an export without one-token decode graphs or with the lm-head inside the last shard.
  if (!shards.length || !head) return { steps: [], notScanned: 'drift is scanned on one-token decode graphs with a separate lm-head graph; this export has none' };
  // A layer graph that hands no residual to the next (PhiMoE's attention+router graphs: the host routes each token's experts between them) cannot be chained here.
  if (shards.some((g) => !g.stream)) return { steps: [], notScanned: 'the layers do not hand their residual from graph to graph (the host routes each layer\'s experts between them); the native runtime\'s parity gate checks the chain, with its own routing' };
  const trace = await Trace.open(traceDir);
  // Per case: the chain's residual probes (h.i by layer) and its hidden, then logits.
  const probes = new Map<string, Map<number, Float32Array>>();
  let hidden: Map<string, Float32Array> | null = null;
  const logits = new Map<string, Float32Array>();
  const run = async (entry: GraphEntry, each: (c: GateCase, out: (n: string) => Float32Array) => void) => {
    const form = gateForm(entry, 1, false);
    const { path } = writeGateModel(join(exportDir, entry.file), Object.keys(entry.probes), join(scratch, entry.name), formOptions(entry, form));
    const s = await ort.InferenceSession.create(path, gateSessionOptions(form.copies));
    try {
      await runGateCases(s, entry.file, only(gateCasesOf(family, config, entry, trace, manifest.maxContext, exportDir), hidden), form, each);
    } finally {
      await s.release();
    }
  };
  try {
    for (const shard of shards) {
      const next = new Map<string, Float32Array>();
      await run(shard, (c, out) => {
        const key = `${c.prompt}/${c.step}`;
        const m = probes.get(key) ?? new Map<number, Float32Array>();
        for (const [value, p] of Object.entries(shard.probes)) {
          const l = /^h\.(\d+)$/.exec(p.name);
          if (l) m.set(Number(l[1]), out(value).slice());
        }
        probes.set(key, m);
        next.set(key, out('hidden_out').slice());
      });
      hidden = next;
    }
    await run(head, (c, out) => void logits.set(`${c.prompt}/${c.step}`, out('logits').slice()));

    const steps: DriftStep[] = [];
    for (const [p, prompt] of trace.meta.prompts.entries()) {
      for (let g = 0; g < prompt.generated.length; g++) {
        const step = prompt.prompt_tokens.length - 1 + g;
        const s = logits.get(`${p}/${step}`);
        if (!s) continue;
        const token = prompt.generated[g];
        const [best, second] = argmax2(s);
        const other = best === token ? second : best;
        steps.push({ prompt: p, step, hf: { token, runnerUp: prompt.runner_up[g], margin: prompt.margins[g] }, shippedMargin: s[token] - s[other], shippedToken: best });
      }
    }
    const first = steps.find((s) => s.shippedToken !== s.hf.token);
    // The step attributed: the chain's first divergence, or the one asked for (HF's token against the given one).
    const atStep = names.at ? steps.find((s) => s.prompt === names.at!.prompt && s.step === names.at!.step) : undefined;
    if (names.at && !atStep) throw new Error(`drift attribution: prompt ${names.at.prompt} step ${names.at.step} is not a traced generated step of ${traceDir}`);
    const focus = atStep ? { prompt: atStep.prompt, step: atStep.step, a: atStep.hf.token, b: names.at!.token } : first ? { prompt: first.prompt, step: first.step, a: first.hf.token, b: first.shippedToken } : undefined;
    if (!focus) return { steps };

    const ckpt = await openCheckpoint(checkpointDir);
    let u: Float32Array, gamma: Float32Array;
    try {
      const H = trace.meta.hidden;
      const rows = await ckpt.readF32(names.lmHead);
      u = Float32Array.from({ length: H }, (_, j) => rows[focus.a * H + j] - rows[focus.b * H + j]);
      gamma = await ckpt.readF32(names.finalNorm);
    } finally {
      await ckpt.close();
    }
    const key = `${focus.prompt}/${focus.step}`;
    const layers: Array<{ layer: number; contribution: number }> = [];
    for (const shard of shards) {
      const idx = Array.from({ length: shard.last! - shard.first! + 2 }, (_, k) => shard.first! + k);
      const hHF = await Promise.all(idx.map((i) => trace.get(focus.prompt, focus.step, `h.${i}`)));
      // The shard's input is the chain's (the previous shard's residual is not an output: HF's row stands for it, its error is in hidden).
      const hS = idx.map((i, k) => (k === 0 ? hHF[0] : probes.get(key)!.get(i)!));
      layers.push(...attribute(hS, hHF, shard.first!, u, gamma, names.eps));
    }
    const hfLogits = await trace.get(focus.prompt, focus.step, 'logits');
    const s = logits.get(key)!;
    const actual = (s[focus.a] - s[focus.b]) - (hfLogits[focus.a] - hfLogits[focus.b]);
    const own = names.alone ? await ownContributions(family, config, traceDir, names.alone, join(scratch, 'alone'), focus, u, gamma, names.eps) : undefined;
    const ranked = own ? own.map((o) => ({ ...o, carried: layers.find((l) => l.layer === o.layer)?.contribution ?? 0 })) : layers;
    return {
      steps, ...(first ? { first } : {}), ...(atStep ? { attributedAt: { prompt: focus.prompt, step: focus.step, hfToken: focus.a, otherToken: focus.b } } : {}), layers: ranked.sort((a, b) => Math.abs(b.contribution) - Math.abs(a.contribution)),
      logitDelta: { actual, attributed: layers.reduce((a, l) => a + l.contribution, 0) },
    };
  } finally {
    await trace.close();
    rmSync(scratch, { recursive: true, force: true });
  }
}
