// Fuzz: config.json through each family's parser, 10,000 seeded mutations of the real Qwen3-4B and
// Qwen3.5-4B configs the recipes record. Every case must be refused by a ConfigError of one line
// naming the file, or parse into a config whose every tensor has a shape of positive safe integers
// (what export and the checkpoint check rely on) — never NaN, a fraction or a wrapped number.
import { describe, expect, it } from 'vitest';
import { getFamily } from '../../src/families/index.js';
import { ConfigError, type Family } from '../../src/families/types.js';
import { headTensors, hostTensors, layerTensors } from '../../src/families/tensors.js';
import { loadRecipe } from '../../src/recipe/load.js';
import { expectClearRefusal, FUZZ_CASES, FUZZ_SEED, mutateJson, Rng, show } from './mutate.js';

const FILE = '/models/qwen/config.json';
const seeds = ['qwen3-4b', 'qwen3.5-4b'].map((id) => {
  const { recipe } = loadRecipe(id);
  return { id, family: getFamily(recipe.family) as Family<unknown>, config: recipe.config as unknown };
});

/**
 * The tensors a checkpoint of this config must hold, as export and the shape check see them (the
 * builders' own reads, families/tensors.ts): the host tables, final and lm-head tensors, and the first and last layer's (a mutated layer count can
 * be in the millions; a checkpoint check stops at the first layer that is missing).
 */
async function tensorShapes(family: Family<unknown>, config: unknown): Promise<number[][]> {
  const layers = family.numLayers(config);
  expect(Number.isSafeInteger(layers) && layers > 0, `numLayers ${layers}`).toBe(true);
  const head = await headTensors(family, config);
  const specs = [...hostTensors(family, config), ...head.final, ...head.lmHead];
  for (const l of new Set([0, layers - 1])) specs.push(...(await layerTensors(family, config, l)));
  return specs.map((t) => [...t.shape]);
}

describe('fuzz: config.json', () => {
  it('parses both seed configs', async () => {
    for (const s of seeds) expect((await tensorShapes(s.family, s.family.parseConfig(s.config, FILE))).length).toBeGreaterThan(10);
  });

  it(`refuses every mutated config with one ConfigError line naming the file, or gives sound tensor shapes (${FUZZ_CASES} cases)`, async () => {
    const rng = new Rng(FUZZ_SEED);
    let refused = 0;
    for (let i = 0; i < FUZZ_CASES; i++) {
      const seed = rng.pick(seeds);
      const raw = mutateJson(rng, seed.config);
      let config: unknown;
      try {
        config = seed.family.parseConfig(raw, FILE);
      } catch (err) {
        refused++;
        expectClearRefusal(err, ConfigError, FILE, () => `case ${i} (${seed.id}): ${show(raw)}`);
        continue;
      }
      for (const shape of await tensorShapes(seed.family, config)) {
        expect(shape.every((d) => Number.isSafeInteger(d) && d > 0), `seed ${FUZZ_SEED}, case ${i} (${seed.id}): accepted, but a tensor has shape [${shape}]: ${show(raw)}`).toBe(true);
      }
    }
    console.log(`fuzz config.json: ${FUZZ_CASES} cases, ${refused} refused, seed ${FUZZ_SEED}`);
    expect(refused).toBeGreaterThan(FUZZ_CASES / 4);
  });
});
