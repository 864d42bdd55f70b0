// The build pipeline for one recipe × one arch, as data: which stage modules run, with which
// params, reading which outputs. Each stage gets only the recipe fields it uses, so changing a
// field re-runs just the stages downstream of it.
import { join } from 'node:path';
import type { Pipeline, StageNode } from '../src/engine/stage.js';
import type { HexagonArch } from '../src/arch/table.js';
import { baseScheme, choosesPrecision, shippedMinCosine, type ArchSettings, type Recipe } from '../src/recipe/schema.js';
import type { AutoParams } from '../src/quant/auto.js';
import type { FetchParams } from '../src/hub/fetch-stage.js';
import type { LocalDigest } from '../src/hub/local-digest.js';
import type { PlanParams } from '../src/plan/stage.js';
import type { ExportParams } from '../src/export/stage.js';
import type { TraceInput, TraceParams } from '../src/gates/trace-stage.js';
import type { OracleParams } from '../src/gates/oracle.js';
import type { HandoffParams } from '../src/quant/handoff.js';
import type { ParityParams, TargetSpec } from '../src/gates/parity.js';
import type { NativeParams } from '../src/gates/native-stage.js';
import type { CompileParams, CompileToolchain } from '../src/toolchain/qnn/compile-stage.js';
import { qairtSdk, qairtSdkVersion } from '../src/toolchain/qnn/qairt-sdk.js';
import type { BundleParams } from '../src/bundle/bundle-stage.js';
import type { EmulationParams } from '../src/gates/emulation.js';
import type { HexagonArch as Arch } from '../src/arch/table.js';
import { nativeSourceHash } from '../src/toolchain/native.js';
import { repoRoot } from '../src/paths.js';
import { stageMemory, traceMemory } from './memory.js';
import { readFileSync } from 'node:fs';
import { selectNodes } from '../src/engine/run.js';
import { getFamily } from '../src/families/index.js';
import type { Family } from '../src/families/types.js';

const src = (p: string) => join(repoRoot(), 'src', p);

/**
 * What fetch is keyed on: the source, and for the hub only what picks the bytes (repo, revision, the
 * finite check's switch), so a pinned recipe and `--revision` with the same sha share an entry.
 */
function fetchSource(recipe: Recipe): FetchParams['source'] {
  const s = recipe.source;
  if (s.kind !== 'hub') return s;
  if (s.revision === null) throw new Error(`recipe ${recipe.id}: source.revision is not pinned: a build pins it first (pinnedRecipe: forge build --revision)`);
  return { kind: 'hub', repo: s.repo, revision: s.revision, ...(s.allowNonFinite ? { allowNonFinite: s.allowNonFinite } : {}) };
}

function fetchNode(recipe: Recipe, localDigest: LocalDigest | undefined): StageNode {
  const params: FetchParams = { source: fetchSource(recipe), family: recipe.family };
  let tools: string[] = [];
  if (recipe.source.kind === 'tiny') {
    tools = ['python-env'];
  } else if (recipe.source.kind === 'local') {
    if (!localDigest) throw new Error(`recipe ${recipe.id}: a local source needs its content digest (localCheckpointDigest) to be keyed`);
    params.digest = localDigest;
  }
  return { id: 'fetch', module: src('hub/fetch-stage.ts'), params: params as any, inputs: {}, tools, memory: stageMemory.fetch };
}

function traceNode(recipe: Recipe, s: ArchSettings, prompts?: TraceInput[]): StageNode {
  // Image prompts follow the text ones, audio prompts the image ones (a --prompt or --from run traces only what it was given).
  const images: TraceInput[] = recipe.gates.imagePrompts.map((p) => ({ type: 'image', text: p.text, made: p.image.made }));
  const clips: TraceInput[] = recipe.gates.audioPrompts.map((p) => ({ type: 'audio', text: p.text, made: p.audio.made }));
  const params: TraceParams = {
    prompts: prompts ?? [...recipe.gates.prompts, ...images, ...clips], newTokens: recipe.gates.parity.tokens, maxContext: s.maxContext,
    ...(s.image && !prompts && images.length ? { image: s.image } : {}),
    ...(s.audio && !prompts && clips.length ? { audio: s.audio } : {}),
  };
  return { id: 'trace', module: src('gates/trace-stage.ts'), params: params as any, inputs: { checkpoint: 'fetch' }, tools: ['python-env'], memory: traceMemory(getFamily(recipe.family) as Family<unknown>) };
}

