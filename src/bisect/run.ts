// `forge bisect <recipe> --arch <arch>`: where the shipped numbers leave the HF reference, which link
// of the chain moved them, and which precision change brings them back (issue 17, step 1: the host
// target, quantization faults). It builds the recipe through the oracle gate with the normal cached
// stages, reads the gate's result (a failed gate still leaves its oracle.json in the cache: the
// gate stays as strict as for `forge build`), names the first layer and step that leave tolerance,
// weighs each layer alone to find the one doing the damage, and rebuilds with candidate overrides.
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { build, checkPrompts, defaultOut } from '../build.js';
import { archSettings, loadRecipe } from '../recipe/load.js';
import { baseScheme, shippedMinCosine, type Equalize, type PrecisionOverride, type Rescale } from '../recipe/schema.js';
import type { EmulationResult } from '../gates/emulation.js';
import { cacheRoot } from '../paths.js';
import { silentProgress } from '../engine/progress.js';
import type { RunRecord } from '../engine/record.js';
import { routingText, type OracleResult } from '../gates/oracle.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { getFamily } from '../families/index.js';
import { runtimeHostOps } from '../../pipelines/build.js';
import { modelTensors } from '../families/tensors.js';
import { PRECISION_JSON } from '../quant/precision.js';
import type { PrecisionResult } from '../quant/auto.js';
import { layerFigures, locateMiss, type LayerFigures, type Miss } from './locate.js';
import { scanSteps, type StepScan } from './steps.js';
import { layersAlone, type AloneFigure } from './alone.js';
import { candidates, judge, rank, readJson, stageDir, together, matricesTogether, type Candidate, type Trial } from './fixes.js';
import type { RoutingTally, TensorSpec } from '../families/types.js';
import { noFaultWarnings, type Warning } from './warnings.js';
import { applyHandoff, applyOverrides } from './apply.js';
import { handoffBisect, handoffOnly, type HandoffFindings } from './handoff-bisect.js';
import { writeBisectOutput } from './report.js';
import { simulatorBisect, type SimulatorFindings } from './sim-bisect.js';
import { driftFixes, driftMessage, scanShipped } from './drift-bisect.js';
import { searchLmHead } from './lm-head.js';
import { opText, probeQuantOps, type QuantOpProbe } from './quant-op.js';
import { GRAPHS_JSON, type ExportManifest } from '../export/graphs.js';
import type { DriftResult } from './drift.js';
import type { TargetSpec } from '../gates/parity.js';
import { deviceMessage, firstBrokenLink, firstDivergence, parityHolds, paritySnapshot, tiesOnly, type DeviceFindings, type Link, type LinkVerdicts, type ParityJson, type RuntimeFindings } from './runtime.js';
import { deviceFindings, deviceSpec, promptLengths, runtimeHealthy, runtimeLink } from './runtime-link.js';
import { defaultTarget, fromText, readFromFile, resolveStart, type FromFile } from './from.js';
import { firstRunDivergence, runDivergenceText, type RunDivergence } from './runtime-run.js';
import { readTraceMeta } from '../gates/trace.js';
import type { TraceInput } from '../gates/trace-stage.js';
import { familyConfig } from './family-config.js';
import { blameExperts, expertEqualize, expertText, type ExpertFigure } from './experts.js';

export const TARGETS = ['host', 'emulation', 'adb'] as const;

export interface BisectRequest {
  /** The recipe id; optional with `from` a run record (which names it). */
  recipe?: string;
  arch?: string;
  target?: string;
  /** --prompt: the porter's prompts instead of the recipe's gates.prompts, for every build bisect makes. */
  prompts?: string[];
  /** --from: a forge build's run.json (recipe and arch from it) or a qhx_generate --json result (its prompt ids traced). */
  from?: string;
  /** Write the chosen fix into the recipe file as override lines. */
  apply?: boolean;
  /** Default out/<recipe>/<arch>/bisect. */
  out?: string;
  verbose?: boolean;
  /** Progress lines (stderr by the CLI). */
  log?: (m: string) => void;
  /** How many layers (worst alone first) the fix search tries before giving up (default 2). */
  maxLayers?: number;
  /** --target adb: the phone, as `forge build --target adb` takes it (--serial, --runner, --device-libs). */
  device?: { serial?: string; runner?: string; libDir?: string };
}

