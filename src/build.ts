// `forge build`: recipe × arch → pipeline → stage cache → output directory with its run record.
// Output directories are replaced whole (written beside, then renamed into place), so an interrupted
// or failed build never leaves a mix of old and new files, and never replaces a good bundle with
// less than one (see writeOutput).
import { cpSync, existsSync, mkdirSync, readFileSync, readdirSync, rmSync, renameSync, writeFileSync } from 'node:fs';
import { killOwnedGroups } from './engine/subprocess.js';
import { placeTree } from './io/files.js';
import { describeFailure } from './engine/io-failure.js';
import { reportHtml, reportMarkdown } from './bundle/report.js';
import type { OracleResult } from './gates/oracle.js';
import type { TraceMeta } from './gates/trace.js';
import { buildConfidence } from './bundle/confidence.js';
import type { ShardPlan } from './plan/shards.js';
import { GRAPHS_JSON, type ExportManifest } from './export/graphs.js';
import { exportMatrices, precisionRows, type PrecisionRow } from './bundle/precision-map.js';
import { PRECISION_JSON } from './quant/precision.js';
import type { PrecisionResult } from './quant/auto.js';
import { basename, dirname, join, resolve } from 'node:path';
import { cpus, totalmem } from 'node:os';
import { performance } from 'node:perf_hooks';
import { loadRecipe, archSettings, pinnedRecipe, RecipeError } from './recipe/load.js';
import { builtRevision, type PinnedRecipe, type PrecisionOverride, type Rescale, type Equalize, type ArchSettings } from './recipe/schema.js';
import { buildPipeline, compileToolchain, refuseWithoutHostOp, requiredGates } from '../pipelines/build.js';
import { localSourceDigest } from './hub/local-digest.js';
import { StageCache, META } from './engine/cache.js';
import { RemoteCache } from './engine/remote-cache.js';
import { Scheduler, defaultMemoryBudget } from './engine/scheduler.js';
import { runPipeline, type PipelineResult } from './engine/run.js';
import { MEMORY_FAILURE, type CompileToolchain } from './toolchain/qnn/compile-stage.js';
import { resolveToolchain, toolchainVersions, type Toolchain } from './toolchain/toolchains.js';
import { defaultProgress, type Progress } from './engine/progress.js';
import { toolVersions } from './toolchain/versions.js';
import { ensureVenv } from './toolchain/venv.js';
import { cacheRoot } from './paths.js';
import { RUN_RECORD, type RunRecord, type GateRecord } from './engine/record.js';
import type { Json, Pipeline } from './engine/stage.js';
import type { TargetSpec } from './gates/parity.js';
import type { TraceInput } from './gates/trace-stage.js';

export interface BuildRequest {
  recipe: string;
  arch: string;
  out?: string;
  until?: string;
  force?: string[];
  jobs?: number;
  memoryBudgetBytes?: number;
  /**
   * A lower per-context ceiling for the layer shards than the arch's (--shard-ceiling): asked for by
   * the user, e.g. so the compile fits this machine; never chosen by forge on its own.
   */
  shardCeilingBytes?: number;
  /**
   * `--revision`: the hub commit to fetch for a recipe whose revision is not pinned (`"revision":
   * null`); on a pinned recipe only its own sha is accepted. Refused before anything runs.
   */
  revision?: string;
  progress?: Progress;
  verbose?: boolean;
  /** Where the parity gate runs the bundle (default: this machine). */
  target?: TargetSpec;
  /**
   * The shared stage cache (`--cache s3://bucket/prefix`), or one already opened (nightly opens it once
   * for all its builds). Absent: FORGE_REMOTE_CACHE when set, else none.
   */
  remoteCache?: string | RemoteCache;
  /** Bundle files of this many bytes or more are linked from the cache into the output, not copied (default LINK_AT_LEAST). */
  linkAtLeastBytes?: number;
  /**
   * Per-matrix precision pins tried on top of the recipe's (forge bisect's candidate fixes), placed
   * before its own overrides so they win (the first match does): the recipe file stays as it is,
   * and the stages downstream of the overrides re-run under their own cache keys.
   */
  overrides?: PrecisionOverride[];
  /**
   * `--toolchain`: a pinned compile toolchain (toolchains/<name>.txt, or a path to such a file) whose
   * venv compiles and runs the simulator gate instead of the main environment's. Refused before
   * anything runs when it does not resolve, or when QAIRT_SDK_ROOT picks the QAIRT SDK instead.
   */
  toolchain?: string;
  /** Op rescalings tried on top of the recipe's (forge bisect's fp16 fixes), first as overrides are. */
  rescale?: Rescale[];
  /** Experts rebalanced before quantization, before the recipe's own (forge bisect's trials). */
  equalize?: Equalize[];
  /** The residual hand-off dtype tried instead of the recipe's (forge bisect's hand-off fix). */
  handoff?: ArchSettings['handoff'];
  /**
   * Inputs traced instead of the recipe's gates.prompts (forge bisect --prompt, or a runtime run's
   * token ids): the trace runs on them, so its cache key and every gate that reads it follow; no
   * other stage's params change.
   */
  prompts?: TraceInput[];
}

