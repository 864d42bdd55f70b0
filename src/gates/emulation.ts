// Stage `emulation`: the closest thing to a device we have. The deployable graphs are compiled for
// the arch into QNN HTP context binaries (one non-shared context per graph: the x86 HTP simulator
// in onnxruntime-qnn's libQnnHtp.so cannot load weight-shared ones, it dies with SIGSEGV), and those
// binaries are run on the simulator twice:
//  1. teacher-forced: every graph, at every traced step, is fed the same inputs as the CPU oracle
//     gate (the family's gateCases) through oracles/qnn_simulate.py, and each output is compared
//     with HF by cosine (logits also by top-1);
//  2. parity: a bundle whose graphs carry `qnn.wrapper`s is run by qhx_generate with the QNN backend
//     greedy over the traced prompts, teacher-forced on HF's tokens; its choices must equal HF's, a
//     mismatch counting as a tie (bounded by the recipe) only within twice the largest logit error the
//     simulator showed in step 1 (src/gates/parity.ts).
// A step that cannot run fails the stage with its exact error. Only a host that has no simulator at
// all (not x86_64 Linux, or a wheel without libQnnHtp.so) gives {ok: false, ran: false, reason}.
import { fileURLToPath } from 'node:url';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { linkOrCopy } from '../io/files.js';
import { writeFile } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import type { FamilyId } from '../recipe/schema.js';
import type { HexagonArch } from '../arch/table.js';
import { getFamily } from '../families/index.js';
import { gateCasesOf } from '../families/types.js';
import type { Family } from '../families/types.js';
import type { GateCase } from '../families/types.js';
import { GRAPHS_JSON, type ExportManifest, type GraphEntry } from '../export/graphs.js';
import { assembleBundle, MANIFEST } from '../bundle/assemble.js';
import { ManifestSchema, type Manifest } from '../bundle/manifest.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { writeSafetensors, type TensorSpec } from '../io/safetensors-writer.js';
import { openSafetensors } from '../io/safetensors.js';
import { toFloat32 } from '../io/dtype.js';
import { toFloat16 } from '../onnx/dtype.js';
import { sha256OfFile } from '../engine/hash.js';
import { compileContext, runWithTimeout, type CompileReport } from '../toolchain/qnn/compile.js';
import { ensureVenv, toolchainPython } from '../toolchain/venv.js';
import type { CompileToolchain } from '../toolchain/qnn/compile-stage.js';
import { EXIT_NON_FINITE_LOGITS, parseQhxJson, qhxArgs, qhxFailure, type Target } from '../targets/target.js';
import { checkParity, parityRule, variantOk, type VariantResult } from './parity.js';
import type { NativeRecord } from './native-stage.js';
import type { OracleResult } from './oracle.js';
import { Trace } from './trace.js';
import { LM_HEAD_KIND } from '../families/decoder.js';
import { top1Text } from './top1.js';
import { GateTally, type OutputTally } from './compare.js';

/** fp16 activations on the HTP: the teacher-forced cosine a W8 graph must keep on the simulator. */
export const DEFAULT_MIN_COSINE = 0.999;
const DEFAULT_TIMEOUT_S = 600;
/** Feeds written for one simulator process at most (the KV caches dominate); more cases, more batches. */
const BATCH_BYTES = 256 << 20;

/** The arch the contexts are built for (soc_model is also what the simulator emulates). */
export type HtpArch = Pick<HexagonArch, 'id' | 'socModel' | 'dspArch' | 'vtcmMb'>;

