// forge bisect --target emulation, once the host chain holds: reads the simulator gate, names the
// graph, the op (a probe variant compiled and run on the simulator beside the CPU) and the link
// compile/fp16, then rebuilds with each candidate rescale through the normal cached stages up to the
// emulation gate and keeps those that pass it.
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { GRAPHS_JSON, type ExportManifest } from '../export/graphs.js';
import { getArch } from '../arch/table.js';
import { Trace } from '../gates/trace.js';
import { qnnSimulateScript, type EmulationRan, type EmulationResult } from '../gates/emulation.js';
import { ensureVenv } from '../toolchain/venv.js';
import type { PrecisionOverride, QuantScheme, Rescale } from '../recipe/schema.js';
import type { PrecisionMap } from '../quant/precision.js';
import { modelTensors } from '../families/tensors.js';
import { FP16_MAX, probeGraph, type ProbeResult } from './probe.js';
import { opMatrix, rescaleCandidates, simulatorFigures, simulatorMiss, type SimulatorMiss } from './simulator.js';
import { candidates, type Candidate, type Trial } from './fixes.js';
import { familyConfig } from './family-config.js';

export interface SimulatorPicture {
  graphs: ReturnType<typeof simulatorFigures>;
  parity: { ok: boolean; rule: string; matched?: number; total?: number };
  fp16: boolean;
  threshold: number;
}

export interface SimulatorFindings {
  simulator: SimulatorPicture;
  simFault?: SimulatorMiss;
  probe?: ProbeResult;
  /** The op named: its node, scope, layer and why (overflow, non-finite, cosine). */
  op?: { node: string; op: string; scope: string; layer: number | null; why: string };
  trials: Trial[];
  verdict: 'no-fault' | 'fixed' | 'unfixed';
  message: string;
}

export interface SimulatorContext {
  recipe: string;
  arch: string;
  checkpointDir: string;
  traceDir: string;
  quantizeDir: string;
  emulation: EmulationResult;
  /** Where probe results are cached (under forge's cache, by graph hash). */
  probeCache: string;
  /** The shipped precision: a matrix the op multiplies is tried one rung up from where it ships. */
  shipped: { scheme: QuantScheme; overrides: PrecisionOverride[]; precision?: PrecisionMap };
  /** Rebuilds through the emulation gate with the rescale or override lines first (cached stages). */
  rebuild: (fix: { rescale?: Rescale[]; overrides?: PrecisionOverride[] }) => Promise<{ emulation?: EmulationResult; oracleOk?: boolean; error?: string }>;
  log: (m: string) => void;
}

const fmt = (c: number) => c.toFixed(5);

export function picture(r: EmulationRan): SimulatorPicture {
  return { graphs: simulatorFigures(r), parity: { ok: r.parity.ok, rule: r.parity.rule, matched: r.parity.matched, total: r.parity.total }, fp16: r.simulator.fp16, threshold: r.thresholds.minCosine };
}

const minSim = (r: EmulationRan) => Math.min(...Object.values(r.oracle.graphs).map((g) => (g.nonFinite ? -1 : g.minCosine)));