/** Prompts that replace a recipe's gates.prompts, checked: an empty list, prompt or id list is refused, naming which. */
export function checkPrompts<P extends TraceInput>(prompts: P[]): P[] {
  if (!prompts.length) throw new RecipeError('--prompt: no prompts given');
  const empty = prompts.findIndex((p) => (typeof p === 'string' ? !p.trim() : p.type === 'ids' ? !p.ids.length : !p.text.trim()));
  if (empty >= 0) throw new RecipeError(`--prompt: prompt ${empty + 1} of ${prompts.length} is empty`);
  return prompts;
}

/** 60% of the largest shard the failed plan had: enough to split the context that did not fit. */
function smallerCeiling(result: PipelineResult, current: number): number | null {
  const plan = result.entries.get('plan');
  if (!plan) return null;
  const p = JSON.parse(readFileSync(join(plan.dir, 'plan.json'), 'utf8')) as ShardPlan;
  const biggest = Math.max(...p.shards.map((s) => s.weightBytes));
  const next = Math.floor(Math.min(current, biggest) * 0.6);
  return next > 0 ? next : null;
}


export function defaultOut(recipe: string, arch: string): string {
  return resolve('out', recipe, arch);
}

export async function build(req: BuildRequest): Promise<RunRecord> {
  const t0 = performance.now();
  const loaded = loadRecipe(req.recipe);
  // The revision to fetch, before anything else: an unpinned recipe without --revision stops here.
  const recipe = pinnedRecipe(loaded, req.revision);
  if (req.prompts) checkPrompts(req.prompts);
  const forArch = archSettings(recipe, req.arch);
  if (req.overrides?.length) forArch.settings = { ...forArch.settings, overrides: [...req.overrides, ...forArch.settings.overrides] };
  if (req.rescale?.length) forArch.settings = { ...forArch.settings, rescale: [...req.rescale, ...forArch.settings.rescale] };
  if (req.equalize?.length) forArch.settings = { ...forArch.settings, equalize: [...req.equalize, ...forArch.settings.equalize] };
  if (req.handoff) forArch.settings = { ...forArch.settings, handoff: req.handoff };
  const { arch } = forArch;
  const toolchain = req.toolchain ? resolveToolchain(req.toolchain) : null;
  if (toolchain && compileToolchain().kind === 'qairt') {
    throw new RecipeError(`--toolchain ${req.toolchain} pins onnxruntime-qnn, but QAIRT_SDK_ROOT is set and picks the QAIRT SDK to compile with: unset one of them`);
  }
  const out = req.out ? resolve(req.out) : defaultOut(recipe.id, arch.id);
  const progress = req.progress ?? defaultProgress(req.verbose);
  // Ctrl-C or SIGTERM: stop the running stages (they kill their subprocesses), then finish with a
  // run record that says the build was interrupted. A second signal finds no handler and kills.
  const interrupt = new AbortController();
  const onSignal = (signal: NodeJS.Signals) => {
    killOwnedGroups();
    interrupt.abort(signal);
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    return await buildUnderSignals(req, { recipe, file: loaded.file }, forArch, toolchain, out, progress, interrupt.signal, t0);
  } finally {
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
  }
}