export interface EmulationParams {
  recipe: { id: string; family: FamilyId };
  arch: HtpArch;
  /** enable_htp_fp16_precision (float graphs run in fp16 on the HTP). */
  fp16: boolean;
  /** Per-graph minimum teacher-forced cosine vs HF on the simulator (default DEFAULT_MIN_COSINE). */
  minCosine?: number;
  /** Fraction of traced steps whose simulated logits' argmax must match HF's. */
  minTop1: number;
  /** Tokens generated per prompt by the parity run. */
  tokens: number;
  /** A pinned compile toolchain (compile-stage.ts) whose onnxruntime-qnn compiles and simulates; absent: the main venv's. */
  toolchain?: CompileToolchain;
  /** Fraction of steps (teacher-forced) whose token equals HF's or is a tie; 1 means N/N. */
  minMatch: number;
  /** Ties allowed in the simulator's parity (src/gates/parity.ts); above 0 only with the recipe's reason. */
  maxTies: number;
  tiesWhy?: string;
  /** Limit for each compile, simulator process and qhx_generate call (default 600 s). */
  timeoutSeconds?: number;
}

/** Where the simulator is: what `oracles/qnn_simulate.py info` says. */
export interface SimulatorInfo {
  libDir: string;
  /** libQnnHtp.so: the HTP backend, on x86_64 Linux the simulator. */
  htp: string;
  system: string;
  /** libonnxruntime_providers_qnn.so (the QNN EP plugin) for qhx_generate's FORGE_QNN_EP_LIB. */
  epLib: string;
  machine: string;
  os: string;
  onnxruntime: string;
  onnxruntimeQnn: string;
  qairt: string | null;
  /** What this host lacks to run the simulator; empty when it can. */
  missing: string[];
}

export interface CompiledGraph {
  graph: string;
  /** Absolute paths (inside the scratch directory). */
  wrapper: string;
  bin: string;
  bytes: number;
  qnnGraph: string;
}

export type SimulatedOutput = OutputTally;

export interface SimulatedGraph {
  minCosine: number;
  ok: boolean;
  /** Logits rows whose argmax equals HF's, "agree/rows" (graphs with logits only). */
  top1?: string;
  cases: number;
  /** Mean simulator time per call (session Run only) and the context's load time. */
  msPerCall: number;
  loadMs: number;
  outputs: Record<string, SimulatedOutput>;
  /** The first non-finite value met on either side (the graph fails): case, output, count and index. */
  nonFinite?: string;
  /** Outputs the family's gate cases give no expected values for (not compared, as in the oracle gate). */
  uncompared?: string[];
}

export interface EmulationRan {
  ok: boolean;
  ran: true;
  simulator: { libDir: string; onnxruntime: string; onnxruntimeQnn: string; qairt: string | null; socModel: number; dspArch: string; fp16: boolean };
  thresholds: { minCosine: number; minTop1: number; minMatch: number; maxTies: number; tokens: number };
  compiled: CompiledGraph[];
  oracle: { ok: boolean; graphs: Record<string, SimulatedGraph> };
  /** Teacher-forced on HF's tokens; ties measured against the larger of the simulator's own lm-head logit error and the oracle's chained one (logitError). */
  parity: VariantResult & { ok: boolean; rule: string };
  /** qhx_generate's decode time per token on the simulator (mean over prompts). */
  msPerToken: number;
  seconds: { compile: number; oracle: number; parity: number };
}

export interface EmulationNotRun {
  ok: false;
  ran: false;
  reason: string;
}

export type EmulationResult = EmulationRan | EmulationNotRun;

/** The stage's params plus where things are. */
export interface EmulationInput extends EmulationParams {
  /** The fetched checkpoint (config.json, tokenizer files). */
  checkpointDir: string;
  traceDir: string;
  /** The deployable export: graphs.json, the graphs, and the host embedding table. */
  graphsDir: string;
  /** The qhx_generate executable. */
  qhxGenerate: string;
  /** Scratch directory (contexts, feeds, the bundle); removed when done. */
  work: string;
  /** Python with onnxruntime-qnn (default: forge's venv, created if missing). */
  python?: string;
  /** The simulator runner (default oracles/qnn_simulate.py); tests substitute their own. */
  script?: string;
  /**
   * The oracle gate's chained logit error of these graphs on the CPU (each one-token graph fed the
   * previous one's output), the host parity gate's tie rule: the simulator's ties are judged against
   * the larger of it and the simulator's own lm-head error, so one near-tie is a tie on both.
   */
  chainedLogitError?: number | null;
  log?: (message: string) => void;
  progress?: (done: number, total: number, label?: string) => void;
}

