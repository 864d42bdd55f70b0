// forge bisect, link `hand-off`: the oracle gate failed only because the recipe requires f16
// residual hand-offs between contexts (`handoff: f16`) and the chain with them does not hold, while
// every graph holds teacher-forced. Names the hand-off and the first step where the f16 chain leaves
// HF (handoff.ts), and tries the one fix there is for it: `handoff: f32` for the arch, rebuilt
// through the oracle gate with the cached stages (only the oracle re-runs: its params change, the
// graphs do not) and judged as every other fix is.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { Family } from '../families/types.js';
import type { HandoffChoice, OracleResult } from '../gates/oracle.js';
import { judge, type Candidate, type Trial } from './fixes.js';
import { SHIPPED_VARIANT } from './locate.js';
import { boundaryText, scanHandoffs, type HandoffScan, type HandoffStep } from './handoff.js';

export interface HandoffFindings extends HandoffScan {
  link: 'hand-off';
  /** The export input the gate chained with f16 hand-offs (`quantize`: the shipped graphs). */
  variant: string;
  /** What the gate chose and why (it refused f16). */
  choice: { dtype: HandoffChoice['dtype']; why: string };
}

/**
 * The gate's hand-off choice when it alone failed the gate: the recipe requires f16 (`handoff: f16`),
 * the gate found f16 does not hold for the shipped graphs, and no row or graph failed on its own.
 */
export function handoffOnly(oracle: OracleResult, recipeHandoff: string): HandoffChoice | undefined {
  if (oracle.ok || recipeHandoff !== 'f16') return undefined;
  const choice = oracle.handoff?.[SHIPPED_VARIANT];
  if (!choice || choice.dtype === 'float16') return undefined;
  if (oracle.rows.some((r) => !r.ok) || Object.values(oracle.graphs).some((g) => !g.ok)) return undefined;
  return choice;
}

const sci = (x: number) => x.toExponential(3);

/** Where the f16 chain leaves HF, in words. */
export function stepText(s: HandoffStep): string {
  if (s.kind === 'non-finite') return `prompt ${s.prompt} step ${s.step}: the residual ${s.boundary} reaches |${sci(s.maxAbs!)}| > 65504, Inf as f16`;
  return `prompt ${s.prompt} step ${s.step}: a greedy flip, HF's token ${s.hf!.token} by margin ${s.hf!.margin.toFixed(4)}; float32 hand-offs keep it (margin ${s.f32Margin!.toFixed(4)}), f16 ${s.f16Token !== undefined ? `picks ${s.f16Token} (margin for HF's ${s.f16Margin!.toFixed(4)})` : 'gives no logits'}`;
}

/** The `handoff: f32` candidate: no weight moves; each hand-off costs 2 bytes × hidden more per token. */
export function handoffCandidate(scan: HandoffScan, archId: string): Candidate {
  const n = scan.boundaries.length;
  return {
    label: `handoff: f32 (arch ${archId})`,
    ...(scan.boundary?.afterLayer != null ? { layer: scan.boundary.afterLayer } : {}),
    tensors: [],
    overrides: [],
    addedBytes: 0,
    handoff: 'f32',
    handoffBytesPerToken: 2 * scan.hidden * n,
  };
}

export function handoffCost(c: Candidate, hidden: number): string {
  const n = c.handoffBytesPerToken! / (2 * hidden);
  return `+${c.handoffBytesPerToken} B per token hand-off (2 bytes × ${hidden} hidden × ${n} hand-off${n === 1 ? '' : 's'})`;
}

export async function handoffBisect<C>(a: {
  family: Family<C>; config: C; traceDir: string; quantizeDir: string; arch: string; choice: HandoffChoice;
  rebuild: () => Promise<{ oracle?: OracleResult; error?: string }>; log: (m: string) => void;
}): Promise<{ handoff: HandoffFindings; trials: Trial[]; message: string }> {
  a.log(`every graph holds teacher-forced, but the gate refused f16 hand-offs (${a.choice.why}); chaining the shipped graphs with float32 and f16 hand-offs`);
  const scan = await scanHandoffs(a.family, a.config, a.traceDir, a.quantizeDir, mkdtempSync(join(tmpdir(), 'forge-bisect-handoff-')));
  const handoff: HandoffFindings = { link: 'hand-off', variant: SHIPPED_VARIANT, choice: { dtype: a.choice.dtype, why: a.choice.why }, ...scan };
  const where = scan.boundary ? `the hand-off ${boundaryText(scan.boundary)}` : `the f16 hand-offs (${scan.unnamed})`;
  const at = scan.first ? `, first at ${stepText(scan.first)}` : '';
  const over = scan.boundary && scan.boundary.overflowSteps ? ` (${scan.boundary.overflowSteps} of ${scan.boundary.steps} steps past f16's range there)` : '';
  const link = `link hand-off: every graph holds teacher-forced, the chain with f16 hand-offs does not: ${where}${at}${over}`;
  const c = handoffCandidate(scan, a.arch);
  a.log(`${link}; trying ${c.label}`);
  const t = performance.now();
  const r = await a.rebuild();
  const seconds = (performance.now() - t) / 1000;
  const trial: Trial = r.oracle ? judge(c, r.oracle, seconds) : { ...c, ok: false, error: r.error ?? 'the build stopped before the oracle gate', seconds };
  a.log(`  ${c.label}: ${trial.ok ? 'restores the gate' : `gate still fails${trial.stillFails ? ` (${trial.stillFails})` : trial.error ? ` (${trial.error})` : ''}`}; ${handoffCost(c, scan.hidden)}, ${seconds.toFixed(1)} s`);
  const message = trial.ok ? `${link}; fix: ${c.label}, ${handoffCost(c, scan.hidden)}, no weight bytes` : `${link}; ${c.label} does not restore the gate either (${trial.stillFails ?? trial.error ?? 'failed'})`;
  return { handoff, trials: [trial], message };
}
