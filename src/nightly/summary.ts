// One build's run record, reduced to what a nightly tracks: named figures (gate cosines, matched
// tokens, bytes, times) that the next nightly compares one by one, plus stages and tool versions.
// nightly.json is read back by the next nightly (--compare, the trend plots), so its shape is a zod
// schema too: a hand-edited or truncated previous file is refused naming the file and field.
import { readFileSync } from 'node:fs';
import { z } from 'zod';
import type { RunRecord } from '../engine/record.js';
import { loadRecipe, RecipeError } from '../recipe/load.js';
import { shippedMinCosine, type LayerQuant } from '../recipe/schema.js';
import { buildId, fieldPath, ThresholdsSchema } from './matrix.js';
import { parseTop1 } from '../gates/top1.js';

export const FigureSchema = z.object({
  /** cosine: higher is better, 1 at most; matched: tokens or steps out of `total`; bytes; seconds and ms: timings. */
  kind: z.enum(['cosine', 'matched', 'bytes', 'seconds', 'ms']),
  value: z.number(),
  total: z.number().optional(),
  /** The gate's own bound for this figure (a cosine's recipe threshold), when it has one. */
  threshold: z.number().optional(),
  /** What the figure was measured on, e.g. the precision of the graphs ('w8'). */
  note: z.string().optional(),
}).strict();
export type Figure = z.infer<typeof FigureSchema>;

export const BuildSummarySchema = z.object({
  id: z.string(),
  recipe: z.string(),
  arch: z.string(),
  /** The pinned compile toolchain it was built with (toolchains/<name>.txt); absent: the main environment's. */
  toolchain: z.string().optional(),
  ok: z.boolean(),
  status: z.string(),
  error: z.string().optional(),
  seconds: z.number(),
  bundle: z.string().nullable(),
  runRecord: z.string().nullable(),
  figures: z.record(z.string(), FigureSchema),
  /** source 'remote': a cached stage whose entry came from the shared cache. */
  stages: z.array(z.object({ name: z.string(), status: z.string(), seconds: z.number(), queuedSeconds: z.number().optional(), source: z.literal('remote').optional() }).strict()),
  /**
   * Not built for a reason of the machines', not the build's (the shared cache unreachable, a full
   * disk, the build process killed), on every worker that tried: never a regression of the build.
   */
  infra: z.string().optional(),
  tools: z.record(z.string(), z.string()),
  /** Built by a queue worker (forge nightly --queue): which one, its attempt, and how often the job stalled before. */
  queue: z.object({ worker: z.string(), attempts: z.number().int(), stalled: z.number().int() }).strict().optional(),
}).strict();
export type BuildSummary = z.infer<typeof BuildSummarySchema>;

export const NightlySchema = z.object({
  format: z.literal('forge-nightly/1'),
  name: z.string().optional(),
  startedAt: z.string(),
  seconds: z.number(),
  matrix: z.string(),
  thresholds: ThresholdsSchema,
  builds: z.array(BuildSummarySchema),
  /** The nightly.json this one was compared with (null: the first in its out dir). */
  comparedWith: z.string().nullable(),
  regressions: z.number().int(),
}).strict();
export type Nightly = z.infer<typeof NightlySchema>;

/** A JSON file of forge's own (a nightly result, a build summary) checked against its schema: one error naming the file and the field. */
export function readJsonFile<T>(schema: z.ZodType<T>, file: string, what: string): T {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (e) {
    throw new RecipeError(`cannot read ${what} ${file}: ${(e as Error).message}`);
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) throw new RecipeError(`invalid ${what} ${file}: ${parsed.error.issues.map((i) => `${fieldPath(i.path)}: ${i.message}`).join('; ')}`);
  return parsed.data;
}

export function readNightly(file: string): Nightly {
  return readJsonFile(NightlySchema, file, 'nightly result');
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) ? v : undefined);

/** A gate's "270/270" top-1 as a matched-of-total figure. */
function fraction(v: unknown): { value: number; total: number } | undefined {
  const t = parseTop1(v);
  return t ? { value: t.agree, total: t.rows } : undefined;
}

/**
 * The oracle threshold each variant was held to, from the recipe as it is now (the record keeps
 * each graph's verdict, not its bound). Undefined when the recipe no longer loads: the figure is
 * then compared on its fall alone.
 */
