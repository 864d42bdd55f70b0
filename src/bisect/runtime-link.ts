// forge bisect's runtime and device links, wired into run.ts: the parity gate's verdicts read
// (runtime.ts), the runtime's first divergent step weighed layer by layer through the lm-head with
// the drift scan's machinery (HF's token against the runtime's), and the drift fix search rebuilt and
// judged through the parity gate (the runtime itself), not the TypeScript chain.
import { resolve } from 'node:path';
import type { EmulationResult } from '../gates/emulation.js';
import type { TargetSpec } from '../gates/parity.js';
import { readTraceMeta } from '../gates/trace.js';
import { baseScheme, type ArchSettings, type PrecisionOverride } from '../recipe/schema.js';
import type { PrecisionMap } from '../quant/precision.js';
import { driftFixes, scanShipped } from './drift-bisect.js';
import type { DriftResult } from './drift.js';
import { rank } from './fixes.js';
import { flipsBefore, routingFixes } from './routing.js';
import { flipText } from '../gates/oracle.js';
import { chainAt, DEVICE_NOTE, firstDivergence, paritySnapshot, runtimeMessage, verdictAt, type DeviceFindings, type ParityJson } from './runtime.js';
import type { BisectResult } from './run.js';

/** --target adb's phone, as `forge build --target adb` takes it; refused before anything runs when a part is missing. */
export function deviceSpec(target: string, d: { serial?: string; runner?: string; libDir?: string } | undefined): Extract<TargetSpec, { kind: 'adb' }> | undefined {
  if (target !== 'adb') return undefined;
  if (!d?.serial || !d.runner || !d.libDir) throw new Error('forge bisect --target adb needs --serial, --runner and --device-libs (the phone, the Android qhx_generate and the device libraries; see docs/DEVICE.md)');
  return { kind: 'adb', serial: d.serial, runner: resolve(d.runner), libDir: resolve(d.libDir) };
}

/** Per traced prompt, its prompt's length: parity's step k is the trace's position length − 1 + k. */
export const promptLengths = (traceDir: string) => readTraceMeta(traceDir).prompts.map((p) => p.prompt_tokens.length);

/** The healthy message: every link that was run follows HF, the runtime's own KV cache included. */
export function runtimeHealthy(t: BisectResult['thresholds'], r: BisectResult): string {
  const p = r.runtime?.parity;
  const runtime = p ? `, and the native runtime on this CPU follows HF with its own KV cache and host code (parity ${p.total - p.mismatches}/${p.total} equal to HF teacher-forced${p.ties ? `, ${p.ties} tie${p.ties === 1 ? '' : 's'} within the margin` : ''})` : '';
  // The parity gate failed on ties alone: HF's near-ties, which no link causes.
  const ties = p?.tiesOnly
    ? `; the parity gate fails only on ${p.ties} tie${p.ties === 1 ? '' : 's'}, steps where HF's own margin between its token and the runtime's is within what the precision's measured logit error can move: allow them with gates.parity.maxTies and a tiesWhy, or gate prompts HF answers with more confidence`
    : '';
  return `no fault: every graph within tolerance${r.drift?.notScanned ? '' : ' and the chained graphs follow HF\'s greedy continuations'} (fp32 ≥ ${t.fp32}, ${t.quant} ≥ ${t.shipped})${runtime}${ties}`;
}

export interface RuntimeLinkContext {
  family: string;
  ckpt: string;
  traceDir: string;
  quantizeDir: string;
  settings: ArchSettings;
  precision?: PrecisionMap;
  /** Rebuilds through the parity gate (host) with the override lines first; whether the runtime then holds. */
  rebuild: (overrides: PrecisionOverride[]) => Promise<{ quantizeDir?: string; oracleOk: boolean; error?: string; holds?: boolean; stillFails?: string }>;
  log: (m: string) => void;
}

