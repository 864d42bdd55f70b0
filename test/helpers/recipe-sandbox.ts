// What the tests that write recipes of their own share: a private copy of recipes/ (a planted
// twin's recipe, an --apply, cannot touch what another test builds), a stage's cache entry from a
// run record, and a variant of a shipped recipe written beside it.
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { cacheRoot } from '../../src/paths.js';

/** A temp dir (`work`) holding a copy of recipes/ (`recipes`, for FORGE_RECIPES). */
export function recipeSandbox(prefix: string): { work: string; recipes: string } {
  const work = mkdtempSync(join(tmpdir(), prefix));
  const recipes = join(work, 'recipes');
  cpSync('recipes', recipes, { recursive: true });
  return { work, recipes };
}

/** The cache entry a run record's stage used (build --json's record, or bisect's `build`). */
export const stageEntry = (rec: { stages: Array<{ name: string; key?: string }> }, stage: string): string =>
  join(cacheRoot(), stage, rec.stages.find((s) => s.name === stage)!.key!);

/**
 * Recipe `base` copied to `id` with `edit` applied to its recipe.json (its folder's other files, the
 * chat template and the like, come along). Returns the new recipe.json's path.
 */
export function writeRecipeVariant(recipes: string, base: string, id: string, edit: (r: any) => void): string {
  const r = JSON.parse(readFileSync(join(recipes, base, 'recipe.json'), 'utf8'));
  r.id = id;
  edit(r);
  cpSync(join(recipes, base), join(recipes, id), { recursive: true });
  const file = join(recipes, id, 'recipe.json');
  writeFileSync(file, JSON.stringify(r, null, 2));
  return file;
}
