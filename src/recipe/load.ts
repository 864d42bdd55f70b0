import { readFileSync, readdirSync, existsSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { z } from 'zod';
import { ARCH_IDS, getArch, type HexagonArch } from '../arch/table.js';
import { ARCH_SETTING_DEFAULTS, ArchSettingsSchema, RecipeSchema, RevisionSchema, type ArchSettings, type PinnedRecipe, type Recipe } from './schema.js';
import { repoRoot } from '../paths.js';

export class RecipeError extends Error {
  /** Control characters (a newline quoted from the file) are escaped: a refusal is one line. */
  constructor(message: string) {
    super(message.replace(/[\u0000-\u001f\u007f]/g, (c) => JSON.stringify(c).slice(1, -1)));
    this.name = 'RecipeError';
  }
}

export function recipesDir(): string {
  return process.env.FORGE_RECIPES ? resolve(process.env.FORGE_RECIPES) : join(repoRoot(), 'recipes');
}

export function listRecipeIds(dir = recipesDir()): string[] {
  return readdirSync(dir, { withFileTypes: true })
    .filter((d) => d.isDirectory() && existsSync(join(dir, d.name, 'recipe.json')))
    .map((d) => d.name)
    .sort();
}

/** `a.b[0]."odd key"`: how a field path reads in a message. */
function fieldPath(path: readonly PropertyKey[]): string {
  if (!path.length) return '(root)';
  return path
    .map((k, n) => (typeof k === 'number' ? `[${k}]` : `${n ? '.' : ''}${/^[\w-]+$/.test(String(k)) ? String(k) : JSON.stringify(String(k))}`))
    .join('');
}

/** One line: the file, then each problem as `field: message`, separated by `; `. */
function describeIssues(file: string, error: z.ZodError): string {
  return `invalid recipe ${file}: ${error.issues.map((i) => `${fieldPath(i.path)}: ${i.message}`).join('; ')}`;
}

/** Parses a recipe object; `file` only names where it came from in errors. */
export function parseRecipe(raw: unknown, file: string): Recipe {
  const parsed = RecipeSchema.safeParse(raw);
  if (!parsed.success) throw new RecipeError(describeIssues(file, parsed.error));
  const recipe = parsed.data;
  // A relative local path means the working directory's, resolved once here: the digest, the fetch
  // stage (whose relative paths are its own entry's) and the later stages then read the same folder.
  if (recipe.source.kind === 'local') recipe.source.path = resolve(recipe.source.path);
  for (const key of Object.keys(recipe.arch)) {
    if (key !== 'default' && !(ARCH_IDS as string[]).includes(key)) {
      throw new RecipeError(`invalid recipe ${file}: ${fieldPath(['arch', key])}: not an arch (valid: default, ${ARCH_IDS.join(', ')})`);
    }
  }
  return recipe;
}

export interface LoadedRecipe {
  recipe: Recipe;
  file: string;
  dir: string;
}

export function loadRecipe(id: string, dir = recipesDir()): LoadedRecipe {
  const file = join(dir, id, 'recipe.json');
  if (!existsSync(file)) {
    const known = existsSync(dir) ? listRecipeIds(dir) : [];
    throw new RecipeError(`no recipe '${id}' (looked for ${file}); known recipes: ${known.join(', ') || 'none'}`);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (e) {
    throw new RecipeError(`invalid recipe ${file}: not valid JSON (${(e as Error).message})`);
  }
  const recipe = parseRecipe(raw, file);
  if (recipe.id !== id) throw new RecipeError(`invalid recipe ${file}: id: '${recipe.id}' does not match its folder '${id}'`);
  return { recipe, file, dir: join(dir, id) };
}

/** The settings for one arch: the recipe's defaults overlaid with that arch's own, then validated. */
export function archSettings(recipe: Recipe, archId: string, file = recipe.id): { arch: HexagonArch; settings: ArchSettings } {
  const arch = getArch(archId);
  const merged = { ...ARCH_SETTING_DEFAULTS, ...recipe.arch.default, ...(recipe.arch[arch.id] ?? {}) };
  const parsed = ArchSettingsSchema.safeParse(merged);
  if (!parsed.success) throw new RecipeError(describeIssues(`${file} (arch ${arch.id})`, parsed.error));
  return { arch, settings: parsed.data };
}

/**
 * A local source's directory, checked before anything reads it: a missing or unreadable path is one
 * error naming the recipe file and the field, not a bare ENOENT from deep inside fetch.
 */
export function checkLocalSource(recipe: Recipe, file: string): void {
  if (recipe.source.kind !== 'local') return;
  const path = recipe.source.path;
  const shown = resolve(path) === path ? path : `${path} (${resolve(path)})`;
  let isDir: boolean;
  try {
    isDir = statSync(path).isDirectory();
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new RecipeError(`${file}: source.path: ${shown} ${code === 'ENOENT' ? 'does not exist' : `cannot be read (${code ?? (e as Error).message})`}`);
  }
  if (!isDir) throw new RecipeError(`${file}: source.path: ${shown} is not a directory (a local source names the checkpoint's folder)`);
  try {
    readdirSync(path);
  } catch (e) {
    throw new RecipeError(`${file}: source.path: ${shown} cannot be read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
}

/**
 * The recipe a build fetches: a hub source with its revision. `given` is `forge build --revision`:
 * it pins an unpinned recipe (`"revision": null`) for this build, and equals the pinned sha of a
 * pinned one or is refused (the recorded config belongs to that sha: edit the recipe to move it).
 * Every refusal is one line naming the recipe file and the field, and what to do.
 */
export function pinnedRecipe({ recipe, file }: Pick<LoadedRecipe, 'recipe' | 'file'>, given?: string): PinnedRecipe {
  const src = recipe.source;
  if (given !== undefined) {
    const ok = RevisionSchema.safeParse(given);
    if (!ok.success) throw new RecipeError(`--revision '${given}': ${ok.error.issues[0].message}`);
    if (src.kind !== 'hub') throw new RecipeError(`--revision pins a hub revision, but ${file} has source.kind '${src.kind}'`);
    if (src.revision !== null && src.revision !== given) {
      throw new RecipeError(`${file}: source.revision pins ${src.revision}; --revision ${given} differs (to build another commit, change source.revision and the recorded config to that commit's)`);
    }
    return { ...recipe, source: { ...src, revision: given } };
  }
  if (src.kind === 'hub' && src.revision === null) {
    throw new RecipeError(`${file}: source.revision: not pinned (${src.unpinned}); forge build needs the commit of ${src.repo} to fetch: pass --revision <40-hex commit sha> (its config.json must match the recipe's recorded config), or pin source.revision in the recipe (forge plan needs neither)`);
  }
  return recipe as PinnedRecipe;
}
