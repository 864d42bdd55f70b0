// `forge build`: recipe × arch → pipeline → stage cache → output directory with its run record.
// The output directory is replaced whole (built beside it, then swapped), so an interrupted build
// never leaves a mix of old and new files.
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, renameSync, writeFileSync } from 'node:fs';
import { reportHtml, reportMarkdown } from './bundle/report.js';
import type { OracleRow } from './gates/oracle.js';
import type { ShardPlan } from './plan/shards.js';
import { dirname, join, resolve } from 'node:path';
import { cpus, totalmem } from 'node:os';
import { performance } from 'node:perf_hooks';
import { loadRecipe, archSettings } from './recipe/load.js';
import { buildPipeline, requiredGates } from '../pipelines/build.js';
import { localSourceDigest } from './hub/local-digest.js';
import { StageCache, META } from './engine/cache.js';
import { Scheduler } from './engine/scheduler.js';
import { runPipeline, type PipelineResult } from './engine/run.js';
import { MEMORY_FAILURE } from './toolchain/qnn/compile-stage.js';
import { defaultProgress, type Progress } from './engine/progress.js';
import { toolVersions } from './toolchain/versions.js';
import { ensureVenv } from './toolchain/venv.js';
import { cacheRoot } from './paths.js';
import { RUN_RECORD, type RunRecord, type GateRecord } from './engine/record.js';
import type { Json } from './engine/stage.js';
import type { TargetSpec } from './gates/parity.js';

export interface BuildRequest {
  recipe: string;
  arch: string;
  out?: string;
  until?: string;
  force?: string[];
  jobs?: number;
  memoryBudgetBytes?: number;
  progress?: Progress;
  verbose?: boolean;
  /** Where the parity gate runs the bundle (default: this machine). */
  target?: TargetSpec;
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
  const { recipe, file } = loadRecipe(req.recipe);
  const { arch, settings } = archSettings(recipe, req.arch);
  const out = req.out ? resolve(req.out) : defaultOut(recipe.id, arch.id);
  const progress = req.progress ?? defaultProgress(req.verbose);
  const tools = toolVersions();
  // Every build traces with the Python oracle: set its environment up here, where the user sees it,
  // rather than silently inside the first stage that needs it.
  await ensureVenv();
  const cache = new StageCache(cacheRoot());
  const scheduler = new Scheduler({
    concurrency: req.jobs ?? cpus().length,
    memoryBudgetBytes: req.memoryBudgetBytes ?? Math.floor(totalmem() * 0.75),
  });
  // A compile that runs out of HTP memory re-plans with smaller shards, at most twice, and says so.
  const replans: Array<{ reason: string; ceilingBytes: number }> = [];
  const localDigest = await localSourceDigest(recipe, file, (m) => process.stderr.write(`[forge] ${m}\n`));
  let pipeline = buildPipeline(recipe, arch, settings, { target: req.target, localDigest });
  let result: PipelineResult;
  try {
  result = await runPipeline(pipeline, { cache, scheduler, progress, toolVersions: tools, until: req.until, force: req.force });
  while (result.failure?.stage === 'compile' && result.failure.message.includes(MEMORY_FAILURE) && replans.length < 2) {
    const ceilingBytes = smallerCeiling(result, arch.contextCeilingBytes);
    if (!ceilingBytes) break;
    replans.push({ reason: result.failure.message, ceilingBytes });
    progress.log('plan', `re-planning with a ${ceilingBytes}-byte context ceiling after: ${result.failure.message}`);
    process.stderr.write(`[forge] compile ran out of HTP memory; re-planning with smaller shards (ceiling ${(ceilingBytes / 1e6).toFixed(1)} MB), attempt ${replans.length} of 2\n`);
    pipeline = buildPipeline(recipe, arch, settings, { target: req.target, ceilingBytes, localDigest });
    result = await runPipeline(pipeline, { cache, scheduler, progress, toolVersions: tools, until: req.until, force: req.force });
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
  const record: RunRecord = {
    recipe: recipe.id,
    arch: arch.id,
    ok: result.ok,
    ...(result.failure ? { error: `${result.failure.stage}: ${result.failure.message}` } : {}),
    stages: result.stages,
    ...(replans.length ? { replans } : {}),
    gates,
    ...(pipeline.gatesNotRun ? { gatesNotRun: pipeline.gatesNotRun } : {}),
    gatesRequired: requiredGates(recipe),
    summaries,
    tools,
    bundle: out,
    seconds: (performance.now() - t0) / 1000,
  };

  // Assemble beside the target, then swap it in.
  const staging = `${out}.partial-${process.pid}`;
  rmSync(staging, { recursive: true, force: true });
  mkdirSync(join(staging, 'build'), { recursive: true });
  if (result.ok) {
    for (const id of pipeline.publish) {
      const entry = result.entries.get(id);
      if (!entry) continue; // not reached with --until
      cpSync(entry.dir, staging, { recursive: true, filter: (p) => !p.endsWith(`/${META}`) });
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
  const report = {
    record, oracleRows: readJson<{ rows: OracleRow[] }>('oracle', 'oracle.json')?.rows, plan: readJson<ShardPlan>('plan', 'plan.json'),
    contexts: readJson<{ contexts: Array<{ name: string; bytes: number }> }>('compile', 'compile.json')?.contexts,
  };
  writeFileSync(join(staging, 'build', 'report.md'), reportMarkdown(report));
  writeFileSync(join(staging, 'build', 'report.html'), reportHtml(report));
  mkdirSync(dirname(out), { recursive: true });
  const old = `${out}.old-${process.pid}`;
  if (existsSync(out)) renameSync(out, old);
  renameSync(staging, out);
  rmSync(old, { recursive: true, force: true });
  return record;
}
