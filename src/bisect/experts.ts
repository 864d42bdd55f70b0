// forge bisect: which expert of a mixture-of-experts layer loses the numbers. PhiMoE's experts run
// in one graph every layer shares, fed the rows of the experts the router chose from host tables;
// the oracle gate reports that graph per layer (GateCase.served). A decode case mixes a token's two
// experts, a prefill case runs one expert alone over the chunk's tokens that chose it. An expert the
// shipped precision cannot hold fails the cases that read it; its partners fail only when paired
// with it, so the expert whose cases fail most often (alone first, where it ran alone) is named.
import type { StepCosine } from './steps.js';
import type { Candidate } from './fixes.js';

export interface ExpertFigure {
  expert: number;
  /** Cases (steps and prefill chunks) that read this expert, and how many of them are under the threshold. */
  cases: number;
  failing: number;
  /** Of those, the cases where it ran alone (the experts-prefill graph). */
  alone: number;
  aloneFailing: number;
  /** Its cases' lowest cosine. */
  minCosine: number;
}

/** Per expert read by `cases` (scanned cases of one layer, each with its experts), worst first. */
export function blameExperts(cases: StepCosine[], threshold: number): ExpertFigure[] {
  const by = new Map<number, ExpertFigure>();
  for (const c of cases) {
    if (!c.experts) continue;
    const fails = c.cosine < threshold;
    const solo = c.experts.length === 1;
    for (const e of new Set(c.experts)) {
      const f = by.get(e) ?? { expert: e, cases: 0, failing: 0, alone: 0, aloneFailing: 0, minCosine: Infinity };
      f.cases++;
      f.failing += Number(fails);
      f.alone += Number(solo);
      f.aloneFailing += Number(solo && fails);
      f.minCosine = Math.min(f.minCosine, c.cosine);
      by.set(e, f);
    }
  }
  // Alone, an expert's cases are its own; mixed, a partner of a bad expert shares some of its failures.
  const share = (f: ExpertFigure) => (f.alone ? f.aloneFailing / f.alone : f.failing / f.cases);
  return [...by.values()].sort((a, b) => share(b) - share(a) || a.minCosine - b.minCosine || a.expert - b.expert);
}

/** `expert 3: 12 of 12 cases under 0.999 (alone 4 of 4), lowest 0.41250`. */
export function expertText(f: ExpertFigure, threshold: number): string {
  return `expert ${f.expert}: ${f.failing} of ${f.cases} case${f.cases === 1 ? '' : 's'} under ${threshold}${f.alone ? ` (alone ${f.aloneFailing} of ${f.alone})` : ''}, lowest ${f.minCosine.toFixed(5)}`;
}

/**
 * The fix the experts' host tables honour: the experts' channels rebalanced before quantization
 * (recipe `equalize` lines, expert-tables.ts): the same function, no bytes added. `without`: what the
 * gate saw before, for the lines' why.
 */
export function expertEqualize(layer: number, experts: number[], without: string): Candidate {
  const label = `layer ${layer} expert${experts.length > 1 ? 's' : ''} ${experts.join(' and ')} channels equalized`;
  const match = experts.map((e) => `layers\\.${layer}\\.experts\\.${e}`).join('|');
  return { label, layer, tensors: [], overrides: [], addedBytes: 0, equalize: [{ match, why: `forge bisect: ${label} restores the oracle gate (${without} without it)` }] };
}
