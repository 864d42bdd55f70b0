// Builds tiny-qwen3 and assembles runnable bundles (W8 and fp32 graphs) for runtime tests:
//   node --import tsx test/helpers/make-bundle.ts <out-dir>
// Prints {"w8": dir, "fp32": dir, "trace": dir} as JSON.
import { join } from 'node:path';
import { build } from '../../src/build.js';
import { silentProgress } from '../../src/engine/progress.js';
import { cacheRoot } from '../../src/paths.js';
import { loadRecipe, archSettings } from '../../src/recipe/load.js';
import { assembleBundle } from '../../src/bundle/assemble.js';
import { readCheckpointRef } from '../../src/hub/checkpoint-ref.js';

const out = process.argv[2];
const record = await build({ recipe: 'tiny-qwen3', arch: 'v81', out: join(out, 'build'), progress: silentProgress });
if (!record.ok) throw new Error(record.error);
const entry = (id: string) => join(cacheRoot(), id, record.stages.find((s) => s.name === id)!.key!);
const { recipe } = loadRecipe('tiny-qwen3');
const { arch } = archSettings(recipe, 'v81');
const base = { recipe, arch, embeddingDir: entry('quantize'), checkpointDir: readCheckpointRef(entry('fetch')).absDir, maxNewTokens: recipe.gates.parity.tokens };
await assembleBundle({ ...base, graphsDir: entry('quantize') }, join(out, 'w8'));
await assembleBundle({ ...base, graphsDir: entry('export') }, join(out, 'fp32'));
console.log(JSON.stringify({ w8: join(out, 'w8'), fp32: join(out, 'fp32'), trace: entry('trace') }));