export async function simulatorBisect(c: SimulatorContext): Promise<SimulatorFindings> {
  const e = c.emulation;
  if (!e.ran) throw new Error(`forge bisect --target emulation: the simulator gate did not run: ${e.reason}`);
  const simulator = picture(e);
  const manifest = JSON.parse(readFileSync(join(c.quantizeDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  const entries = manifest.contexts.flatMap((x) => x.graphs);
  const miss = simulatorMiss(e, entries.map((g) => g.name));
  if (e.ok) return { simulator, trials: [], verdict: 'no-fault', message: `no fault: every graph within tolerance on the CPU and on the x86 HTP simulator (fp16, cosine ≥ ${e.thresholds.minCosine}), parity ${e.parity.matched}/${e.parity.total}` };
  if (!miss) {
    return { simulator, trials: [], verdict: 'unfixed', message: `link compile/fp16: every graph holds teacher-forced on the simulator (≥ ${e.thresholds.minCosine}) but its free-running parity does not (${e.parity.rule}): free-running drift, not an op` };
  }
  const seen = miss.nonFinite ? `a non-finite value (${miss.nonFinite})` : `cosine ${fmt(miss.cosine)} < ${miss.threshold}`;
  c.log(`simulator: ${miss.graph} ${miss.output} ${seen} while the CPU holds: link compile/fp16; probing its ops`);

  const { family, config } = familyConfig(manifest.family, c.checkpointDir);
  const entry = entries.find((g) => g.name === miss.graph)!;
  const arch = getArch(c.arch);
  const python = await ensureVenv();
  mkdirSync(c.probeCache, { recursive: true });
  const trace = await Trace.open(c.traceDir);
  let probe: ProbeResult;
  try {
    probe = await probeGraph({
      family, config, entry, trace, maxContext: manifest.maxContext, graphsDir: c.quantizeDir,
      arch: { id: arch.id, socModel: arch.socModel, dspArch: arch.dspArch, vtcmMb: arch.vtcmMb }, fp16: e.simulator.fp16, threshold: e.thresholds.minCosine,
      python, script: qnnSimulateScript(), timeoutSeconds: 600, cacheDir: c.probeCache, log: c.log,
    });
  } finally {
    await trace.close();
  }
  const f = probe.first;
  const where = `${miss.graph} ${miss.output} (${seen})`;
  if (!f) return { simulator, simFault: miss, probe, trials: [], verdict: 'unfixed', message: `link compile/fp16 at ${where}: no op of the probed cases leaves the CPU's numbers (probed ${probe.cases.length} cases)` };
  const whyOp = probe.why === 'overflow'
    ? `overflows fp16: its inputs up to ${f.inputMaxAbs.toPrecision(4)}, its result up to ${f.cpuMaxAbs.toPrecision(4)} on the CPU > 65504; on the simulator ${f.simNonFinite} non-finite and ${f.simSaturated} saturated entries, cosine ${fmt(f.cosine)}`
    : probe.why === 'non-finite' ? `non-finite on the simulator (${f.simNonFinite} entries) from finite inputs`
      : `cosine ${fmt(f.cosine)} with the CPU < ${e.thresholds.minCosine}${f.inputMaxAbs > FP16_MAX ? `; its input reaches ${f.inputMaxAbs.toPrecision(4)} on the CPU, beyond fp16's ${FP16_MAX}${f.simSaturated ? ` (${f.simSaturated} entries saturated on the simulator)` : ''}` : ''}`;
  const op = { node: f.node, op: f.op, scope: f.scope, layer: f.layer, why: whyOp };
  c.log(`op: ${f.node} (${f.op}) ${whyOp}`);

  // Cheapest first: the exact rescales (no bytes), then the matrix the op multiplies one precision up.
  const rescales: Candidate[] = rescaleCandidates(probe, family.numLayers(config), family.rescalePairs)
    .map((r) => ({ label: r.label, layer: f.layer ?? -1, tensors: [], overrides: [], addedBytes: 0, rescale: r.rescale, addedOps: r.addedOps, ...(r.what ? { what: r.what } : {}) }));
  const matrix = f.layer === null ? undefined : opMatrix((await modelTensors(family, config)).layers[f.layer] ?? [], f.scope, f.layer);
  const precisions = matrix ? candidates(f.layer!, [matrix], c.shipped.scheme, c.shipped.overrides, c.shipped.precision, `${miss.graph} ${miss.output} on the simulator`, 'the simulator gate').single : [];
  const trials: Trial[] = [];
  for (const cand of [...rescales, ...precisions]) {
    const t = performance.now();
    const r = await c.rebuild(cand.rescale ? { rescale: cand.rescale } : { overrides: cand.overrides });
    const seconds = (performance.now() - t) / 1000;
    const ran = r.emulation?.ran ? r.emulation : undefined;
    const ok = !!ran && ran.ok && r.oracleOk !== false;
    const still = ran && !ran.ok ? simulatorMiss(ran, entries.map((g) => g.name)) : undefined;
    const trial: Trial = {
      ...cand, ok, seconds,
      ...(ran ? { minCosine: minSim(ran) } : {}),
      ...(ok ? {} : { stillFails: still ? `${still.graph} ${still.output} ${still.nonFinite ?? fmt(still.cosine)}` : r.error ?? (ran && !ran.parity.ok ? `parity: ${ran.parity.rule}` : r.oracleOk === false ? 'the oracle gate' : 'no simulator result') }),
    };
    c.log(`  ${cand.label}${cand.rescale ? ` (scale ${cand.rescale[0].scale})` : ''}: ${ok ? 'restores the simulator gate' : `still fails (${trial.stillFails})`}; simulator min cosine ${trial.minCosine !== undefined ? fmt(trial.minCosine) : '-'}, ${seconds.toFixed(1)} s`);
    trials.push(trial);
    if (ok) break; // the candidates come cheapest first: the first that passes is the fix
  }
  const fixed = trials.find((t) => t.ok);
  const head = `link compile/fp16: the shipped graphs hold on the CPU, the compiled ${miss.graph} leaves tolerance on the simulator at ${where}; op ${f.node} (layer ${f.layer ?? '-'}) ${whyOp}`;
  // What forge does not try: the HTP has no fp32 for one op, and forge compiles whole graphs (no host fallback for an op).
  const notTried = 'not tried: running this op outside the compiled graph (forge compiles whole graphs and has no host fallback for one op)';
  if (!fixed) {
    const none = `no rescale applies to this op (this family rescales its RMSNorms${(family.rescalePairs ?? []).map((p) => `, ${p.pair}`).join('')})${matrix ? '' : ' and it multiplies no checkpoint matrix'}`;
    return { simulator, simFault: miss, probe, op, trials, verdict: 'unfixed', message: `${head}; ${trials.length ? `no candidate restores the gate (tried ${trials.map((t) => t.label).join(', ')})` : none}; ${notTried}` };
  }
  const how = fixed.rescale ? `an exact power-of-two rescale, ${fixed.addedOps} op${fixed.addedOps === 1 ? '' : 's'} added` : `+${fixed.addedBytes} bytes of weights`;
  return { simulator, simFault: miss, probe, op, trials, verdict: 'fixed', message: `${head}; fix: ${fixed.label} (${how}; simulator min cosine ${fmt(fixed.minCosine ?? NaN)})` };
}