/** The progress line of a local checkpoint's content digest, before the stages. */
const DIGEST = 'digest';

async function buildUnderSignals(
  req: BuildRequest, { recipe, file }: { recipe: PinnedRecipe; file: string }, { arch, settings }: ReturnType<typeof archSettings>,
  toolchain: Toolchain | null, out: string, progress: Progress, signal: AbortSignal, t0: number,
): Promise<RunRecord> {
  const tools = { ...toolVersions(), ...(toolchain ? toolchainVersions(toolchain) : {}) };
  // A wrong bucket or credentials is one error before anything runs, not a warning per stage.
  const remote = req.remoteCache instanceof RemoteCache ? req.remoteCache : await RemoteCache.fromOption(req.remoteCache);
  // Every build traces with the Python oracle: set its environment up here, where the user sees it,
  // rather than silently inside the first stage that needs it. A pinned toolchain's venv likewise
  // (its stages only look it up by hash).
  await ensureVenv();
  if (toolchain) await ensureVenv(undefined, toolchain.file);
  const compileWith: CompileToolchain | undefined = toolchain ? { kind: 'onnxruntime-qnn', env: { name: toolchain.name, hash: toolchain.hash } } : undefined;
  const cache = new StageCache(cacheRoot());
  const scheduler = new Scheduler({
    concurrency: req.jobs ?? cpus().length,
    memoryBudgetBytes: req.memoryBudgetBytes ?? defaultMemoryBudget(totalmem()),
    onShort: (m) => progress.note('memory', m),
  });
  // A compile that runs out of HTP memory re-plans with smaller shards, at most twice, and says so.
  const replans: Array<{ reason: string; ceilingBytes: number }> = [];
  // A local checkpoint's content is its key: hashed before any stage (the files new or changed since
  // the last build only), with progress, and what it took goes in the record.
  const digestStats = { dir: '', files: 0, hashedFiles: 0, hashedBytes: 0, seconds: 0 };
  const localDigest = await localSourceDigest(recipe, file, {
    log: (m) => process.stderr.write(`[forge] ${m}\n`),
    progress: (done, total, f) => progress.update(DIGEST, done, total, f),
    stats: digestStats,
  });
  const asked = req.shardCeilingBytes;
  const prompts = req.prompts ? { prompts: req.prompts } : {};
  let pipeline = buildPipeline(recipe, arch, settings, { target: req.target, localDigest, toolchain: compileWith, ...prompts, ...(asked ? { ceilingBytes: asked } : {}) });
  refuseWithoutHostOp(recipe, pipeline, req.until);
  let result: PipelineResult;
  try {
  result = await runPipeline(pipeline, { cache, scheduler, progress, toolVersions: tools, until: req.until, force: req.force, signal, remote });
  while (result.failure?.stage === 'compile' && result.failure.message.includes(MEMORY_FAILURE) && replans.length < 2) {
    const ceilingBytes = smallerCeiling(result, Math.min(arch.contextCeilingBytes, asked ?? Infinity));
    if (!ceilingBytes) break;
    replans.push({ reason: result.failure.message, ceilingBytes });
    progress.log('plan', `re-planning with a ${ceilingBytes}-byte context ceiling after: ${result.failure.message}`);
    process.stderr.write(`[forge] compile ran out of HTP memory; re-planning with smaller shards (ceiling ${(ceilingBytes / 1e6).toFixed(1)} MB), attempt ${replans.length} of 2\n`);
    pipeline = buildPipeline(recipe, arch, settings, { target: req.target, ceilingBytes, localDigest, toolchain: compileWith, ...prompts });
    result = await runPipeline(pipeline, { cache, scheduler, progress, toolVersions: tools, until: req.until, force: req.force, signal, remote });
  }
  } finally {
    progress.close();
  }

  const gates: Record<string, GateRecord> = {};
  const summaries: Record<string, Json> = {};
  // A gate's figures go under `gates` (with its verdict), every other stage's under `summaries`: once each.
  for (const [id, { meta }] of result.entries) {
    const g = meta.outcome.gate;
    if (g) gates[g.name] = { ...((meta.outcome.summary ?? {}) as Record<string, Json>), ok: g.ok };
    else if (meta.outcome.summary !== undefined) summaries[id] = meta.outcome.summary;
  }
  for (const dir of [out, `${out}${INCOMPLETE}`]) removeStaleStaging(dir);
  const madeBundle = result.ok && !req.until;
  const status: RunRecord['status'] = result.interrupted ? 'interrupted' : !result.ok ? 'failed' : req.until ? 'partial' : 'ok';
  const error = result.interrupted ? `interrupted by ${result.interrupted}` : result.failure ? `${result.failure.stage}: ${result.failure.message}` : undefined;
  const target = outputDir(out, madeBundle);
  const hubRevision = builtRevision(recipe.source);
  const record: RunRecord = {
    recipe: recipe.id,
    arch: arch.id,
    ok: result.ok,
    status,
    ...(req.until ? { until: req.until } : {}),
    ...(error ? { error } : {}),
    ...(hubRevision ? { hubRevision } : {}),
    ...(remote ? { remoteCache: remote.url } : {}),
    ...(localDigest ? { checkpointDigest: digestStats } : {}),
    stages: result.stages,
    ...(asked ? { shardCeilingBytes: asked } : {}),
    ...(replans.length ? { replans } : {}),
    gates,
    ...(pipeline.gatesNotRun ? { gatesNotRun: pipeline.gatesNotRun } : {}),
    gatesRequired: requiredGates(recipe),
    summaries,
    tools,
    bundle: madeBundle ? out : null,
    buildDir: join(target, 'build'),
    seconds: (performance.now() - t0) / 1000,
  };
  try {
    writeOutput(target, record, result, pipeline, madeBundle, req.linkAtLeastBytes ?? LINK_AT_LEAST);
    // A good bundle makes the record of an earlier run that made none obsolete.
    if (madeBundle) rmSync(`${out}${INCOMPLETE}`, { recursive: true, force: true });
  } catch (e) {
    // The disk filled (or another I/O error) while writing out: the build failed, nothing half-written
    // stays, and what was in out/ before is as it was. The record still reaches --json.
    const message = describeFailure(e as Error, dirname(target));
    Object.assign(record, { ok: false, status: 'failed', error: `output: ${message}`, bundle: null, buildDir: null });
  }
  return record;
}