export function qnnSimulateScript(): string {
  return fileURLToPath(new URL('../../oracles/qnn_simulate.py', import.meta.url));
}

/** The last meaningful stderr lines of a helper (its own "qnn_simulate:" line when there is one). */
function helperTail(stderr: string, n = 3): string {
  const lines = stderr.split('\n').map((l) => l.trim()).filter((l) => l && !l.includes('LIBNATIVE'));
  const own = [...lines].reverse().find((l) => l.startsWith('qnn_simulate:'));
  if (own) return own.slice('qnn_simulate:'.length).trim();
  return lines.slice(-n).join(' | ') || '(no output on stderr)';
}

function lastJson(stdout: string): string | undefined {
  return stdout.trim().split('\n').reverse().find((l) => l.startsWith('{'));
}

/** Asks the Python side where the simulator is; `missing` says what this host lacks. */
export async function simulatorInfo(python: string, script = qnnSimulateScript(), timeoutSeconds = 120): Promise<SimulatorInfo> {
  const r = await runWithTimeout(python, [script, 'info'], timeoutSeconds);
  if (r.spawnError) throw new Error(`cannot run ${python}: ${r.spawnError}`);
  if (r.timedOut) throw new Error(`${basename(script)} info timed out after ${timeoutSeconds} s`);
  const line = lastJson(r.stdout);
  if (r.exitCode !== 0 || !line) throw new Error(`${basename(script)} info failed (${r.signal ?? `exit ${r.exitCode}`}): ${helperTail(r.stderr)}`);
  return JSON.parse(line) as SimulatorInfo;
}

/** The reason this host cannot run the simulator at all, or null when it may. */
export function hostWithoutSimulator(info: SimulatorInfo | null): string | null {
  if (process.platform !== 'linux' || process.arch !== 'x64') {
    return `the x86 HTP simulator (onnxruntime-qnn's libQnnHtp.so) runs on x86_64 Linux only; this host is ${process.platform}-${process.arch}`;
  }
  if (info && info.missing.length) return `this host cannot run the x86 HTP simulator: it lacks ${info.missing.join('; ')}`;
  return null;
}

/** Every graph of the export, each compiled into a context of its own (what the simulator loads). */
export async function compileForSimulator(graphsDir: string, exp: ExportManifest, arch: HtpArch, fp16: boolean, outDir: string, timeoutSeconds: number, python?: string): Promise<{ graphs: Map<string, CompiledGraph>; report: CompileReport }> {
  const entries = exp.contexts.flatMap((c) => c.graphs);
  const report = await compileContext({
    graphs: entries.map((g) => join(graphsDir, g.file)), outDir, contextName: 'emulation',
    arch: { socModel: arch.socModel, dspArch: arch.dspArch, vtcmMb: arch.vtcmMb }, fp16, timeoutSeconds, separate: true, python,
  });
  const graphs = new Map<string, CompiledGraph>();
  for (const g of entries) {
    const src = resolve(graphsDir, g.file);
    const w = report.wrappers.find((x) => resolve(x.graph) === src);
    if (!w) throw new Error(`the compile report has no wrapper for ${g.file}`);
    const bin = report.bins.find((b) => basename(b.path) === w.bin);
    if (!bin) throw new Error(`the compile report has no binary ${w.bin} for ${g.file}`);
    graphs.set(g.name, { graph: g.name, wrapper: w.path, bin: bin.path, bytes: bin.bytes, qnnGraph: w.qnnGraph });
  }
  return { graphs, report };
}