/** quant or lmHead.quant 'auto': the precision stage picks the layers' and the lm-head's precisions with the oracle before the plan (quant/auto.ts). */
function precisionNode(recipe: Recipe, arch: Arch, s: ArchSettings): StageNode {
  const o = recipe.gates.oracle;
  const params: AutoParams = {
    family: recipe.family, layerQuant: s.quant, lmHeadQuant: s.lmHead.quant, maxContext: s.maxContext, overrides: s.overrides, minCosine: o.autoMinCosine, lmHeadMinCosine: shippedMinCosine(o, s.quant), minTop1: o.minTop1,
    parity: { recipe: { id: recipe.id, family: recipe.family }, arch: arch.id, tokens: recipe.gates.parity.tokens, minMatch: recipe.gates.parity.minMatch, maxTies: recipe.gates.parity.maxTies },
  };
  return { id: 'precision', module: src('quant/auto.ts'), params: params as any, inputs: { checkpoint: 'fetch', trace: 'trace', native: 'native' }, tools: ['onnxruntime-node'], memory: stageMemory.precision(s.maxContext) };
}

function oracleNode(recipe: Recipe, s: ArchSettings): StageNode {
  const o = recipe.gates.oracle;
  const params: OracleParams = {
    family: recipe.family,
    variants: [{ input: 'export', minCosine: o.fp32MinCosine }, { input: 'quantize', minCosine: shippedMinCosine(o, s.quant), ...(s.handoff !== 'f32' ? { handoff: true } : {}) }],
    minTop1: o.minTop1,
    ...(s.handoff !== 'f32' ? { handoff: s.handoff } : {}),
  };
  return { id: 'oracle', module: src('gates/oracle.ts'), params: params as any, inputs: { checkpoint: 'fetch', trace: 'trace', export: 'export', quantize: 'quantize' }, tools: ['onnxruntime-node'], memory: stageMemory.oracle };
}

/**
 * The stage whose graphs ship: quantize's, or — when the recipe lets the oracle gate choose the
 * residual hand-off dtype — the handoff stage's copy of them with that dtype at the graphs' edges.
 */
function shippedGraphs(s: ArchSettings): string {
  return s.handoff === 'f32' ? 'quantize' : 'handoff';
}

function handoffNode(): StageNode {
  const params: HandoffParams = { variant: 'quantize' };
  return { id: 'handoff', module: src('quant/handoff.ts'), params: params as any, inputs: { quantize: 'quantize', oracle: 'oracle' }, tools: [], memory: stageMemory.handoff };
}

function nativeNode(): StageNode {
  const params: NativeParams = { sources: nativeSourceHash() };
  return { id: 'native', module: src('gates/native-stage.ts'), params: params as any, inputs: {}, tools: ['onnxruntime-node'], memory: stageMemory.native, timeoutSeconds: 1800 };
}

/** The parity threshold every variant is held to, and the recipe's bound on ties with its reason. */
function parityBounds(recipe: Recipe): { minMatch: number; maxTies: number; tiesWhy?: string } {
  const p = recipe.gates.parity;
  return { minMatch: p.minMatch, maxTies: p.maxTies, ...(p.maxTies > 0 && p.tiesWhy ? { tiesWhy: p.tiesWhy } : {}) };
}

/**
 * On the host, parity runs the fp32 reference and the shipped graphs as ONNX on the CPU. A phone
 * runs only compiled contexts, so there it runs the shipped graphs as the compile stage built them.
 */
function parityNode(recipe: Recipe, arch: Arch, s: ArchSettings, target: TargetSpec): StageNode {
  const onDevice = target.kind === 'adb';
  const params: ParityParams = {
    recipe: { id: recipe.id, family: recipe.family }, arch: arch.id,
    tokens: recipe.gates.parity.tokens, ...parityBounds(recipe),
    variants: onDevice ? ['quantize'] : ['export', 'quantize'], target,
  };
  return {
    id: 'parity', module: src('gates/parity.ts'), params: params as any,
    // The oracle's largest logit error per variant sets the tie margin (src/gates/parity.ts).
    inputs: { checkpoint: 'fetch', trace: 'trace', export: 'export', quantize: shippedGraphs(s), native: 'native', oracle: 'oracle', ...(onDevice ? { compile: 'compile' } : {}) },
    tools: [], memory: stageMemory.parity, timeoutSeconds: 3600,
  };
}