export interface BisectResult {
  recipe: string;
  arch: string;
  target: 'host' | 'emulation' | 'adb';
  recipeFile: string;
  /** The first link of the chain that breaks (firstBrokenLink over what was run); absent when every link run holds. */
  link?: Link;
  /**
   * The prompts every build of this bisect traced: the recipe's gates.prompts, --prompt's, or (--from
   * a qhx_generate result) the run's prompt ids, with their text as the tokenizer decodes them.
   */
  prompts: { source: 'recipe' | '--prompt' | '--from'; texts: string[]; ids?: number[][] };
  /** --from: the build (or runtime run) bisect started from, as the file says. */
  from?: FromFile;
  /** --from a qhx_generate result: where the run's own tokens leave HF's greedy continuation. */
  run?: RunDivergence;
  verdict: 'no-fault' | 'fixed' | 'unfixed' | 'export';
  message: string;
  thresholds: { fp32: number; shipped: number; quant: string };
  /** The oracle build bisect read: its status and stages (cached or ran). */
  build: { status: string; seconds: number; stages: Array<{ name: string; status: string; seconds: number; key?: string }> };
  fault?: Miss;
  /** Under a "no fault" verdict: a weak but passing layer, a logit error close to HF's margins. */
  warnings?: Warning[];
  /** Every layer that fails the shipped threshold alone (fed HF's inputs), worst first. */
  faulty?: number[];
  /** The faulty graph re-run case by case: the first traced step under tolerance. */
  steps?: StepScan;
  /** A fault in a graph every layer shares (PhiMoE's experts): that layer's experts, worst first, from the scanned cases that read each. */
  experts?: { layer: number; graphs: string[]; threshold: number; figures: ExpertFigure[] };
  /** Per layer, each variant's smallest cosine in the oracle gate (teacher-forced per graph). */
  layers: LayerFigures[];
  /** Per layer, the shipped precision's cosine with the layer gated alone. */
  alone?: AloneFigure[];
  /** The layers the fix search tried, worst alone first, and why. */
  suspects?: Array<{ layer: number; why: string }>;
  /**
   * The layer bisect names: the one whose fix restores the gate (else the worst alone). It can come
   * before `fault.layer`: a graph's later probes carry every earlier layer's error.
   */
  layer?: number;
  trials: Trial[];
  /** The trials that restore the gate, cheapest first. */
  fixes: Trial[];
  chosen?: Trial;
  applied?: { file: string; overrides: PrecisionOverride[]; rescale?: Rescale[]; equalize?: Equalize[]; handoff?: 'f32' };
  /** --target emulation: the simulator gate's figures, and when it failed, the graph, the op and link compile/fp16. */
  simulator?: SimulatorFindings['simulator'];
  simFault?: SimulatorFindings['simFault'];
  probe?: SimulatorFindings['probe'];
  op?: SimulatorFindings['op'];
  /**
   * --target host, link quantization: the named layer op by op, fp32 vs the shipped precision, and
   * the op where the cosine drops (quant-op.ts); `quantOpError` when the probe itself failed.
   */
  quantOp?: QuantOpProbe;
  quantOpError?: string;
  /** The shipped graphs chained on the CPU against HF's greedy continuations (when the teacher-forced gates hold). */
  drift?: DriftResult;
  /** A family that routes on the host (PhiMoE): the shipped router against HF's choice, chained, from the oracle gate. */
  routing?: RoutingTally;
  /** The native runtime on the host, teacher-forced with its own KV cache (the parity gate), when the ONNX chain holds. */
  runtime?: RuntimeFindings;
  /** --target adb: the runtime on the phone (the parity gate over adb), when the host and the simulator hold. */
  device?: DeviceFindings;
  /** Link hand-off: the gate failed only on the f16 residual hand-offs between contexts; which one, and the first step it leaves HF. */
  handoff?: HandoffFindings;
  seconds: number;
}

const fmt = (c: number) => c.toFixed(5);

export interface ChainBuild { record: RunRecord; oracle?: OracleResult; emulation?: EmulationResult; parity?: ParityJson; dirs: Record<string, string | undefined> }

/**
 * Builds through the oracle gate, or the emulation gate with `until: 'emulation'`, or the parity
 * gate with `until: 'parity'` on `target` (default host) (cached stages), into a throwaway output dir
 * and returns the record with the gates' results (a failed gate's result is in the cache all the same).
 */