/** Feeds of one batch of cases into a safetensors file: `<case>/<input>`, `__metadata__.cases`. */
export async function writeFeeds(path: string, cases: GateCase[]): Promise<void> {
  const specs: Array<TensorSpec & { data: ArrayBufferView }> = [];
  const DTYPE = { float32: 'F32', int32: 'I32', int8: 'I8', float16: 'F16' } as const;
  cases.forEach((c, i) => {
    for (const [name, f] of Object.entries(c.feeds)) specs.push({ name: `${i}/${name}`, dtype: DTYPE[f.dtype], shape: f.dims, data: f.data });
  });
  await writeSafetensors(path, specs, { cases: String(cases.length) });
}

export interface SimRun { cases: number; loadSeconds: number; runSeconds: number[]; outputs: string[]; providers: string[] }

/** One simulator process over one batch of cases; its crash or error becomes an Error saying exactly that. */
export async function simulateBatch(python: string, script: string, wrapper: string, arch: HtpArch, fp16: boolean, feeds: string, out: string, timeoutSeconds: number, what: string): Promise<SimRun> {
  const r = await runWithTimeout(python, [script, 'run', '--wrapper', wrapper, '--soc-model', String(arch.socModel), fp16 ? '--fp16' : '--no-fp16', '--feeds', feeds, '--out', out], timeoutSeconds);
  if (r.spawnError) throw new Error(`${what}: cannot run ${python}: ${r.spawnError}`);
  if (r.timedOut) throw new Error(`${what}: the simulator process ran past ${timeoutSeconds} s and was killed (last: ${helperTail(r.stderr, 1)})`);
  const line = lastJson(r.stdout);
  if (r.signal) throw new Error(`${what}: the simulator process died (${r.signal}); last lines: ${helperTail(r.stderr)}`);
  if (r.exitCode !== 0 || !line) throw new Error(`${what}: ${r.exitCode !== 0 ? `exit ${r.exitCode}: ` : 'no report: '}${helperTail(r.stderr)}`);
  return JSON.parse(line) as SimRun;
}

/**
 * Teacher-forced on the simulator: every case the family's gateCases gives for the graph, run on its
 * compiled context; each output compared with HF (padding rows, as the case's masks say, are not), a
 * non-finite value on either side failing the graph.
 */
