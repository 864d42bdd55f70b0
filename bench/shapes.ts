// Where a synthetic-bundle bench gets a model's shape: a recipe's recorded config and arch settings
// (planned with planRecipe, as `forge plan` does), or, for a model that has no recipe (Phi-tiny-MoE:
// its hub revision cannot be pinned here), bench/configs/<id>.json holding the same two things and
// where the config values came from (planned with makePlan straight from them).
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { getArch, type HexagonArch } from '../src/arch/table.js';
import { planRecipe } from '../src/plan/for-recipe.js';
import { makePlan, type ShardPlan } from '../src/plan/shards.js';
import { archSettings, loadRecipe, recipesDir } from '../src/recipe/load.js';
import { ARCH_SETTING_DEFAULTS, ArchSettingsPatchSchema, ArchSettingsSchema, FAMILY_IDS, type ArchSettings, type FamilyId } from '../src/recipe/schema.js';
import { getFamily } from '../src/families/index.js';
import { repoRoot } from '../src/paths.js';

export const benchConfigsDir = () => join(repoRoot(), 'bench', 'configs');

/** bench/configs/<id>.json: a recorded config and per-arch settings, without a recipe's source, gates or card. */
const BenchConfigSchema = z.object({
  $comment: z.array(z.string()).optional(),
  id: z.string().min(1),
  family: z.enum(FAMILY_IDS),
  /** Where the config values were copied from (and whether the model's own revision is pinned). */
  configSource: z.object({ repo: z.string(), path: z.string(), commit: z.string().regex(/^[0-9a-f]{40}$/), hubRevisionPinned: z.boolean() }).strict(),
  config: z.record(z.string(), z.unknown()),
  arch: z.record(z.string(), ArchSettingsPatchSchema),
}).strict();

export interface BenchShape {
  id: string;
  family: FamilyId;
  /** The file the shape came from (a recipe.json or a bench config). */
  file: string;
  /** 'recipe', or the bench config's configSource in one line. */
  source: string;
  /** config.json as recorded (written into the synthetic checkpoint). */
  rawConfig: Record<string, unknown>;
  arch: HexagonArch;
  settings: ArchSettings;
  plan: ShardPlan;
}

/** The shape `id` for `archId`: recipes/<id> when there is one, else bench/configs/<id>.json. */
export async function loadShape(id: string, archId: string): Promise<BenchShape> {
  const configFile = join(benchConfigsDir(), `${id}.json`);
  if (existsSync(join(recipesDir(), id, 'recipe.json')) || !existsSync(configFile)) {
    const { recipe, file } = loadRecipe(id); // names the known recipes when there is neither
    if (!recipe.config) throw new Error(`${file}: no recorded config, cannot shape a synthetic bundle`);
    const { arch, settings } = archSettings(recipe, archId, file);
    return { id, family: recipe.family, file, source: 'recipe', rawConfig: recipe.config as Record<string, unknown>, arch, settings, plan: await planRecipe(id, archId) };
  }
  const parsed = BenchConfigSchema.safeParse(JSON.parse(readFileSync(configFile, 'utf8')));
  if (!parsed.success) throw new Error(`invalid bench config ${configFile}: ${parsed.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ')}`);
  const c = parsed.data;
  if (c.id !== id) throw new Error(`${configFile}: id '${c.id}' does not match its file name`);
  const arch = getArch(archId);
  const settings = ArchSettingsSchema.parse({ ...ARCH_SETTING_DEFAULTS, ...c.arch.default, ...(c.arch[arch.id] ?? {}) });
  const family = getFamily(c.family);
  const plan = await makePlan(family, family.parseConfig(c.config, `${configFile} (config)`), arch, settings);
  const s = c.configSource;
  return {
    id, family: c.family, file: configFile, rawConfig: c.config, arch, settings, plan,
    source: `bench config; values from github.com/${s.repo} ${s.path} @${s.commit}${s.hubRevisionPinned ? '' : ' (hub revision unpinned)'}`,
  };
}