/** Suffix of the directory beside out/<recipe>/<arch> where a run that made no bundle leaves its build/. */
export const INCOMPLETE = '.incomplete';

/**
 * Bundle files this big are placed by link (placeTree); smaller ones (README.md, the manifest, the
 * tokenizer, wrappers) are copies of their own, so editing one in out/ cannot reach the cache.
 */
export const LINK_AT_LEAST = 64 << 20;

/**
 * Where this run's output goes. A bundle replaces `out` whole. A run that made none (a failure, an
 * interrupt, --until) writes only build/: into `out` when no bundle is there, else beside it into
 * `<out>.incomplete`, so the last good bundle and its own run record stay byte-identical.
 */
export function outputDir(out: string, madeBundle: boolean): string {
  return madeBundle || !existsSync(join(out, 'manifest.json')) ? out : `${out}${INCOMPLETE}`;
}

/**
 * What a build killed while writing left (its pid is gone): its staging dir is removed; the previous
 * output it had moved aside goes back into place if it never got to rename the new one in.
 */
function removeStaleStaging(target: string): void {
  const dir = dirname(target);
  const staging = `${basename(target)}.staging-`;
  const old = `${basename(target)}.old-`;
  for (const name of existsSync(dir) ? readdirSync(dir) : []) {
    if (!name.startsWith(staging) && !name.startsWith(old)) continue;
    const pid = Number(name.slice(name.lastIndexOf('-') + 1));
    if (pid === process.pid || !Number.isInteger(pid) || pidAlive(pid)) continue;
    if (name.startsWith(old) && !existsSync(target)) renameSync(join(dir, name), target);
    else rmSync(join(dir, name), { recursive: true, force: true });
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Writes the bundle (when made) and build/ beside `target`, then renames it into place. */
function writeOutput(target: string, record: RunRecord, result: PipelineResult, pipeline: Pipeline, madeBundle: boolean, linkAtLeast: number): void {
  mkdirSync(dirname(target), { recursive: true });
  const staging = `${target}.staging-${process.pid}`;
  rmSync(staging, { recursive: true, force: true });
  try {
    fillStaging(staging, record, result, pipeline, madeBundle, linkAtLeast);
    const old = `${target}.old-${process.pid}`;
    if (existsSync(target)) renameSync(target, old);
    renameSync(staging, target);
    rmSync(old, { recursive: true, force: true });
  } catch (e) {
    rmSync(staging, { recursive: true, force: true });
    throw e;
  }
}

function fillStaging(staging: string, record: RunRecord, result: PipelineResult, pipeline: Pipeline, madeBundle: boolean, linkAtLeast: number): void {
  mkdirSync(join(staging, 'build'), { recursive: true });
  if (madeBundle) {
    for (const id of pipeline.publish) {
      const entry = result.entries.get(id);
      if (!entry) continue; // not reached with --until
      // The GB context binaries and embedding table are reflinked or hard-linked from the cache, not
      // copied: nothing writes into a bundle file once it is placed (the record and reports are new
      // files in build/), and the output is only ever replaced whole, by rename.
      placeTree(entry.dir, staging, { linkAtLeast, skip: new Set([META]) });
    }
  }
  for (const id of pipeline.reports ?? []) {
    const entry = result.entries.get(id);
    if (entry) cpSync(entry.dir, join(staging, 'build'), { recursive: true, filter: (p) => !p.endsWith(`/${META}`) });
  }
  writeFileSync(join(staging, RUN_RECORD), JSON.stringify(record, null, 2) + '\n');
  const readJson = <T>(id: string, file: string): T | undefined => {
    const e = result.entries.get(id);
    return e && existsSync(join(e.dir, file)) ? (JSON.parse(readFileSync(join(e.dir, file), 'utf8')) as T) : undefined;
  };
  const trace = readJson<TraceMeta>('trace', 'trace.json');
  const oracle = readJson<OracleResult>('oracle', 'oracle.json');
  const report = {
    record, oracleRows: oracle?.rows, plan: readJson<ShardPlan>('plan', 'plan.json'),
    ...(trace?.margins && oracle?.logitError ? { confidence: buildConfidence(trace, oracle, readJson('emulation', 'emulation.json')) } : {}),
    contexts: readJson<{ contexts: Array<{ name: string; bytes: number }> }>('compile', 'compile.json')?.contexts,
    ...precisionForReport(readJson<ExportManifest>('quantize', GRAPHS_JSON), readJson<PrecisionResult>('precision', PRECISION_JSON)),
  };
  writeFileSync(join(staging, 'build', 'report.md'), reportMarkdown(report));
  writeFileSync(join(staging, 'build', 'report.html'), reportHtml(report));
}

/** The shipped graphs' per-layer precision map for the report, once the quantize export ran. */
function precisionForReport(exp: ExportManifest | undefined, auto: PrecisionResult | undefined): { precision?: PrecisionRow[] } {
  return exp ? { precision: precisionRows(exportMatrices(exp), auto) } : {};
}