export async function simulateGraph<C>(o: {
  family: Family<C>; config: C; entry: GraphEntry; compiled: CompiledGraph; trace: Trace; maxContext: number;
  /** The export the graph is from (its made tables feed the cases). */
  graphsDir: string;
  arch: HtpArch; fp16: boolean; minCosine: number; minTop1: number; python: string; script: string; work: string; timeoutSeconds: number;
  /** Only the calls after each prompt (a decode graph of a bundle that prefills: the prompt is the prefill graph's, unless it is one token). */
  generatedOnly?: boolean;
}): Promise<SimulatedGraph> {
  const outputNames = new Set(o.entry.outputs.map((t) => t.name));
  const tally = new GateTally(o.trace.meta.vocab);
  let cases = 0;
  let runSeconds = 0;
  let loadSeconds = 0;
  let batch: GateCase[] = [];
  let bytes = 0;
  let batchNo = 0;
  mkdirSync(o.work, { recursive: true });

  const flush = async () => {
    if (!batch.length) return;
    const feeds = join(o.work, `${o.entry.name}.${batchNo}.feeds.safetensors`);
    const out = join(o.work, `${o.entry.name}.${batchNo}.out.safetensors`);
    const what = `simulating ${o.entry.name} (${basename(o.compiled.wrapper)}, cases ${cases}..${cases + batch.length - 1})`;
    await writeFeeds(feeds, batch);
    const run = await simulateBatch(o.python, o.script, o.compiled.wrapper, o.arch, o.fp16, feeds, out, o.timeoutSeconds, what);
    if (run.cases !== batch.length) throw new Error(`${what}: ran ${run.cases} cases, ${batch.length} were written`);
    loadSeconds += run.loadSeconds;
    runSeconds += run.runSeconds.reduce((a, b) => a + b, 0);
    const file = await openSafetensors(out);
    try {
      for (let i = 0; i < batch.length; i++) {
        const c = batch[i];
        for (const [name, expected] of Object.entries(c.expected)) {
          if (!outputNames.has(name)) continue; // a probe of an internal value: the compiled graph has no such output
          const info = file.tensors.get(`${i}/${name}`);
          if (!info) throw new Error(`${what}: no output ${name} for case ${i}`);
          const actual = toFloat32(info.dtype, await file.read(info.name));
          tally.add(name, actual, expected, `${o.entry.name} prompt ${c.prompt} step ${c.step}`, c.masks?.[name], !c.placeholder);
        }
      }
    } finally {
      await file.close();
    }
    rmSync(feeds, { force: true });
    rmSync(out, { force: true });
    cases += batch.length;
    batch = [];
    bytes = 0;
    batchNo++;
  };

  // A residual the graph takes as f16 (the handoff stage's rewrite) is fed as the host hands it over.
  const half = new Set(o.entry.inputs.filter((t) => t.dtype === 'float16').map((t) => t.name));
  for await (const c of gateCasesOf(o.family, o.config, o.entry, o.trace, o.maxContext, o.graphsDir)) {
    // The runtime decodes a one-token prompt (native greedy_loop): that step is the decode graph's too.
    const promptLength = o.trace.meta.prompts[c.prompt].prompt_tokens.length;
    if (o.generatedOnly && c.step < promptLength && promptLength > 1) continue;
    // gateCases may reuse its buffers (the KV cache grows in place from case to case): keep copies.
    const feeds: GateCase['feeds'] = {};
    for (const [name, f] of Object.entries(c.feeds)) {
      feeds[name] = half.has(name) && f.dtype === 'float32' ? { dtype: 'float16', dims: f.dims, data: toFloat16(f.data as Float32Array) } : { ...f, data: f.data.slice() };
      bytes += f.data.byteLength;
    }
    batch.push({ ...c, feeds });
    if (bytes >= BATCH_BYTES) await flush();
  }
  await flush();
  if (cases === 0) throw new Error(`no traced step reaches ${o.entry.name}: the trace is empty`);

  const { outputs: acc, top1: tops } = tally;
  const outputs: Record<string, SimulatedOutput> = {};
  let minCosine = Infinity;
  for (const name of [...acc.keys()].sort()) {
    outputs[name] = acc.get(name)!;
    minCosine = Math.min(minCosine, acc.get(name)!.minCosine);
  }
  if (!acc.size) throw new Error(`simulating ${o.entry.name}: the oracle gives expected values for none of its outputs`);
  const nonFinite = [...acc.values()].find((t) => t.nonFinite)?.nonFinite;
  const g: SimulatedGraph = { minCosine, ok: minCosine >= o.minCosine && !nonFinite, ...(nonFinite ? { nonFinite } : {}), cases, msPerCall: (runSeconds * 1000) / cases, loadMs: (loadSeconds * 1000) / batchNo, outputs };
  const uncompared = [...outputNames].filter((n) => !acc.has(n));
  if (uncompared.length) g.uncompared = uncompared; // as in the CPU oracle gate: only what the trace defines is compared
  if (tops.rows) {
    g.top1 = top1Text(tops);
    if (tops.agree < o.minTop1 * tops.rows) g.ok = false;
  }
  return g;
}

/**
 * Gives every graph of an assembled bundle its compiled context: wrapper and binary go to `qnn/`
 * (side by side: the wrapper names the binary relative to itself) and the manifest gets
 * `qnn: {wrapper, sha256, binary}` per graph. assembleBundle has no option for this yet.
 */
