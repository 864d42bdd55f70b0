// Builds tiny-qwen3 and assembles runnable bundles (W8 and fp32 graphs) for runtime tests, with
// --hybrid an fp32 and a W8 bundle of tiny-qwen3.5 (the hybrid host-op), with --phimoe an fp32 and a
// W8 bundle of tiny-phimoe (phimoe_generate), with --gemma4 of tiny-gemma4 (gemma4_split_generate),
// with --vl of tiny-qwen3-vl (qwen3_vl_generate):
//   node --import tsx test/helpers/make-bundle.ts <out-dir> [--hybrid] [--phimoe] [--gemma4] [--vl] [--all: every one]
// Prints {"w8": dir, "fp32": dir, "fp32Copy": dir, "trace": dir, "halfHandoffW8": dir[, "hybrid": dir, "hybridW8": dir, "hybridTrace": dir]
// [, "phimoe": dir, "phimoeW8": dir, "phimoeTrace": dir][, "gemma4": dir, "gemma4W8": dir, "gemma4Trace": dir]} as JSON.
// fp32Copy: tiny-qwen3's graphs with fp32 weights of their own (the export without `inPlace`, the
// form a recipe whose quant is fp32 compiles); the reference export reads the bf16 checkpoint in place.
import { join } from 'node:path';
import { build } from '../../src/build.js';
import { silentProgress } from '../../src/engine/progress.js';
import { cacheRoot } from '../../src/paths.js';
import { loadRecipe, archSettings } from '../../src/recipe/load.js';
import { assembleBundle } from '../../src/bundle/assemble.js';
import { readCheckpointRef } from '../../src/hub/checkpoint-ref.js';
import { mkdirSync, readFileSync } from 'node:fs';
import { runExport } from '../../src/export/stage.js';
import { writeHandoffExport } from '../../src/quant/handoff.js';

const out = process.argv[2];

/** Builds `recipeId` (through `until`, or fully) and assembles bundles of the given graph stages. */
async function bundles(recipeId: string, until: string | undefined, variants: Record<string, 'export' | 'quantize' | 'handoff'>) {
  const record = await build({ recipe: recipeId, arch: 'v81', out: join(out, 'build', recipeId), progress: silentProgress, ...(until ? { until } : {}) });
  if (!record.ok) throw new Error(record.error);
  const entry = (id: string) => join(cacheRoot(), id, record.stages.find((s) => s.name === id)!.key!);
  const { recipe } = loadRecipe(recipeId);
  const { arch } = archSettings(recipe, 'v81');
  const base = { recipe, arch, embeddingDir: entry('quantize'), checkpointDir: readCheckpointRef(entry('fetch')).absDir, maxNewTokens: recipe.gates.parity.tokens };
  for (const [dir, stage] of Object.entries(variants)) await assembleBundle({ ...base, graphsDir: entry(stage) }, join(out, dir));
  return { trace: entry('trace'), entry, recipe };
}

const built = await bundles('tiny-qwen3', undefined, { w8: 'quantize', fp32: 'export' });
const trace = built.trace;
{
  const { settings } = archSettings(built.recipe, 'v81');
  const plan = JSON.parse(readFileSync(join(built.entry('plan'), 'plan.json'), 'utf8'));
  mkdirSync(join(out, 'fp32-copy'), { recursive: true });
  await runExport({ family: built.recipe.family, scheme: 'fp32', lmHeadScheme: 'fp32', maxContext: settings.maxContext, prefillLength: settings.prefillLength, hostTables: false },
    readCheckpointRef(built.entry('fetch')).absDir, plan, join(out, 'fp32-copy'), { log() {}, progress() {} });
}

// The same W8 graphs with f16 residual hand-offs (the handoff stage's rewrite, as a recipe saying
// `handoff: f16` ships them): decoder_generate's f16 buffers through prefill and decode.
{
  const graphs = join(out, 'build', 'w8-f16-graphs');
  writeHandoffExport(built.entry('quantize'), graphs, 'float16');
  await assembleBundle({ recipe: built.recipe, arch: archSettings(built.recipe, 'v81').arch, graphsDir: graphs, embeddingDir: built.entry('quantize'),
    checkpointDir: readCheckpointRef(built.entry('fetch')).absDir, maxNewTokens: built.recipe.gates.parity.tokens }, join(out, 'w8-f16'));
}

const dense = { w8: join(out, 'w8'), fp32: join(out, 'fp32'), fp32Copy: join(out, 'fp32-copy'), trace, halfHandoffW8: join(out, 'w8-f16') };
// Up to the oracle gate (it needs trace, export and quantize): the parity gate would run this very runtime.
const wants = (flag: string) => process.argv.includes(flag) || process.argv.includes('--all');
const hybrid = wants('--hybrid')
  ? { hybrid: join(out, 'hybrid'), hybridW8: join(out, 'hybrid-w8'), hybridTrace: (await bundles('tiny-qwen3.5', 'oracle', { hybrid: 'export', 'hybrid-w8': 'quantize' })).trace }
  : {};
const phimoe = wants('--phimoe')
  ? { phimoe: join(out, 'phimoe'), phimoeW8: join(out, 'phimoe-w8'), phimoeTrace: (await bundles('tiny-phimoe', 'oracle', { phimoe: 'export', 'phimoe-w8': 'quantize' })).trace }
  : {};
const gemma4 = wants('--gemma4')
  // The shipped W8 graphs as the handoff stage gives them: the residual hand-offs in f16, as the oracle chose.
  ? { gemma4: join(out, 'gemma4'), gemma4W8: join(out, 'gemma4-w8'), gemma4Trace: (await bundles('tiny-gemma4', 'handoff', { gemma4: 'export', 'gemma4-w8': 'handoff' })).trace }
  : {};
const vl = wants('--vl')
  // Qwen3-VL: the vision encoder, M-RoPE positions and DeepStack inputs (qwen3_vl_generate).
  ? { vl: join(out, 'vl'), vlW8: join(out, 'vl-w8'), vlTrace: (await bundles('tiny-qwen3-vl', 'oracle', { vl: 'export', 'vl-w8': 'quantize' })).trace }
  : {};
console.log(JSON.stringify({ ...dense, ...hybrid, ...phimoe, ...gemma4, ...vl }));
