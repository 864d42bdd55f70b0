// One forge export of a checkpoint, exactly as `forge build`'s quantize stage runs it for a recipe
// (default qwen3-4b) on v81, with its weights in the recipe's scheme or --quant's (the lm-head keeps
// the recipe's), in its own process so the driver can measure its wall time and peak RSS.
//
//   node --import tsx bench/run-export.ts CHECKPOINT_DIR OUT_DIR [--recipe ID] [--quant w8|w4|fp16|fp32] [--per-tensor]
//
// Prints one JSON line on stdout: seconds, maxRssBytes (process.resourceUsage), contexts, and with
// --per-tensor the slowest tensors (time between consecutive tensors stored, graph building included).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { runExport, type ExportParams } from '../src/export/stage.js';
import { getFamily } from '../src/families/index.js';
import { benchArgs } from './util.js';
import { getArch } from '../src/arch/table.js';
import { makePlan } from '../src/plan/shards.js';
import { archSettings, loadRecipe } from '../src/recipe/load.js';
import { baseScheme, QuantSchemeSchema } from '../src/recipe/schema.js';

const { values: a, positionals: [ckptDir, out] } = benchArgs({ recipe: { type: 'string', default: 'qwen3-4b' }, quant: { type: 'string', default: '' }, 'per-tensor': { type: 'boolean' } });
if (!ckptDir || !out) {
  process.stderr.write('usage: run-export.ts CHECKPOINT_DIR OUT_DIR [--per-tensor]\n');
  process.exit(2);
}
const perTensor = a['per-tensor'] === true;
const recipeId = a.recipe;

const t0 = performance.now();
const { recipe } = loadRecipe(recipeId);
const { settings: recipeSettings } = archSettings(recipe, 'v81');
const settings = a.quant ? { ...recipeSettings, quant: QuantSchemeSchema.parse(a.quant) } : recipeSettings;
const family = getFamily(recipe.family);
const configFile = join(ckptDir, 'config.json');
const config = family.parseConfig(JSON.parse(readFileSync(configFile, 'utf8')), configFile);
const plan = await makePlan(family, config, getArch('v81'), settings);
const params: ExportParams = {
  family: recipe.family, scheme: baseScheme(settings.quant), lmHeadScheme: baseScheme(settings.lmHead.quant), overrides: settings.overrides,
  maxContext: settings.maxContext, prefillLength: settings.prefillLength, hostTables: true,
};

const ticks: Array<{ done: number; at: number; rss: number }> = [];
let last = performance.now();
const manifest = await runExport(params, ckptDir, plan, out, {
  log: (m) => process.stderr.write(`${m}\n`),
  progress: (done) => {
    if (!perTensor) return;
    const now = performance.now();
    ticks.push({ done, at: now - last, rss: process.memoryUsage.rss() });
    last = now;
  },
});
const seconds = (performance.now() - t0) / 1000;
const result: Record<string, unknown> = {
  seconds,
  maxRssBytes: process.resourceUsage().maxRSS * 1024,
  params,
  plan: { quant: plan.quant, shards: plan.shards.map((s) => [s.first, s.last]), lmHead: plan.lmHead.placement },
  contexts: manifest.contexts.map((c) => ({ name: c.name, dataBytes: c.dataBytes, graphs: c.graphs.length })),
};
if (perTensor) {
  result.slowestTicks = [...ticks].sort((a, b) => b.at - a.at).slice(0, 15).map((t) => ({ tensor: t.done, ms: Math.round(t.at), rssMB: Math.round(t.rss / 1e6) }));
  result.tickMsTotal = Math.round(ticks.reduce((a, t) => a + t.at, 0));
}
process.stdout.write(JSON.stringify(result) + '\n');
