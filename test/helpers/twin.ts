// A tiny twin as the builds have it: placed by the fetch stage of a tiny recipe's build, in the stage
// cache the whole test run shares (from the machine's twin store, src/hub/twin-store.ts, which makes
// it when it lacks it). A test that needs a twin's files takes them from here. Tests that damage or
// plant a fault copy the folder first.
import { join } from 'node:path';
import { build } from '../../src/build.js';
import { silentProgress } from '../../src/engine/progress.js';
import { cacheRoot } from '../../src/paths.js';
import { listRecipeIds, loadRecipe } from '../../src/recipe/load.js';

/** The id of a shipped tiny recipe built from `twin`. */
export function recipeOfTwin(twin: string): string {
  const r = listRecipeIds().map((id) => loadRecipe(id).recipe).find((x) => x.source.kind === 'tiny' && x.source.twin === twin);
  if (!r) throw new Error(`no tiny recipe builds the ${twin} twin`);
  return r.id;
}

/** The directory of the `twin` checkpoint (config.json, model.safetensors, tokenizer, twin.json). */
export async function twinDir(twin: string): Promise<string> {
  const r = await build({ recipe: recipeOfTwin(twin), arch: 'v81', until: 'fetch', progress: silentProgress });
  if (r.error) throw new Error(`the ${twin} twin: ${r.error}`);
  return join(cacheRoot(), 'fetch', r.stages.find((x) => x.name === 'fetch')!.key!, 'model');
}
