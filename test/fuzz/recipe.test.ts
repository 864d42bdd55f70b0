// Fuzz: the recipe loader against 10,000 seeded mutations of the shipped recipes (every field's
// value swapped, dropped, added, nested, numbers pushed out of range, the file's text damaged).
// Every case must load (and then give settings for every arch), or be refused by a RecipeError of
// one line naming the recipe file.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ARCH_IDS } from '../../src/arch/table.js';
import { archSettings, listRecipeIds, loadRecipe, recipesDir, RecipeError } from '../../src/recipe/load.js';
import { expectClearRefusal, FUZZ_CASES, FUZZ_SEED, mutateJsonText, Rng, show } from './mutate.js';

const seeds = listRecipeIds().map((id) => ({ id, doc: JSON.parse(readFileSync(join(recipesDir(), id, 'recipe.json'), 'utf8')) as unknown }));

describe('fuzz: recipe.json', () => {
  const dir = mkdtempSync(join(tmpdir(), 'forge-fuzz-recipe-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('starts from every shipped recipe, each of which loads', () => {
    expect(seeds.length).toBeGreaterThanOrEqual(4);
    for (const { id } of seeds) expect(loadRecipe(id).recipe.id).toBe(id);
  });

  it(`refuses every mutated recipe with one RecipeError line naming the file, or loads it whole (${FUZZ_CASES} cases)`, () => {
    const rng = new Rng(FUZZ_SEED);
    let refused = 0;
    for (let i = 0; i < FUZZ_CASES; i++) {
      const seed = rng.pick(seeds);
      const bytes = mutateJsonText(rng, seed.doc);
      mkdirSync(join(dir, seed.id), { recursive: true });
      const file = join(dir, seed.id, 'recipe.json');
      writeFileSync(file, bytes);
      try {
        const { recipe } = loadRecipe(seed.id, dir);
        for (const arch of ARCH_IDS) archSettings(recipe, arch, file);
      } catch (err) {
        refused++;
        expectClearRefusal(err, RecipeError, file, () => `case ${i} (from ${seed.id}): ${show(bytes)}`);
      }
    }
    console.log(`fuzz recipe: ${FUZZ_CASES} cases, ${refused} refused, seed ${FUZZ_SEED}`);
    expect(refused).toBeGreaterThan(FUZZ_CASES / 2);
  });
});