/**
 * What a stage that runs a pinned toolchain's onnxruntime-qnn declares: its versions and its name
 * with its file's hash (toolchainVersions), not the main venv's `python-env`, which the stages
 * before the compile declare and so keep sharing with the default build.
 */
const pinnedToolchainTools = ['onnxruntime', 'onnxruntime-qnn', 'toolchain'];

/** The compile toolchain: the QAIRT SDK while QAIRT_SDK_ROOT names one (an unusable one is an error), else onnxruntime-qnn. */
export function compileToolchain(env: NodeJS.ProcessEnv = process.env): CompileToolchain {
  const sdk = qairtSdk(env);
  return sdk ? { kind: 'qairt', version: qairtSdkVersion(sdk) } : { kind: 'onnxruntime-qnn' };
}

function compileNode(arch: Arch, s: ArchSettings, toolchain: CompileToolchain): StageNode {
  const fake = process.env.FORGE_FAKE_HTP_LIMIT_BYTES;
  const params: CompileParams = {
    arch: { id: arch.id, socModel: arch.socModel, dspArch: arch.dspArch, vtcmMb: arch.vtcmMb, contextCeilingBytes: arch.contextCeilingBytes, maxContexts: arch.maxContexts, maxGraphsPerProcess: arch.maxGraphsPerProcess },
    toolchain,
    fp16: true,
    timeoutSeconds: 3600,
    ...(fake ? { fakeHtpLimitBytes: Number(fake) } : {}),
  };
  // After the oracle gate: graphs that left the oracle are not worth an hour of compiling (but the
  // gate's figures are not an input, so a new prompt does not recompile).
  const tools = toolchain.kind === 'qairt' ? ['qairt-sdk'] : toolchain.env ? pinnedToolchainTools : ['onnxruntime', 'onnxruntime-qnn', 'python-env'];
  return { id: 'compile', module: src('toolchain/qnn/compile-stage.ts'), params: params as any, inputs: { quantize: shippedGraphs(s) }, after: ['oracle'], tools, memory: stageMemory.compile, timeoutSeconds: 4 * 3600 };
}

/** The gates a recipe asks for; the run record keeps this list and `forge publish` requires each. */
export function requiredGates(recipe: Recipe): string[] {
  return ['oracle', 'parity', ...(recipe.gates.emulation ? ['emulation'] : [])];
}

/**
 * The x86 HTP simulator gate: the compiled binaries, teacher-forced and in parity, for recipes that
 * ask for it (the simulator takes 50–300 ms a graph call even for a tiny twin: measured here,
 * tiny-qwen3 prefill ~270 ms and decode ~66 ms, tiny-qwen3.5 decode 54–148 ms).
 */
function emulationNode(recipe: Recipe, arch: Arch, s: ArchSettings, toolchain: CompileToolchain): StageNode | string {
  if (!recipe.gates.emulation) return 'the recipe does not ask for it (gates.emulation): the x86 HTP simulator takes 50–300 ms a graph call even for a tiny twin';
  if (toolchain.kind === 'qairt') {
    return "the simulator gate compiles the graphs with onnxruntime-qnn, which leaves the QDQ weights of a QAIRT build on the CPU: not run when QAIRT_SDK_ROOT is set";
  }
  const params: EmulationParams = {
    recipe: { id: recipe.id, family: recipe.family },
    arch: { id: arch.id, socModel: arch.socModel, dspArch: arch.dspArch, vtcmMb: arch.vtcmMb },
    fp16: true, minCosine: shippedMinCosine(recipe.gates.oracle, s.quant), minTop1: recipe.gates.oracle.minTop1,
    tokens: recipe.gates.parity.tokens, ...parityBounds(recipe),
    ...(toolchain.env ? { toolchain } : {}),
  };
  return {
    id: 'emulation', module: src('gates/emulation.ts'), params: params as any,
    // The oracle's chained logit error: the simulator's parity judges ties by the host's rule.
    inputs: { checkpoint: 'fetch', trace: 'trace', quantize: shippedGraphs(s), native: 'native', oracle: 'oracle' },
    tools: toolchain.env ? pinnedToolchainTools : ['onnxruntime', 'onnxruntime-qnn', 'python-env'], memory: stageMemory.emulation, timeoutSeconds: 1800,
  };
}

