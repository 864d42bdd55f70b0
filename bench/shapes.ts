// Where a synthetic-bundle bench gets a model's shape: a recipe's recorded config and arch settings,
// planned with planRecipe as `forge plan` does (offline; an unpinned hub recipe such as phi-tiny-moe
// plans too, since planning reads only the recorded config).
import type { HexagonArch } from '../src/arch/table.js';
import { planRecipe } from '../src/plan/for-recipe.js';
import type { ShardPlan } from '../src/plan/shards.js';
import { archSettings, loadRecipe } from '../src/recipe/load.js';
import type { ArchSettings, FamilyId, Recipe } from '../src/recipe/schema.js';

export interface BenchShape {
  id: string;
  family: FamilyId;
  /** The recipe.json the shape came from. */
  file: string;
  /** Where the recorded config came from, in one line. */
  source: string;
  /** config.json as recorded (written into the synthetic checkpoint). */
  rawConfig: Record<string, unknown>;
  arch: HexagonArch;
  settings: ArchSettings;
  plan: ShardPlan;
}

/** 'recipe', or the recipe's configSource in one line when its config was copied from elsewhere. */
function configOrigin(recipe: Recipe): string {
  const s = recipe.configSource;
  if (!s) return 'recipe';
  const unpinned = recipe.source.kind === 'hub' && recipe.source.revision === null;
  return `recipe; config values from ${s.repo} ${s.path} @${s.commit}${unpinned ? ' (hub revision unpinned)' : ''}`;
}

/** The shape of recipe `id` for `archId`. */
export async function loadShape(id: string, archId: string): Promise<BenchShape> {
  const { recipe, file } = loadRecipe(id); // names the known recipes when there is none
  if (!recipe.config) throw new Error(`${file}: no recorded config, cannot shape a synthetic bundle`);
  const { arch, settings } = archSettings(recipe, archId, file);
  return { id, family: recipe.family, file, source: configOrigin(recipe), rawConfig: recipe.config as Record<string, unknown>, arch, settings, plan: await planRecipe(id, archId) };
}