/** The host runtime leaves HF while the ONNX chain holds: names the step, weighs the layers there, tries the drift fixes through parity. */
export async function runtimeLink(result: BisectResult, parity: ParityJson, c: RuntimeLinkContext): Promise<void> {
  const d = firstDivergence(parity, promptLengths(c.traceDir), result.drift?.steps);
  const chain = chainAt(result.drift, d);
  result.runtime = { parity: paritySnapshot(parity), ...(d ? { divergence: d } : {}), ...(chain ? { chain } : {}) };
  const head = runtimeMessage(result.runtime);
  c.log(head);
  result.verdict = 'unfixed';
  result.message = head;
  // No step (non-finite logits) or the fp32 graphs too: no precision change to try.
  if (!d || d.nonFinite || d.variant === 'export') return;
  const scheme = baseScheme(c.settings.quant);
  const attributed = await scanShipped(c.family, c.ckpt, c.traceDir, c.quantizeDir,
    { scheme, lmHeadScheme: baseScheme(c.settings.lmHead.quant), maxContext: c.settings.maxContext, overrides: c.settings.overrides, ...(c.precision ? { precision: c.precision } : {}) },
    { prompt: d.prompt, step: d.position, token: d.runtime.token });
  if (!attributed.layers?.length) {
    const flips = flipsBefore(result.routing, d);
    if (!flips.length) {
      result.message = `${head}; not weighed by layer: ${attributed.notScanned ?? 'no layer attribution'}`;
      return;
    }
    // The host routes between the graphs: a routing flip the oracle's chain saw is the lead.
    const flip = flips[0];
    result.runtime.routing = flips;
    result.trials = await routingFixes({ family: c.family, checkpointDir: c.ckpt, scheme, overrides: c.settings.overrides, ...(c.precision ? { precision: c.precision } : {}), log: c.log, rebuild: c.rebuild }, flip);
    result.fixes = rank(result.trials);
    result.chosen = result.fixes[0];
    result.layer = flip.layer;
    result.verdict = result.chosen ? 'fixed' : 'unfixed';
    const more = flips.length > 1 ? ` (${flips.length - 1} more in this prompt up to that step)` : '';
    result.message = `${head}; a routing flip: the shipped router picks other experts than HF at ${flipText(flip)}${more}; ${result.chosen ? `fix: ${result.chosen.label} (+${result.chosen.addedBytes} bytes), after which the runtime follows HF (parity rebuilt)` : `no candidate brings the runtime back on HF's path (tried ${result.trials.map((t) => t.label).join(', ') || 'none'})`}`;
    return;
  }
  result.runtime.attribution = { layers: attributed.layers, logitDelta: attributed.logitDelta! };
  result.trials = await driftFixes({ family: c.family, checkpointDir: c.ckpt, traceDir: c.traceDir, quantizeDir: c.quantizeDir, scheme, overrides: c.settings.overrides, ...(c.precision ? { precision: c.precision } : {}), log: c.log, rebuild: c.rebuild }, attributed);
  result.fixes = rank(result.trials);
  result.chosen = result.fixes[0];
  result.layer = result.trials[0]?.layer;
  const top = attributed.layers[0];
  const most = `; at that step (HF's ${d.hf.token} against the runtime's ${d.runtime.token}) the shipped graphs' errors through the lm-head come most from layer ${top.layer} (${top.contribution.toFixed(4)})`;
  result.verdict = result.chosen ? 'fixed' : 'unfixed';
  result.message = `${head}${most}; ${result.chosen ? `fix: ${result.chosen.label} (+${result.chosen.addedBytes} bytes), after which the runtime follows HF (parity rebuilt)` : `no candidate brings the runtime back on HF's path (tried ${result.trials.map((t) => t.label).join(', ') || 'none'})`}`;
}

/** The device left HF: its first step, and what the simulator and the host runtime chose there. */
export function deviceFindings(device: ParityJson, emulation: EmulationResult, host: ParityJson, traceDir: string, drift?: DriftResult): DeviceFindings {
  const d = firstDivergence(device, promptLengths(traceDir), drift?.steps);
  const at = d && !d.nonFinite ? d : undefined;
  const hostShipped = host.detail[d?.variant ?? 'quantize'];
  return {
    parity: paritySnapshot(device), ...(d ? { divergence: d } : {}),
    ...(at && emulation.ran ? { simulatorAt: verdictAt(emulation.parity, at.prompt, at.step) } : {}),
    ...(at && hostShipped ? { hostAt: verdictAt(hostShipped, at.prompt, at.step) } : {}),
    note: DEVICE_NOTE,
  };
}