function bundleNode(recipe: Recipe, arch: Arch, s: ArchSettings, gates: string[], gatesNotRun: Record<string, string> | undefined, auto: boolean, toolchain: CompileToolchain): StageNode {
  const params: BundleParams = {
    recipe: { id: recipe.id, family: recipe.family, source: recipe.source, card: recipe.card }, arch: arch.id, maxNewTokens: recipe.gates.parity.tokens,
    ...(gatesNotRun ? { gatesNotRun } : {}), settings: s,
  };
  return {
    id: 'bundle', module: src('bundle/bundle-stage.ts'), params: params as any,
    // Every gate is an input: a bundle exists only when all of them passed.
    // The trace for the card's Confidence section (HF's margins along the continuations); the plan
    // for what the planner dropped to stay within the arch's limits.
    inputs: { checkpoint: 'fetch', plan: 'plan', trace: 'trace', quantize: shippedGraphs(s), compile: 'compile', oracle: 'oracle', parity: 'parity', ...Object.fromEntries(gates.map((g) => [g, g])), ...(auto ? { precision: 'precision' } : {}) },
    // The card's Toolchain section lists these: a pinned toolchain's build names it.
    tools: ['onnxruntime', 'onnxruntime-qnn', 'onnxruntime-node', 'transformers', 'torch', ...(toolchain.kind === 'onnxruntime-qnn' && toolchain.env ? ['toolchain'] : [])], memory: stageMemory.bundle,
  };
}

/** `export` writes the float32 reference graphs; `quantize` the deployable ones in the recipe's scheme. */
function exportNode(id: string, recipe: Recipe, s: ArchSettings, toolchain: CompileToolchain): StageNode {
  const scheme = id === 'export' ? 'fp32' : baseScheme(s.quant);
  const lmHeadScheme = scheme === 'fp32' ? 'fp32' : baseScheme(s.lmHead.quant);
  const quantized = [scheme, lmHeadScheme].some((q) => q === 'w8' || q === 'w4');
  const params: ExportParams = {
    family: recipe.family,
    scheme,
    lmHeadScheme,
    maxContext: s.maxContext,
    prefillLength: s.prefillLength,
    ...(s.image ? { image: s.image } : {}),
    ...(s.audio ? { audio: s.audio } : {}),
    hostTables: id === 'quantize',
    // W8 and W4 in the form the compile toolchain reads as quantized weights (see quant/weights.ts):
    // QDQ for the QAIRT converter (W4's checked against the stand-in SDK only, quant/w4-qdq.ts).
    ...(toolchain.kind === 'qairt' && quantized ? { w8Form: 'qdq' as const } : {}),
    // The reference graphs read the checkpoint's own bytes: no fp32 copy of the weights on disk.
    ...(id === 'export' ? { inPlace: true } : {}),
    // The recipe's per-matrix pins, and auto's map (the precision stage's output), shape the shipped graphs only.
    ...(id === 'quantize' && s.overrides.length ? { overrides: s.overrides } : {}),
    // Exact rescalings for fp16 on the HTP: the shipped graphs only (the reference stays as HF computes).
    ...(id === 'quantize' && s.rescale.length ? { rescale: s.rescale.map(({ match, scale }) => ({ match, scale })) } : {}),
    // Experts rebalanced before quantization: the shipped tables only (fp32's are the checkpoint's numbers).
    ...(id === 'quantize' && s.equalize.length ? { equalize: s.equalize.map(({ match }) => ({ match })) } : {}),
  };
  const precision: Record<string, string> = id === 'quantize' && choosesPrecision(s) ? { precision: 'precision' } : {};
  return { id, module: src('export/stage.ts'), params: params as any, inputs: { checkpoint: 'fetch', plan: 'plan', ...precision }, tools: [], memory: id === 'quantize' ? stageMemory.quantize : stageMemory.export };
}