export async function attachQnnContexts(bundleDir: string, compiled: Map<string, CompiledGraph>): Promise<Manifest> {
  const path = join(bundleDir, MANIFEST);
  const manifest = JSON.parse(readFileSync(path, 'utf8')) as Manifest;
  mkdirSync(join(bundleDir, 'qnn'), { recursive: true });
  for (const c of manifest.contexts) {
    for (const g of c.graphs) {
      const q = compiled.get(g.name);
      if (!q) throw new Error(`graph ${g.name} of ${path} has no compiled context`);
      const wrapper = `qnn/${basename(q.wrapper)}`;
      const binary = `qnn/${basename(q.bin)}`;
      linkOrCopy(q.wrapper, join(bundleDir, wrapper));
      linkOrCopy(q.bin, join(bundleDir, binary));
      g.qnn = { wrapper, sha256: await sha256OfFile(join(bundleDir, wrapper)), binary };
    }
  }
  ManifestSchema.parse(manifest);
  writeFileSync(path, JSON.stringify(manifest, null, 2) + '\n');
  return manifest;
}

/** qhx_generate on this machine with the QNN backend: the compiled contexts run on the x86 HTP simulator. */
export function simulatorTarget(qhxGenerate: string, sim: Pick<SimulatorInfo, 'htp' | 'system' | 'epLib'>, timeoutSeconds = DEFAULT_TIMEOUT_S): Target {
  const where = 'qhx_generate on the x86 HTP simulator';
  return {
    name: 'x86-htp-simulator',
    async generate(req) {
      const args = qhxArgs(join(req.bundleDir, MANIFEST), sim.htp, sim.system, req.bundleDir, req);
      const r = await runWithTimeout(qhxGenerate, args, timeoutSeconds, { FORGE_QNN_EP_LIB: sim.epLib, FORGE_ORT_THREADS: process.env.FORGE_ORT_THREADS ?? '1' });
      if (r.spawnError) throw new Error(`${where}: cannot run ${qhxGenerate}: ${r.spawnError}`);
      if (r.timedOut) throw new Error(`${where} ran past ${timeoutSeconds} s and was killed`);
      if (r.exitCode === EXIT_NON_FINITE_LOGITS && !r.signal) throw qhxFailure(where, r.exitCode, r.stderr);
      if (r.exitCode !== 0) throw new Error(`${where} failed (${r.signal ?? `exit ${r.exitCode}`}): ${helperTail(r.stderr, 2)}`);
      const res = parseQhxJson(r.stdout, where);
      if (res.backend !== 'qnn') throw new Error(`${where} ran on backend '${res.backend}', not qnn`);
      return res;
    },
  };
}

/** The simulator's largest |logit − HF logit| over every graph's teacher-forced `logits` (null when none, or non-finite). */
export function simulatedLogitError(graphs: Record<string, SimulatedGraph>): number | null {
  let worst: number | null = null;
  for (const g of Object.values(graphs)) {
    const t = g.outputs.logits;
    if (!t) continue;
    if (!Number.isFinite(t.maxAbs)) return null;
    worst = Math.max(worst ?? 0, t.maxAbs);
  }
  return worst;
}

