// The nightly matrix: which recipe × arch builds a nightly runs, and what counts as a regression.
// Data, validated like a recipe: every refusal is one line naming the file and the field, before a
// single build starts (a typo in the last entry must not cost the first hour of a nightly).
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { z } from 'zod';
import { ARCH_IDS } from '../arch/table.js';
import { listRecipeIds, recipesDir, RecipeError } from '../recipe/load.js';
import { repoRoot } from '../paths.js';
import { listToolchains, resolveToolchain, toolchainsDir } from '../toolchain/toolchains.js';

/**
 * What the regression report flags. The defaults are rules, not measurements: a cosine may not fall
 * below its recipe's threshold (the gate's own bound) nor by more than `maxCosineDrop` while still
 * above it (a quantizer change that halves the margin should be seen before it fails a gate).
 */
export const ThresholdsSchema = z.object({
  /** Largest fall of a min cosine (oracle or simulator, per graph) not flagged. */
  maxCosineDrop: z.number().min(0).max(1).default(1e-4),
  /** A compiled context may grow by this fraction of its previous bytes before it is flagged. */
  maxContextGrowth: z.number().min(0).default(0.05),
  /** The same for the whole bundle (every file but build/). */
  maxBundleGrowth: z.number().min(0).default(0.05),
  /**
   * Timings are shown but not flagged unless this is set: a build (or stage) that took more than
   * this many times its previous seconds, and at least 1 s more, is flagged. Off by default because
   * stage times on a shared 2-core machine move by more than any code change does.
   */
  maxSlowdown: z.number().gt(1).optional(),
  /**
   * The same rules between two toolchains of one recipe × arch (the report's toolchain comparison)
   * always flag a difference there; it also fails the nightly only when this is true. Off by
   * default: a candidate toolchain doing worse than the pinned one is a finding, not a regression.
   */
  failOnToolchainDifference: z.boolean().default(false),
}).strict();
export type Thresholds = z.infer<typeof ThresholdsSchema>;

export const MatrixSchema = z.object({
  /** Free text shown in the report's title. */
  name: z.string().min(1).optional(),
  builds: z.array(z.object({
    recipe: z.string().min(1),
    arch: z.enum(ARCH_IDS as [string, ...string[]], { error: () => `not an arch (valid: ${ARCH_IDS.join(', ')})` }),
    /**
     * A pinned compile toolchain (toolchains/<name>.txt) this build compiles and simulates with;
     * absent: the main environment's. The same recipe × arch on two toolchains is compared side by
     * side in the report.
     */
    toolchain: z.string().regex(/^[\w.-]+$/, 'a toolchain name (a file toolchains/<name>.txt), not a path').optional(),
    /**
     * Peak memory (GB) the build needs, for `forge nightly --queue`: only a worker whose
     * --memory-budget holds it takes the job. Not declared: any worker may (the build's own
     * scheduler still refuses a stage predicted over that worker's budget).
     */
    memoryGB: z.number().positive().optional(),
  }).strict()).min(1),
  thresholds: ThresholdsSchema.default(ThresholdsSchema.parse({})),
}).strict();
export type Matrix = z.infer<typeof MatrixSchema>;
export type MatrixBuild = Matrix['builds'][number];

/**
 * `builds[2].arch`: a field path as recipe errors write it. A copy of recipe/load.ts's private
 * helper rather than an export from it: every stage imports load.ts, so any edit there changes
 * every stage's code hash and costs a full rebuild of every cached build.
 */
export function fieldPath(path: readonly PropertyKey[]): string {
  if (!path.length) return '(root)';
  return path
    .map((k, n) => (typeof k === 'number' ? `[${k}]` : `${n ? '.' : ''}${/^[\w-]+$/.test(String(k)) ? String(k) : JSON.stringify(String(k))}`))
    .join('');
}

/** `tiny-qwen3/v81`, `tiny-qwen3/v81/qnn-2.6.0`: how a build is named in nightly.json, the report and CI jobs. */
export const buildId = (b: Pick<MatrixBuild, 'recipe' | 'arch' | 'toolchain'>) => `${b.recipe}/${b.arch}${b.toolchain ? `/${b.toolchain}` : ''}`;

/** The shipped twin matrix, used when --matrix is not given. */
export function defaultMatrixFile(): string {
  return join(repoRoot(), 'nightly', 'twins.json');
}

/** Parses a matrix; `file` names where it came from in errors. Recipes are looked up in `recipes`, toolchains in `toolchains`. */
export function parseMatrix(raw: unknown, file: string, recipes = recipesDir(), toolchains = toolchainsDir()): Matrix {
  const parsed = MatrixSchema.safeParse(raw);
  if (!parsed.success) {
    throw new RecipeError(`invalid nightly matrix ${file}: ${parsed.error.issues.map((i) => `${fieldPath(i.path)}: ${i.message}`).join('; ')}`);
  }
  const m = parsed.data;
  const known = existsSync(recipes) ? listRecipeIds(recipes) : [];
  const knownToolchains = listToolchains(toolchains);
  const seen = new Map<string, number>();
  m.builds.forEach((b, n) => {
    if (!known.includes(b.recipe)) {
      throw new RecipeError(`invalid nightly matrix ${file}: ${fieldPath(['builds', n, 'recipe'])}: no recipe '${b.recipe}' in ${recipes} (known: ${known.join(', ') || 'none'})`);
    }
    if (b.toolchain !== undefined) {
      if (!knownToolchains.includes(b.toolchain)) {
        throw new RecipeError(`invalid nightly matrix ${file}: ${fieldPath(['builds', n, 'toolchain'])}: no toolchain '${b.toolchain}' in ${toolchains} (known: ${knownToolchains.join(', ') || 'none'})`);
      }
      // Unpinned or pin-less files are refused here too, not an hour into the nightly.
      try {
        resolveToolchain(b.toolchain, toolchains);
      } catch (e) {
        throw new RecipeError(`invalid nightly matrix ${file}: ${fieldPath(['builds', n, 'toolchain'])}: ${(e as Error).message}`);
      }
    }
    // Two entries for one build would run it twice and compare it with itself under one name.
    const first = seen.get(buildId(b));
    if (first !== undefined) throw new RecipeError(`invalid nightly matrix ${file}: ${fieldPath(['builds', n])}: ${buildId(b)} is already ${fieldPath(['builds', first])}`);
    seen.set(buildId(b), n);
  });
  return m;
}

export function loadMatrix(path = defaultMatrixFile()): { matrix: Matrix; file: string } {
  const file = resolve(path);
  if (!existsSync(file)) throw new RecipeError(`no nightly matrix at ${file}`);
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (e) {
    throw new RecipeError(`invalid nightly matrix ${file}: not valid JSON (${(e as Error).message})`);
  }
  return { matrix: parseMatrix(raw, file), file };
}