export interface PipelineOptions {
  target?: TargetSpec;
  /** Set when re-planning after an HTP memory failure. */
  ceilingBytes?: number;
  /** Default: compileToolchain() (the environment decides). */
  toolchain?: CompileToolchain;
  /** For a local source: its files' sha256 (localCheckpointDigest), the fetch stage's key. */
  localDigest?: LocalDigest;
  /** Traced instead of the recipe's gates.prompts (forge bisect --prompt / --from a runtime's run); only the trace's params change. */
  prompts?: TraceInput[];
}

function planNode(params: PlanParams, auto: boolean): StageNode {
  return { id: 'plan', module: src('plan/stage.ts'), params: params as any, inputs: { checkpoint: 'fetch', ...(auto ? { precision: 'precision' } : {}) }, tools: [], memory: stageMemory.plan };
}

export function buildPipeline(recipe: Recipe, arch: HexagonArch, settings: ArchSettings, opts: PipelineOptions = {}): Pipeline {
  const target = opts.target ?? { kind: 'host' };
  const plan: PlanParams = { family: recipe.family, arch: arch.id, settings, expectedConfig: recipe.config, ...(opts.ceilingBytes ? { ceilingBytes: opts.ceilingBytes } : {}) };
  const auto = choosesPrecision(settings);
  const toolchain = opts.toolchain ?? compileToolchain();
  const emu = emulationNode(recipe, arch, settings, toolchain);
  const emulation = typeof emu === 'string' ? null : emu;
  const gatesNotRun = typeof emu === 'string' ? { emulation: emu } : undefined;
  return {
    nodes: [
      fetchNode(recipe, opts.localDigest),
      // Under auto the plan needs the precisions, which need the trace and the runtime; otherwise the
      // plan goes first (a compile that cannot fit the machine is refused before the trace).
      ...(auto ? [nativeNode(), traceNode(recipe, settings, opts.prompts), precisionNode(recipe, arch, settings), planNode(plan, true)] : [planNode(plan, false), traceNode(recipe, settings, opts.prompts)]),
      exportNode('export', recipe, settings, toolchain),
      exportNode('quantize', recipe, settings, toolchain),
      oracleNode(recipe, settings),
      ...(settings.handoff !== 'f32' ? [handoffNode()] : []),
      compileNode(arch, settings, toolchain),
      ...(auto ? [] : [nativeNode()]),
      parityNode(recipe, arch, settings, target),
      ...(emulation ? [emulation] : []),
      bundleNode(recipe, arch, settings, emulation ? ['emulation'] : [], gatesNotRun, auto, toolchain),
    ],
    publish: ['bundle'],
    reports: ['plan', ...(auto ? ['precision'] : []), 'oracle', 'parity', ...(emulation ? ['emulation'] : [])],
    ...(gatesNotRun ? { gatesNotRun } : {}),
  };
}

/** The host-ops the native runtime registers (its explicit list, native/src/host_ops.cpp). */
export function runtimeHostOps(): Set<string> {
  const src = readFileSync(join(repoRoot(), 'native', 'src', 'host_ops.cpp'), 'utf8');
  return new Set([...src.matchAll(/^\s*\{"([a-z][a-z0-9_]*)",/gm)].map((m) => m[1]));
}

/**
 * A family whose host-op the runtime does not have yet (gemma4 until its host-op lands) can be built
 * through the oracle gate, not to a stage that runs the runtime (parity, emulation, the bundle):
 * refused before anything runs, naming the host-op and how far it can go.
 */
export function refuseWithoutHostOp(recipe: Recipe, pipeline: Pipeline, until: string | undefined, known = runtimeHostOps()): void {
  const hostOp = getFamily(recipe.family).hostOp;
  if (known.has(hostOp)) return;
  const runs = selectNodes(pipeline, until).filter((n) => n.id === 'parity' || n.id === 'emulation').map((n) => n.id);
  if (runs.length) {
    throw new Error(`recipe ${recipe.id}: family ${recipe.family} needs host-op '${hostOp}', which the native runtime does not have yet (it has ${[...known].join(', ')}): ${runs.join(' and ')} cannot run; build with --until oracle (or compile)`);
  }
}