/** The whole gate: compile, teacher-forced on the simulator, parity on the simulator. `work` is removed after. */
export async function runEmulation(i: EmulationInput): Promise<EmulationResult> {
  const log = i.log ?? (() => {});
  const progress = i.progress ?? (() => {});
  const timeoutSeconds = i.timeoutSeconds ?? DEFAULT_TIMEOUT_S;
  const minCosine = i.minCosine ?? DEFAULT_MIN_COSINE;
  const script = i.script ?? qnnSimulateScript();
  const early = hostWithoutSimulator(null);
  if (early) return { ok: false, ran: false, reason: early };
  const python = i.python ?? (await ensureVenv(log));
  const sim = await simulatorInfo(python, script);
  const missing = hostWithoutSimulator(sim);
  if (missing) return { ok: false, ran: false, reason: missing };

  const family = getFamily(i.recipe.family) as Family<unknown>;
  const config = family.parseConfig(JSON.parse(readFileSync(join(i.checkpointDir, 'config.json'), 'utf8')), 'config.json');
  const exp = JSON.parse(readFileSync(join(i.graphsDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  const entries = exp.contexts.flatMap((c) => c.graphs);
  const steps = entries.length + 1;
  const trace = await Trace.open(i.traceDir);
  rmSync(i.work, { recursive: true, force: true });
  mkdirSync(i.work, { recursive: true });
  try {
    // 1. compile
    progress(0, steps, 'compile');
    let t = Date.now();
    log(`compiling ${entries.length} graphs for soc_model ${i.arch.socModel} (${i.arch.dspArch}), one context each`);
    const { graphs: compiled, report } = await compileForSimulator(i.graphsDir, exp, i.arch, i.fp16, join(i.work, 'contexts'), timeoutSeconds, python);
    const compileSeconds = (Date.now() - t) / 1000;

    // 2. teacher-forced on the simulator
    t = Date.now();
    const graphs: Record<string, SimulatedGraph> = {};
    // A bundle whose every layer context has a prefill graph prefills the prompt with it: its decode
    // graphs are checked on the calls they make, the generated tokens (the CPU oracle gate checks
    // them over the prompt too, as the runtime runs them with --no-prefill).
    const layerContexts = exp.contexts.filter((c) => c.graphs.some((g) => g.n === 1 && g.kind !== LM_HEAD_KIND));
    const prefills = layerContexts.length > 0 && layerContexts.every((c) => c.graphs.some((g) => g.n > 1));
    let done = 0;
    for (const entry of entries) {
      progress(done++, steps, entry.name);
      const g = await simulateGraph({
        family, config, entry, compiled: compiled.get(entry.name)!, trace, maxContext: exp.maxContext, graphsDir: i.graphsDir, arch: i.arch, fp16: i.fp16,
        minCosine, minTop1: i.minTop1, python, script, work: join(i.work, 'cases'), timeoutSeconds,
        generatedOnly: prefills && entry.n === 1 && entry.kind !== LM_HEAD_KIND,
      });
      graphs[entry.name] = g;
      log(`${entry.name}: min cosine ${g.minCosine.toFixed(6)} over ${g.cases} calls${g.top1 ? `, top-1 ${g.top1}` : ''}, ${g.msPerCall.toFixed(1)} ms/call on the simulator${g.nonFinite ? `; NON-FINITE: ${g.nonFinite}` : ''}`);
    }
    const oracleSeconds = (Date.now() - t) / 1000;

    // 3. parity on the simulator
    progress(done, steps, 'parity');
    t = Date.now();
    const bundle = join(i.work, 'bundle');
    await assembleBundle({ recipe: i.recipe, arch: i.arch, graphsDir: i.graphsDir, embeddingDir: i.graphsDir, checkpointDir: i.checkpointDir, maxNewTokens: i.tokens }, bundle);
    await attachQnnContexts(bundle, compiled);
    const own = simulatedLogitError(graphs);
    const error = own === null ? null : Math.max(own, i.chainedLogitError ?? 0);
    const parity = await checkParity(simulatorTarget(i.qhxGenerate, sim, timeoutSeconds), bundle, trace, i.tokens, error);
    const parityOk = variantOk(parity, i.minMatch, i.maxTies);
    const paritySeconds = (Date.now() - t) / 1000;
    log(`parity on the simulator: ${parity.matched}/${parity.total} before the first mismatch, ${parity.mismatchCount} mismatches teacher-forced, ${parity.ties} ties (tie margin ${parity.tieMargin ?? 'none'}), ${parity.timings.decode_ms_per_token.toFixed(1)} ms/token${parity.nonFinite ? `; NON-FINITE: ${parity.nonFinite}` : ''}`);
    progress(steps, steps);

    const oracleOk = Object.values(graphs).every((g) => g.ok);
    return {
      ok: oracleOk && parityOk,
      ran: true,
      simulator: { libDir: sim.libDir, onnxruntime: sim.onnxruntime, onnxruntimeQnn: sim.onnxruntimeQnn, qairt: report.qairtVersion ?? sim.qairt, socModel: i.arch.socModel, dspArch: i.arch.dspArch, fp16: i.fp16 },
      thresholds: { minCosine, minTop1: i.minTop1, minMatch: i.minMatch, maxTies: i.maxTies, tokens: i.tokens },
      compiled: [...compiled.values()].map((c) => ({ ...c, wrapper: basename(c.wrapper), bin: basename(c.bin) })),
      oracle: { ok: oracleOk, graphs },
      parity: { ...parity, ok: parityOk, rule: parityRule(i.minMatch, i.maxTies) },
      msPerToken: parity.timings.decode_ms_per_token,
      seconds: { compile: compileSeconds, oracle: oracleSeconds, parity: paritySeconds },
    };
  } finally {
    await trace.close();
    rmSync(i.work, { recursive: true, force: true });
  }
}

/** The small record the run keeps. */
export function emulationSummary(r: EmulationResult) {
  if (!r.ran) return { ok: false, ran: false, reason: r.reason };
  return {
    ok: r.ok, ran: true,
    simulator: `x86 HTP simulator, soc_model ${r.simulator.socModel} (${r.simulator.dspArch}), QAIRT ${r.simulator.qairt}, fp16 ${r.simulator.fp16}`,
    graphs: Object.fromEntries(Object.entries(r.oracle.graphs).map(([k, g]) => [k, { minCosine: g.minCosine, ok: g.ok, ...(g.top1 ? { top1: g.top1 } : {}), msPerCall: g.msPerCall }])),
    parity: {
      matched: r.parity.matched, total: r.parity.total, ok: r.parity.ok, ties: r.parity.ties, maxTies: r.thresholds.maxTies,
      mismatches: { count: r.parity.mismatchCount, listed: r.parity.mismatches }, logitError: r.parity.logitError, tieMargin: r.parity.tieMargin,
      firstDivergence: r.parity.firstDivergence, rule: r.parity.rule,
    },
    msPerToken: r.msPerToken,
    prefillMs: r.parity.timings.prefill_ms,
    thresholds: r.thresholds,
  };
}

export const stage: StageModule<EmulationParams> = {
  name: 'emulation',
  version: '3',
  async run(ctx) {
    const p = ctx.params;
    const native = JSON.parse(readFileSync(join(ctx.inputs.native, 'native.json'), 'utf8')) as NativeRecord;
    const oracle = JSON.parse(readFileSync(join(ctx.inputs.oracle, 'oracle.json'), 'utf8')) as Pick<OracleResult, 'logitError'>;
    const result = await runEmulation({
      ...p,
      chainedLogitError: oracle.logitError.quantize ?? null,
      checkpointDir: readCheckpointRef(ctx.inputs.checkpoint).absDir,
      traceDir: ctx.inputs.trace,
      graphsDir: ctx.inputs.quantize,
      qhxGenerate: native.qhxGenerate,
      ...(p.toolchain ? { python: toolchainPython(p.toolchain) } : {}),
      work: join(ctx.out, '.scratch'),
      log: ctx.log,
      progress: ctx.progress,
    });
    // What it compiled is in emulation.json (`compiled`): a compile.json here would land in the
    // build report folder beside, and be taken for, the shipped compile.
    if (!result.ran) ctx.log(`not run: ${result.reason}`);
    await writeFile(join(ctx.out, 'emulation.json'), JSON.stringify(result, null, 2));
    return { gate: { name: 'emulation', ok: result.ok }, summary: JSON.parse(JSON.stringify(emulationSummary(result))) };
  },
};