function oracleThreshold(recipeId: string, label: string, scheme: string): number | undefined {
  try {
    const o = loadRecipe(recipeId).recipe.gates.oracle;
    if (label === 'export' || scheme === 'fp32') return o.fp32MinCosine;
    return ['w8', 'w4', 'auto'].includes(scheme) ? shippedMinCosine(o, scheme as LayerQuant) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The figures of one record. Names leave the precision out (`oracle quantize/shard0.decode min
 * cosine`, the scheme in `note`) so a recipe moved from w8 to w4 is compared with its own past,
 * which is exactly the change a nightly has to show.
 */
export function figuresOf(record: RunRecord): Record<string, Figure> {
  const f: Record<string, Figure> = {};
  const oracle = record.gates.oracle;
  if (oracle && isObj(oracle.graphs)) {
    for (const [key, g] of Object.entries(oracle.graphs)) {
      if (!isObj(g)) continue;
      const [variant, graph] = [key.slice(0, key.indexOf('/')), key.slice(key.indexOf('/') + 1)];
      const [label, scheme = ''] = variant.split(':');
      const cos = num(g.minCosine);
      const threshold = oracleThreshold(record.recipe, label, scheme);
      if (cos !== undefined) f[`oracle ${label}/${graph} min cosine`] = { kind: 'cosine', value: cos, ...(threshold !== undefined ? { threshold } : {}), note: scheme };
      const top1 = fraction(g.top1);
      if (top1) f[`oracle ${label}/${graph} top-1`] = { kind: 'matched', ...top1, note: scheme };
    }
  }
  const parity = record.gates.parity;
  if (parity && isObj(parity.variants)) {
    for (const [variant, v] of Object.entries(parity.variants)) {
      if (!isObj(v)) continue;
      const [matched, total] = [num(v.matched), num(v.total)];
      if (matched !== undefined && total !== undefined) f[`parity ${variant} matched`] = { kind: 'matched', value: matched, total, note: String(parity.target ?? '') };
      const ms = isObj(v.timings) ? num(v.timings.decode_ms_per_token) : undefined;
      if (ms !== undefined) f[`parity ${variant} decode ms/token`] = { kind: 'ms', value: ms, note: 'host runtime' };
    }
  }
  const emu = record.gates.emulation;
  if (emu && emu.ran !== false && isObj(emu.graphs)) {
    const threshold = isObj(emu.thresholds) ? num(emu.thresholds.minCosine) : undefined;
    for (const [graph, g] of Object.entries(emu.graphs)) {
      if (!isObj(g)) continue;
      const cos = num(g.minCosine);
      if (cos !== undefined) f[`simulator ${graph} min cosine`] = { kind: 'cosine', value: cos, ...(threshold !== undefined ? { threshold } : {}) };
      const top1 = fraction(g.top1);
      if (top1) f[`simulator ${graph} top-1`] = { kind: 'matched', ...top1 };
    }
    if (isObj(emu.parity)) {
      const [matched, total] = [num(emu.parity.matched), num(emu.parity.total)];
      if (matched !== undefined && total !== undefined) f['simulator parity matched'] = { kind: 'matched', value: matched, total };
    }
    const ms = num(emu.msPerToken);
    if (ms !== undefined) f['simulator ms/token'] = { kind: 'ms', value: ms, note: 'x86 HTP simulator' };
  }
  const compile = record.summaries.compile;
  if (isObj(compile) && Array.isArray(compile.contexts)) {
    for (const c of compile.contexts) {
      if (!isObj(c) || typeof c.name !== 'string') continue;
      if (num(c.bytes) !== undefined) f[`context ${c.name} bytes`] = { kind: 'bytes', value: c.bytes as number };
      // Kept with the cached entry, so a cached build still shows what its compile took (its stage time is the lookup's).
      if (num(c.compileSeconds) !== undefined) f[`context ${c.name} compile seconds`] = { kind: 'seconds', value: c.compileSeconds as number };
    }
  }
  // The bundle stage's own count (every shipped file but the card and SHA256SUMS), cached with it.
  const made = record.summaries.bundle;
  if (record.bundle && isObj(made) && num(made.bytes) !== undefined) f['bundle bytes'] = { kind: 'bytes', value: made.bytes as number };
  f['build seconds'] = { kind: 'seconds', value: record.seconds };
  return f;
}

/**
 * The versions a build ran with: the record's (a pinned toolchain's onnxruntime and onnxruntime-qnn
 * replace the main environment's there), plus the QAIRT release inside the onnxruntime-qnn wheel
 * that compiled, which only the compile knows (`qairt`).
 */
function toolsOf(record: RunRecord): Record<string, string> {
  const compile = record.summaries.compile;
  const qairt = isObj(compile) && typeof compile.qairt === 'string' ? compile.qairt : undefined;
  return { ...record.tools, ...(qairt ? { qairt } : {}) };
}

export function summarize(record: RunRecord, runRecord: string | null, toolchain?: string): BuildSummary {
  return {
    id: buildId({ recipe: record.recipe, arch: record.arch, toolchain }),
    recipe: record.recipe,
    arch: record.arch,
    ...(toolchain ? { toolchain } : {}),
    ok: record.ok && record.status === 'ok',
    status: record.status,
    ...(record.error ? { error: record.error } : {}),
    seconds: record.seconds,
    bundle: record.bundle,
    runRecord,
    figures: figuresOf(record),
    stages: record.stages.map((s) => ({ name: s.name, status: s.status, seconds: s.seconds, ...(s.queuedSeconds ? { queuedSeconds: s.queuedSeconds } : {}), ...(s.source ? { source: s.source } : {}) })),
    tools: toolsOf(record),
  };
}

/** A build that never produced a run record (its recipe failed to load, build() threw). */
export function failedSummary(b: { recipe: string; arch: string; toolchain?: string }, error: string, seconds: number): BuildSummary {
  const { recipe, arch, toolchain } = b;
  return { id: buildId(b), recipe, arch, ...(toolchain ? { toolchain } : {}), ok: false, status: 'failed', error, seconds, bundle: null, runRecord: null, figures: {}, stages: [], tools: {} };
}