export async function chainBuild(recipe: string, arch: string, o: { overrides?: PrecisionOverride[]; rescale?: Rescale[]; equalize?: Equalize[]; handoff?: 'f32'; prompts?: TraceInput[]; until?: 'oracle' | 'emulation' | 'parity'; target?: TargetSpec; verbose?: boolean; quiet: boolean }): Promise<ChainBuild> {
  // The build's own build/ folder goes to a temporary dir: out/<recipe>/<arch>/ keeps the user's last build.
  const out = mkdtempSync(join(tmpdir(), 'forge-bisect-'));
  try {
    const common = { recipe, arch, out, verbose: o.verbose, ...(o.overrides ? { overrides: o.overrides } : {}), ...(o.rescale ? { rescale: o.rescale } : {}), ...(o.equalize ? { equalize: o.equalize } : {}), ...(o.handoff ? { handoff: o.handoff } : {}), ...(o.prompts ? { prompts: o.prompts } : {}), ...(o.quiet ? { progress: silentProgress } : {}) };
    const record = await build({ ...common, until: 'oracle' });
    // Ctrl-C stops the build (it kills its stages and says so): bisect stops with it, not at the next trial.
    if (record.status === 'interrupted') throw new Error(`forge bisect: ${record.error ?? 'interrupted'}`);
    const dir = (s: string) => stageDir(cacheRoot(), record.stages, s);
    const oracleDir = dir('oracle');
    const dirs: Record<string, string | undefined> = { fetch: dir('fetch'), trace: dir('trace'), export: dir('export'), quantize: dir('quantize'), precision: dir('precision') };
    const done = (r: RunRecord, name: string) => ['ran', 'cached'].includes(r.stages.find((s) => s.name === name)?.status ?? '');
    if (!oracleDir || !done(record, 'oracle')) return { record, dirs };
    const oracle = readJson<OracleResult>(join(oracleDir, 'oracle.json'));
    if ((o.until !== 'emulation' && o.until !== 'parity') || !oracle.ok) return { record, oracle, dirs };
    // The emulation gate does not hang on the oracle's (the pipeline runs them side by side): a
    // second build up to it (or to parity, on the target asked), whose stages in common with the first come from the cache.
    const gate = o.until;
    const later = await build({ ...common, until: gate, ...(o.target ? { target: o.target } : {}) });
    if (later.status === 'interrupted') throw new Error(`forge bisect: ${later.error ?? 'interrupted'}`);
    dirs[gate] = stageDir(cacheRoot(), later.stages, gate);
    const merged: RunRecord = { ...later, stages: [...record.stages, ...later.stages.filter((s) => !record.stages.some((r) => r.name === s.name))] };
    const file = dirs[gate] && done(later, gate) ? join(dirs[gate]!, `${gate}.json`) : undefined;
    const found = !file || !existsSync(file) ? {} : gate === 'emulation' ? { emulation: readJson<EmulationResult>(file) } : { parity: readJson<ParityJson>(file) };
    return { record: merged, oracle, ...found, dirs };
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
}

export async function bisect(req: BisectRequest): Promise<BisectResult> {
  const t0 = performance.now();
  const log = req.log ?? (() => {});
  const from = req.from ? readFromFile(req.from) : undefined;
  const start = resolveStart({ recipe: req.recipe, arch: req.arch, from });
  if (from?.kind === 'qhx' && req.prompts) throw new Error(`forge bisect: --prompt and --from ${from.file} (a qhx_generate result, whose prompt ids are traced): give one of them`);
  const target = req.target ?? defaultTarget(from);
  if (target !== 'host' && target !== 'emulation' && target !== 'adb') throw new Error(`forge bisect --target ${target}: unknown; --target host (the ONNX graphs and the native runtime on this machine's CPU), emulation (then the compiled graphs on the x86 HTP simulator) or adb (then the runtime on a phone)`);
  const device = deviceSpec(target, req.device);
  const { recipe, file } = loadRecipe(start.recipe);
  const { arch, settings } = archSettings(recipe, start.arch, file);
  if (from) log(`starting from ${fromText(from)}`);
  if (from?.kind === 'run-record' && from.toolchain) log(`note: that build compiled with the pinned toolchain ${from.toolchain}; bisect has no --toolchain yet and builds with this environment's`);
  // Checked before any build: an empty --prompt is one error, not a trace failure minutes later.
  const traced: TraceInput[] | undefined = from?.kind === 'qhx' ? [{ type: 'ids', ids: from.promptIds }] : req.prompts ? checkPrompts(req.prompts) : undefined;
  const prompts: BisectResult['prompts'] = from?.kind === 'qhx' ? { source: '--from', texts: [], ids: [from.promptIds] }
    : req.prompts ? { source: '--prompt', texts: req.prompts } : { source: 'recipe', texts: recipe.gates.prompts };
  // Every build bisect makes (the base one and each fix trial) traces the same prompts.
  const chain = (o: Omit<Parameters<typeof chainBuild>[2], 'prompts'>) => chainBuild(recipe.id, arch.id, { ...o, ...(traced ? { prompts: traced } : {}) });
  const o = recipe.gates.oracle;
  const thresholds = { fp32: o.fp32MinCosine, shipped: shippedMinCosine(o, settings.quant), quant: settings.quant };
  const outDir = req.out ? resolve(req.out) : join(defaultOut(recipe.id, arch.id), 'bisect');
  // A family whose host-op the runtime lacks (gemma4 for now) cannot reach a stage that runs it: the chain ends at the ONNX graphs.
  const hostOp = getFamily(recipe.family).hostOp;
  const noRuntime = runtimeHostOps().has(hostOp) ? undefined : `the runtime link is not checked: the native runtime has no host-op '${hostOp}' for family ${recipe.family} yet`;
  if (noRuntime && target !== 'host') throw new Error(`forge bisect --target ${target}: ${noRuntime}, so no simulator or device run either; use --target host`);

  // --target adb runs the emulation chain first: the simulator is the device's reference.
  const until = target === 'host' ? 'oracle' : 'emulation';
  log(`building ${recipe.id} for ${arch.id} through the ${until} gate (cached stages)`);
  const base = await chain({ until, verbose: req.verbose, quiet: false });
  const buildInfo = { status: base.record.status, seconds: base.record.seconds, stages: base.record.stages.map((s) => ({ name: s.name, status: s.status, seconds: s.seconds, ...(s.key ? { key: s.key } : {}) })) };
  if (!base.oracle) throw new Error(`forge bisect: the build of recipe ${recipe.id} (${file}) for ${arch.id} stopped before the oracle gate gave a verdict: ${base.record.error ?? 'no oracle stage ran'}`);
  const layers = layerFigures(base.oracle.rows);
  // What every later step reads: the checkpoint the build fetched, and auto's precision map when the recipe has one.
  const ckpt = readCheckpointRef(base.dirs.fetch!).absDir;
  const precision = base.dirs.precision ? readJson<PrecisionResult>(join(base.dirs.precision, PRECISION_JSON)).matrices : undefined;
  let run: RunDivergence | undefined;
  if (from?.kind === 'qhx') {
    // HF's continuation of the run's own prompt ids: where the run's tokens first leave it.
    const hf = readTraceMeta(base.dirs.trace!).prompts;
    prompts.texts = hf.map((p) => p.text);
    run = firstRunDivergence(hf[0], from.generatedIds);
    log(runDivergenceText(run));
  }
  const result: BisectResult = {
    recipe: recipe.id, arch: arch.id, target, recipeFile: file, prompts, ...(from ? { from } : {}), ...(run ? { run } : {}), verdict: 'no-fault', message: '', thresholds, build: buildInfo, layers, trials: [], fixes: [], seconds: 0,
  };
  // What each link gave, in chain order: the link named in bisect.json is the first that broke.
  const verdicts: LinkVerdicts = { oracle: null };
  const finish = () => {
    const link = firstBrokenLink(verdicts);
    if (link) result.link = link;
    if (result.verdict === 'no-fault' && base.oracle) {
      // Nothing broke: what still deserves a look (a weak but passing layer, logits close to HF's margins).
      const w = noFaultWarnings(layers, thresholds.shipped, base.oracle.logitError.quantize, readTraceMeta(base.dirs.trace!).prompts.flatMap((p) => p.margins), result.routing);
      if (w.length) {
        result.warnings = w;
        result.message += `; worth a look: ${w.map((x) => x.text).join('; ')}`;
      }
    }
    result.seconds = (performance.now() - t0) / 1000;
    if (run) result.message = `${runDivergenceText(run)}; the chain on that prompt: ${result.message}`;
    writeBisectOutput(outDir, result);
    return result;
  };
  const handoffChoice = handoffOnly(base.oracle, settings.handoff);
  if (handoffChoice) {
    verdicts.oracle = 'hand-off';
    const { family, config } = familyConfig(recipe.family, ckpt);
    const found = await handoffBisect({
      family, config, traceDir: base.dirs.trace!, quantizeDir: base.dirs.quantize!, arch: arch.id, choice: handoffChoice, log,
      rebuild: async () => {
        const r = await chain({ handoff: 'f32', verbose: req.verbose, quiet: true });
        return { ...(r.oracle ? { oracle: r.oracle } : {}), ...(r.record.error ? { error: r.record.error } : {}) };
      },
    });
    Object.assign(result, { handoff: found.handoff, trials: found.trials, fixes: rank(found.trials), message: found.message });
    result.chosen = result.fixes[0];
    result.layer = found.handoff.boundary?.afterLayer ?? undefined;
    result.verdict = result.chosen ? 'fixed' : 'unfixed';
    if (req.apply && result.chosen?.handoff) result.applied = applyHandoff(file, arch.id, result.chosen.handoff);
    return finish();
  }
  const miss = locateMiss(base.oracle, thresholds);
  verdicts.oracle = miss ? miss.link : null;
  if (!miss) {
    // Every teacher-forced graph holds on the CPU: the chained graphs may still leave HF's greedy path.
    result.drift = await scanShipped(recipe.family, ckpt, base.dirs.trace!, base.dirs.quantize!,
      { scheme: baseScheme(settings.quant), lmHeadScheme: baseScheme(settings.lmHead.quant), maxContext: settings.maxContext, overrides: settings.overrides, ...(precision ? { precision } : {}) });
    const chained = base.oracle.decisions?.quantize;
    // Not scanned here (the host routes between the graphs): the oracle's own chain of them, with HF's routing, says whether it keeps HF's greedy path.
    if (result.drift.notScanned && chained) result.drift.notScanned += `; the oracle gate's chain of them with HF's routing picks HF's token at ${chained.agree} of ${chained.steps} greedy steps (smallest margin ${chained.minMargin.toFixed(4)}, ${chained.at})`;
    const routing = base.oracle.routing?.quantize;
    if (routing) {
      result.routing = routing;
      // The tally only: the flips themselves are listed once, as a warning (warnings.ts) or the runtime link's lead.
      if (result.drift.notScanned) result.drift.notScanned += `; ${routingText(routing, 0)}`;
    }
    verdicts.drift = !!result.drift.first;
    if (result.drift.first) {
      log(driftMessage(result.drift));
      result.trials = await driftFixes({
        family: recipe.family, checkpointDir: ckpt, traceDir: base.dirs.trace!, quantizeDir: base.dirs.quantize!,
        scheme: baseScheme(settings.quant), overrides: settings.overrides, ...(precision ? { precision } : {}), log,
        rebuild: async (overrides) => {
          const r = await chain({ overrides, verbose: req.verbose, quiet: true });
          return { oracleOk: !!r.oracle?.ok, ...(r.dirs.quantize ? { quantizeDir: r.dirs.quantize } : {}), ...(r.record.error ? { error: r.record.error } : {}) };
        },
      }, result.drift);
      result.fixes = rank(result.trials);
      result.chosen = result.fixes[0];
      result.layer = result.trials[0]?.layer;
      result.verdict = result.chosen ? 'fixed' : 'unfixed';
      result.message = `${driftMessage(result.drift)}; ${result.chosen ? `fix: ${result.chosen.label} (+${result.chosen.addedBytes} bytes)` : `no candidate keeps the chain on HF's path (tried ${result.trials.map((t) => t.label).join(', ')})`}`;
      if (req.apply && result.chosen) result.applied = applyOverrides(file, arch.id, result.chosen.overrides);
      return finish();
    }
  }
  let host: ChainBuild | undefined;
  if (!miss && noRuntime) {
    result.message = `${runtimeHealthy(thresholds, result)}; ${noRuntime}`;
    return finish();
  }
  if (!miss) {
    // The ONNX chain holds: the native runtime on this CPU, with its own KV cache and host code.
    log('the ONNX chain holds: building through the parity gate (the native runtime on this CPU, cached stages)');
    host = await chain({ until: 'parity', target: { kind: 'host' }, verbose: req.verbose, quiet: true });
    if (!host.parity) throw new Error(`forge bisect: the build of ${recipe.id} for ${arch.id} stopped before the parity gate gave a verdict: ${host.record.error ?? 'no parity stage ran'}`);
    result.runtime = { parity: paritySnapshot(host.parity) };
    // A gate failed on ties alone is HF's hesitation, not the runtime's: said in the healthy message.
    verdicts.runtime = parityHolds(host.parity) || tiesOnly(host.parity);
    if (!verdicts.runtime) {
      await runtimeLink(result, host.parity, {
        traceDir: base.dirs.trace!, ckpt, quantizeDir: base.dirs.quantize!, family: recipe.family, settings, ...(precision ? { precision } : {}), log,
        rebuild: async (overrides) => {
          const r = await chain({ overrides, until: 'parity', target: { kind: 'host' }, verbose: req.verbose, quiet: true });
          const holds = r.parity ? parityHolds(r.parity) : undefined;
          const d = r.parity && !holds ? firstDivergence(r.parity, promptLengths(base.dirs.trace!)) : undefined;
          return { oracleOk: !!r.oracle?.ok, ...(r.dirs.quantize ? { quantizeDir: r.dirs.quantize } : {}), ...(r.record.error && !r.parity ? { error: r.record.error } : {}),
            ...(holds !== undefined ? { holds } : {}), ...(d ? { stillFails: `the runtime leaves HF at prompt ${d.prompt} step ${d.step}` } : {}) };
        },
      });
      if (req.apply && result.chosen) result.applied = applyOverrides(file, arch.id, result.chosen.overrides);
      return finish();
    }
    log(`the native runtime follows HF on this CPU: parity ${host.parity.matched}/${host.parity.total}${host.parity.ties ? `, ${host.parity.ties} tie${host.parity.ties === 1 ? '' : 's'}` : ''}`);
  }
  if (!miss && target !== 'host') {
    // The host chain holds: the next link is the compile for the HTP and its fp16 on the simulator.
    if (!base.emulation) throw new Error(`forge bisect --target ${target}: the build of ${recipe.id} for ${arch.id} stopped before the emulation gate gave a verdict: ${base.record.error ?? (recipe.gates.emulation ? 'no emulation stage ran' : 'the recipe does not ask for it (gates.emulation)')}`);
    const found = await simulatorBisect({
      recipe: recipe.id, arch: arch.id, checkpointDir: ckpt, traceDir: base.dirs.trace!, quantizeDir: base.dirs.quantize!, emulation: base.emulation,
      probeCache: join(cacheRoot(), 'bisect-probe'), log,
      shipped: { scheme: baseScheme(settings.quant), overrides: settings.overrides, ...(precision ? { precision } : {}) },
      rebuild: async (fix) => {
        const r = await chain({ ...fix, until: 'emulation', verbose: req.verbose, quiet: true });
        return { ...(r.emulation ? { emulation: r.emulation } : {}), ...(r.oracle ? { oracleOk: r.oracle.ok } : {}), ...(r.record.error ? { error: r.record.error } : {}) };
      },
    });
    verdicts.simulator = found.verdict === 'no-fault';
    if (verdicts.simulator && device) {
      // Host and simulator hold: the same runtime on the phone's HTP, teacher-forced over adb.
      log(`the simulator holds: building through the parity gate on ${device.serial} (adb)`);
      const dev = await chain({ until: 'parity', target: device, verbose: req.verbose, quiet: true });
      if (!dev.parity) throw new Error(`forge bisect --target adb: the device parity on ${device.serial} gave no verdict: ${dev.record.error ?? 'no parity stage ran'}`);
      result.simulator = found.simulator;
      result.device = deviceFindings(dev.parity, base.emulation, host!.parity!, base.dirs.trace!, result.drift);
      verdicts.device = parityHolds(dev.parity);
      result.message = verdicts.device
        ? `${runtimeHealthy(thresholds, result)}; the x86 simulator and the device (${dev.parity.target}) follow HF too: parity ${dev.parity.matched}/${dev.parity.total}`
        : deviceMessage(result.device);
      result.verdict = verdicts.device ? 'no-fault' : 'unfixed';
      return finish();
    }
    const { trials, verdict, message, ...rest } = found;
    const p = result.runtime?.parity;
    const runtimeToo = verdict === 'no-fault' && p ? `; the native runtime on this CPU follows HF too, with its own KV cache (parity ${p.matched}/${p.total})` : '';
    Object.assign(result, rest, { trials, verdict, message: `${message}${runtimeToo}`, fixes: rank(trials) });
    result.chosen = result.fixes[0];
    result.layer = found.op?.layer ?? undefined;
    if (req.apply && result.chosen) result.applied = applyOverrides(file, arch.id, result.chosen.overrides, result.chosen.rescale);
    return finish();
  }
  if (!miss) {
    result.message = runtimeHealthy(thresholds, result);
    return finish();
  }
  result.fault = miss;
  const where = `${miss.variant} ${miss.graph}${miss.layer !== null ? ` layer ${miss.layer}` : ''} ${miss.output} (${miss.what})`;
  const seen = miss.nonFinite ? `a non-finite value (${miss.nonFinite})` : miss.top1 ? `top-1 ${miss.top1}` : `cosine ${fmt(miss.cosine)} < ${miss.threshold}`;

  const exportDir = miss.link === 'export' ? base.dirs.export! : base.dirs.quantize!;
  // The outputs of the missed layer in the missed graph: the first step where any of them leaves tolerance.
  const variantRows = base.oracle.rows.filter((r) => r.variant === miss.variant && r.graph === miss.graph && (miss.layer === null ? r.output === miss.output : r.layer === String(miss.layer)));
  log(`first miss: ${where}, ${seen}; scanning its traced steps`);
  // A graph every layer shares (PhiMoE's experts) is scanned on the missed layer's cases, as the gate reported it.
  const exportGraphs = readJson<ExportManifest>(join(exportDir, GRAPHS_JSON)).contexts.flatMap((c) => c.graphs);
  const shared = (name: string) => exportGraphs.find((g) => g.name === name)?.first === undefined;
  const sharedGraph = miss.layer !== null && shared(miss.graph);
  const scan = (graph: string, outputs: string[]) => {
    const scratch = mkdtempSync(join(tmpdir(), 'forge-bisect-steps-'));
    return scanSteps(recipe.family, ckpt, base.dirs.trace!, exportDir, graph, outputs, miss.threshold, scratch, sharedGraph ? miss.layer! : undefined)
      .finally(() => rmSync(scratch, { recursive: true, force: true }));
  };
  result.steps = await scan(miss.graph, variantRows.map((r) => r.output));
  const at = result.steps.first ? `, first at prompt ${result.steps.first.prompt} step ${result.steps.first.step} (${result.steps.first.output} ${fmt(result.steps.first.cosine)}; ${result.steps.failing} of ${result.steps.cases.length} steps under)` : '';

  // One candidate rebuilt through the oracle gate (cached stages) and judged.
  const tryOne = async (c: Candidate): Promise<Trial> => {
    const t = performance.now();
    const r = await chain({ overrides: c.overrides, ...(c.equalize ? { equalize: c.equalize } : {}), verbose: req.verbose, quiet: true });
    const seconds = (performance.now() - t) / 1000;
    const trial: Trial = r.oracle ? judge(c, r.oracle, seconds) : { ...c, ok: false, error: r.record.error ?? 'the build stopped before the oracle gate', seconds };
    log(`  ${c.label}: ${trial.ok ? 'restores the gate' : `gate still fails${trial.stillFails ? ` (${trial.stillFails})` : trial.error ? ` (${trial.error})` : ''}`}; ${trial.minCosine !== undefined ? `shipped min cosine ${fmt(trial.minCosine)}, ` : ''}+${trial.addedBytes} bytes, ${seconds.toFixed(1)} s`);
    result.trials.push(trial);
    return trial;
  };

  if (miss.link === 'export') {
    result.verdict = 'export';
    result.message = `link export: the fp32 graphs already leave HF at ${where}, ${seen}${at}: the graph builder disagrees with HF; no precision change can fix that`;
    return finish();
  }
  if (miss.layer === null) {
    // Every layer's outputs hold and the logits do not: the lm-head's own matrices, each one rung up.
    const found = await searchLmHead({ family: recipe.family, checkpointDir: ckpt, lmHeadScheme: baseScheme(settings.lmHead.quant), overrides: settings.overrides, ...(precision ? { precision } : {}), why: `${miss.graph} ${miss.output} ${seen}`, log, tryOne });
    result.fixes = rank(result.trials);
    result.chosen = result.fixes[0];
    const link = `link quantization: the shipped graphs leave tolerance first at ${where}, ${seen}${at}, while every layer's outputs hold: the lm-head (${settings.lmHead.quant})`;
    result.verdict = result.chosen ? 'fixed' : 'unfixed';
    result.message = result.chosen
      ? `${link}; ${result.fixes.length} of ${result.trials.length} candidates restore the gate, the cheapest: ${result.chosen.label} (+${result.chosen.addedBytes} bytes)`
      : `${link}; ${found ? `no candidate restores the gate (tried ${result.trials.map((t) => t.label).join(', ')})` : 'its matrices are already at fp32: nothing to promote'}`;
    if (req.apply && result.chosen) result.applied = applyOverrides(file, arch.id, result.chosen.overrides);
    return finish();
  }

  if (sharedGraph) {
    // The experts of one layer: which one fails the cases that read it (every shared graph of the layer scanned: decode steps mix two, prefill runs one alone).
    const atLayer = base.oracle.rows.filter((r) => r.variant === miss.variant && r.graph !== miss.graph && r.layer === String(miss.layer) && shared(r.graph));
    const siblings = [...new Set(atLayer.map((r) => r.graph))];
    const cases = [...result.steps.cases];
    for (const g of siblings) cases.push(...(await scan(g, atLayer.filter((r) => r.graph === g).map((r) => r.output))).cases);
    const figures = blameExperts(cases, miss.threshold);
    result.experts = { layer: miss.layer!, graphs: [miss.graph, ...siblings], threshold: miss.threshold, figures };
    result.layer = miss.layer!;
    const bad = figures.filter((f) => f.failing);
    const named = bad.length ? `; ${expertText(bad[0], miss.threshold)}${figures[1] ? ` (next: ${expertText(figures[1], miss.threshold)})` : ''}` : '';
    log(`layer ${miss.layer}'s experts${named}`);
    // The fix the host tables honour: the named expert's channels rebalanced (the same function), then the two worst together.
    const tries = bad.length > 1 ? [bad.slice(0, 1), bad.slice(0, 2)] : bad.length ? [bad] : [];
    for (const picked of tries) {
      if ((await tryOne(expertEqualize(miss.layer!, picked.map((f) => f.expert), `${miss.graph} layer ${miss.layer} ${seen}`))).ok) break;
    }
    result.fixes = rank(result.trials);
    result.chosen = result.fixes[0];
    const link = `link quantization: the shipped ${settings.quant} graphs leave tolerance first at ${where}, ${seen}${at}, while fp32 holds (≥ ${thresholds.fp32}): layer ${miss.layer}'s experts${named}`;
    result.verdict = result.chosen ? 'fixed' : 'unfixed';
    result.message = result.chosen ? `${link}; fix: ${result.chosen.label} (no bytes added)`
      : `${link}; ${result.trials.length ? `no candidate restores the gate (tried ${result.trials.map((t) => t.label).join(', ')}); ` : ''}every expert's rows are stored at one precision (${settings.quant}) in the host tables, which take no per-expert precision yet`;
    if (req.apply && result.chosen) result.applied = applyOverrides(file, arch.id, [], [], result.chosen.equalize);
    return finish();
  }

  // Which layer does the damage: each one alone at the shipped precision, the worst first.
  const { family, config, configFile } = familyConfig(recipe.family, ckpt);
  const scheme = baseScheme(settings.quant);
  log(`weighing every layer alone at ${settings.quant}`);
  const work = mkdtempSync(join(tmpdir(), 'forge-bisect-alone-'));
  try {
    result.alone = await layersAlone({ family: recipe.family, scheme, lmHeadScheme: baseScheme(settings.lmHead.quant), maxContext: settings.maxContext, overrides: settings.overrides, ...(precision ? { precision } : {}), minTop1: o.minTop1 }, ckpt, base.dirs.trace!, work);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  const badness = (f: AloneFigure) => (f.nonFinite ? -2 : f.cosine);
  const suspects = result.alone.filter((f) => f.layer <= miss.layer!).sort((a, b) => badness(a) - badness(b) || a.layer - b.layer).slice(0, req.maxLayers ?? 2);
  // The layers the search gets to, in that order (it stops at the first whose fixes restore the gate).
  const why = (f: AloneFigure, i: number) => `${i === 0 ? 'the lowest' : `number ${i + 1} by`} cosine alone among layers 0..${miss.layer} at ${settings.quant}: ${f.nonFinite ? `non-finite (${f.nonFinite})` : fmt(f.cosine)}`;
  result.suspects = [];

  const tensors = (await modelTensors(family, config)).layers;
  // Every layer that fails alone, wherever it is: a gate left by two cannot pass while either stays.
  result.faulty = result.alone.filter((f) => f.nonFinite || f.cosine < thresholds.shipped).sort((a, b) => badness(a) - badness(b) || a.layer - b.layer).map((f) => f.layer);
  const without = `${miss.graph} ${miss.output} ${seen}`;
  const manifest = readJson<ExportManifest>(join(base.dirs.quantize!, GRAPHS_JSON));
  const probeOps = async (layer: number) => {
    const opWork = mkdtempSync(join(tmpdir(), 'forge-bisect-ops-'));
    try {
      return await probeQuantOps({
        family: recipe.family, layer, scheme, lmHeadScheme: baseScheme(settings.lmHead.quant), overrides: settings.overrides, ...(precision ? { precision } : {}),
        w8Form: manifest.w8Form, maxContext: settings.maxContext, threshold: thresholds.shipped,
      }, ckpt, base.dirs.trace!, opWork);
    } finally {
      rmSync(opWork, { recursive: true, force: true });
    }
  };
  const damaged = [...result.faulty].sort((a, b) => a - b);
  if (damaged.length > 1) {
    // Several layers each fail alone: no fix of one of them can pass. Each one's worst matrix (its op
    // probe) together, then each whole one rung up together, then two.
    log(`layers ${damaged.join(', ')} each fail alone: fixing them together`);
    const picks: Array<{ layer: number; tensor: TensorSpec }> = [];
    for (const l of damaged) {
      const drop = (await probeOps(l).catch((e: Error) => void log(`op probe of layer ${l} failed (its whole layer is tried instead): ${e.message}`)))?.drop;
      const t = drop?.matrix ? tensors[l].find((x) => x.name === drop.matrix) : undefined;
      if (t) picks.push({ layer: l, tensor: t });
    }
    const worst = picks.length === damaged.length ? matricesTogether(picks, scheme, settings.overrides, precision, without) : undefined;
    const tries = [worst, ...[1, 2].map((rungs) => together(damaged.map((l) => ({ layer: l, tensors: tensors[l] })), scheme, settings.overrides, precision, without, rungs))];
    for (const c of tries) if (c && (await tryOne(c)).ok) break;
  } else {
    for (const [i, s] of suspects.entries()) {
      result.suspects.push({ layer: s.layer, why: why(s, i) });
      const { single, whole } = candidates(s.layer, tensors[s.layer], scheme, settings.overrides, precision, without);
      if (!single.length) {
        log(`layer ${s.layer}: every matrix already at fp32: nothing to promote`);
        continue;
      }
      log(`layer ${s.layer} (alone ${fmt(s.cosine)}): each matrix one precision up`);
      let restored = false;
      for (const c of single) restored = (await tryOne(c)).ok || restored;
      if (!restored && whole) restored = (await tryOne(whole)).ok;
      if (restored) break;
    }
  }
  result.fixes = rank(result.trials);
  result.chosen = result.fixes[0];
  result.layer = result.chosen?.layer ?? suspects[0]?.layer ?? result.faulty[0];
  const alone = result.alone.find((a) => a.layer === result.layer);
  if (result.layer !== undefined) {
    // Which op of that layer loses the numbers: the layer alone at fp32 and shipped, op by op.
    log(`probing layer ${result.layer} op by op (fp32 vs ${settings.quant})`);
    try {
      result.quantOp = await probeOps(result.layer);
      if (result.quantOp.drop) log(`op: ${opText(result.quantOp.drop)} (${result.quantOp.ops.length} ops, ${result.quantOp.cases} cases, ${result.quantOp.seconds.toFixed(1)} s)`);
    } catch (e) {
      // The op is a finer picture of a layer already named: its failure is said, not fatal to the fix found.
      result.quantOpError = (e as Error).message;
      log(`op probe of layer ${result.layer} failed: ${result.quantOpError}`);
    }
  }
  const opPart = result.quantOp?.drop ? `, op ${opText(result.quantOp.drop)}` : '';
  const joint = result.chosen && result.chosen.layer === undefined && damaged.length > 1;
  const damage = joint ? `; layers ${damaged.join(', ')} together are where a fix restores it${opPart ? ` (layer ${result.layer}'s${opPart.slice(1)})` : ''}`
    : result.layer === undefined || !alone ? '' : `; layer ${result.layer} (alone at ${settings.quant} ${fmt(alone.cosine)}) is where ${result.chosen ? 'a fix restores it' : 'the search looked'}${result.layer < miss.layer ? `, its error carried by the later layers to layer ${miss.layer}` : ''}${opPart}`;
  const others = result.faulty.filter((l) => l !== result.layer);
  const faultyText = others.length ? `; ${result.faulty.length > 1 ? `layers ${result.faulty.join(', ')} each fail` : `layer ${result.faulty[0]} fails`} alone (${result.faulty.map((l) => `${l}: ${fmt(result.alone!.find((a) => a.layer === l)!.cosine)}`).join(', ')} < ${thresholds.shipped})` : '';
  const link = `link quantization: the shipped ${settings.quant} graphs leave tolerance first at ${where}, ${seen}${at}, while fp32 holds (≥ ${thresholds.fp32})${damage}${faultyText}`;
  if (!result.chosen) {
    result.verdict = 'unfixed';
    result.message = `${link}; no candidate restores the gate (tried ${result.trials.length}: ${result.trials.map((t) => t.label).join(', ')})`;
    return finish();
  }
  result.verdict = 'fixed';
  result.message = `${link}; ${result.fixes.length} of ${result.trials.length} candidates restore the gate, the cheapest: ${result.chosen.label} (+${result.chosen.addedBytes} bytes)`;
  if (req.apply) result.applied = applyOverrides(file, arch.id, result.chosen.overrides);
  return finish();
}

