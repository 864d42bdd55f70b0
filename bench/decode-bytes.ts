// Weight bytes one decode step reads, W8 against W4, per recipe and arch, from the planner's own
// accounting (quant/bytes.ts storedBytes over families/tensors.ts modelTensors, the numbers the plan
// cuts shards by) — no checkpoint, no timing. Decode on the NPU streams every weight of every layer
// once per token (batch 1, no reuse), so these bytes over the memory bandwidth bound tokens per second.
//
//   node --import tsx bench/decode-bytes.ts [--recipes qwen3-4b,qwen3.5-4b] [--archs v79,v81]
//                                           [--map precisions.json] [--markdown]
//
// Counted, per decode step:
// - every layer's matmul weights in the form shipped (codes + float32 block scales);
// - every layer's float tensors (norms, conv taps, …: float32 in the graphs);
// - the final norm and the lm-head matrix, in the lm-head's scheme: the recipe's (fp16 for both
//   4B recipes) and, as a second figure, the layers' scheme;
// - the embedding as one row of the f16 host table (the runtime looks the token's row up; the table
//   is never read whole).
// Not counted: KV caches and recurrent state (activations, growing with the position, not weights).
//
// --map takes a JSON object {tensorName: 'w4' | 'w8' | 'fp16'} (e.g. a `quant: 'auto'` build's
// promotions) and adds a column whose layer matmuls take the map's scheme where it names them and
// W4 elsewhere (a matrix W4 cannot block keeps its fallback, as under plain W4). makePlan takes no
// map, so that column has no shard count.
import { readFileSync } from 'node:fs';
import { getFamily } from '../src/families/index.js';
import { modelTensors } from '../src/families/tensors.js';
import type { TensorSpec } from '../src/families/types.js';
import { makePlan } from '../src/plan/shards.js';
import { storedBytes } from '../src/quant/bytes.js';
import { archSettings, loadRecipe } from '../src/recipe/load.js';
import type { QuantScheme } from '../src/recipe/schema.js';
import { benchArgs } from './util.js';

const { values: arg } = benchArgs({
  recipes: { type: 'string', default: 'qwen3-4b,qwen3.5-4b' },
  archs: { type: 'string', default: 'v79,v81' },
  map: { type: 'string', default: '' },
  markdown: { type: 'boolean' },
});

type MapScheme = 'w4' | 'w8' | 'fp16';
const MAP_SCHEMES = new Set<string>(['w4', 'w8', 'fp16']);

function readMap(file: string): Map<string, MapScheme> | null {
  if (!file) return null;
  const raw = JSON.parse(readFileSync(file, 'utf8')) as unknown;
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new Error(`${file}: want a JSON object {tensorName: 'w4' | 'w8' | 'fp16'}`);
  const m = new Map<string, MapScheme>();
  for (const [k, v] of Object.entries(raw)) {
    if (typeof v !== 'string' || !MAP_SCHEMES.has(v)) throw new Error(`${file}: ${k} → ${JSON.stringify(v)}, want 'w4', 'w8' or 'fp16'`);
    m.set(k, v as MapScheme);
  }
  return m;
}

/** Bytes of `ts` with each matmul under `schemeOf(name)`. */
const bytesOf = (ts: TensorSpec[], schemeOf: (t: TensorSpec) => QuantScheme) => ts.reduce((s, t) => s + storedBytes(t, schemeOf(t)), 0);

interface Column {
  label: string;
  /** Layer matmuls: every matrix's bytes per step. */
  layerMatmul: number;
  /** Layer float tensors (norms, conv taps …), float32. */
  layerFloat: number;
  /** Final norm + lm-head matrix in the recipe's lm-head scheme, and in the layers' scheme. */
  headRecipe: number;
  headSameScheme: number | null;
  embeddingRow: number;
  /** Per step, with the recipe's lm-head / with the lm-head in the layers' scheme. */
  totalRecipeHead: number;
  totalSameHead: number | null;
  shards: number | null;
  contexts: number | null;
}

const map = readMap(arg.map);
const rows: Array<{ recipe: string; arch: string; lmHeadScheme: QuantScheme; columns: Column[]; ratios: Record<string, number> }> = [];

for (const id of arg.recipes.split(',')) {
  const { recipe, file } = loadRecipe(id);
  if (!recipe.config) throw new Error(`${file}: no recorded config`);
  const family = getFamily(recipe.family);
  const config = family.parseConfig(recipe.config, `${file} (config)`);
  const tensors = await modelTensors(family, config);
  const layer = tensors.layers.flat();
  const matmuls = layer.filter((t) => t.role === 'matmul');
  const floats = layer.filter((t) => t.role !== 'matmul');
  if (map) {
    const known = new Set(layer.map((t) => t.name));
    const unknown = [...map.keys()].filter((k) => !known.has(k));
    if (unknown.length) process.stderr.write(`[decode-bytes] ${id}: ${unknown.length} map entries name no layer tensor of this model (ignored), e.g. ${unknown.slice(0, 3).join(', ')}\n`);
  }
  const hidden = tensors.host[0]?.shape[1] ?? 0;
  for (const archId of arg.archs.split(',')) {
    const { arch, settings } = archSettings(recipe, archId, file);
    const head = [...tensors.final, ...tensors.lmHead];
    const column = async (label: string, scheme: QuantScheme, schemeOf: (t: TensorSpec) => QuantScheme, planned: boolean): Promise<Column> => {
      const layerMatmul = bytesOf(matmuls, schemeOf);
      const layerFloat = bytesOf(floats, () => scheme);
      const headRecipe = bytesOf(head, () => settings.lmHead.quant);
      const headSameScheme = scheme === settings.lmHead.quant ? headRecipe : bytesOf(head, () => scheme);
      const plan = planned ? await makePlan(family, config, arch, { ...settings, quant: scheme }) : null;
      if (plan) {
        // The planner's shard bytes are these very sums: check, so the table cannot drift from the plan.
        const planned = plan.shards.reduce((a, s) => a + s.weightBytes, 0) + (plan.lmHead.placement === 'separate' ? plan.lmHead.bytes : 0);
        if (planned !== layerMatmul + layerFloat + headRecipe) throw new Error(`${id} ${archId} ${label}: plan says ${planned} B, this count ${layerMatmul + layerFloat + headRecipe} B`);
      }
      const embeddingRow = hidden * 2;
      return {
        label, layerMatmul, layerFloat, headRecipe, headSameScheme, embeddingRow,
        totalRecipeHead: layerMatmul + layerFloat + headRecipe + embeddingRow,
        totalSameHead: layerMatmul + layerFloat + headSameScheme + embeddingRow,
        shards: plan ? plan.shards.length : null,
        contexts: plan ? plan.contexts : null,
      };
    };
    const columns = [
      await column('w8', 'w8', () => 'w8', true),
      await column('w4', 'w4', () => 'w4', true),
      ...(map ? [await column('w4 + map', 'w4', (t) => map.get(t.name) ?? 'w4', false)] : []),
    ];
    const [w8, w4, mapped] = columns;
    rows.push({
      recipe: id, arch: archId, lmHeadScheme: settings.lmHead.quant, columns,
      ratios: {
        w4OverW8_recipeHead: w4.totalRecipeHead / w8.totalRecipeHead,
        w4OverW8_sameSchemeHead: w4.totalSameHead! / w8.totalSameHead!,
        w4OverW8_layerMatmuls: w4.layerMatmul / w8.layerMatmul,
        ...(mapped ? { mapOverW8_recipeHead: mapped.totalRecipeHead / w8.totalRecipeHead, mapOverW8_sameSchemeHead: mapped.totalSameHead! / w8.totalSameHead! } : {}),
      },
    });
  }
}

if (arg.markdown) {
  const mb = (b: number | null) => (b === null ? '–' : (b / 1e6).toFixed(1));
  const out = ['| recipe | arch | scheme | layer matmuls MB | layer floats MB | head MB (recipe lm-head) | step MB (recipe lm-head) | step MB (lm-head in scheme) | shards | contexts |', '|---|---|---|---|---|---|---|---|---|---|'];
  for (const r of rows) {
    for (const c of r.columns) out.push(`| ${r.recipe} | ${r.arch} | ${c.label} | ${mb(c.layerMatmul)} | ${mb(c.layerFloat)} | ${mb(c.headRecipe)} (${r.lmHeadScheme}) | ${mb(c.totalRecipeHead)} | ${mb(c.totalSameHead)} | ${c.shards ?? '–'} | ${c.contexts ?? '–'} |`);
    out.push(`| | | **W4/W8** | ${r.ratios.w4OverW8_layerMatmuls.toFixed(3)} | | | **${r.ratios.w4OverW8_recipeHead.toFixed(3)}** | **${r.ratios.w4OverW8_sameSchemeHead.toFixed(3)}** | | |`);
    if (r.ratios.mapOverW8_recipeHead !== undefined) out.push(`| | | **(w4 + map)/W8** | | | | **${r.ratios.mapOverW8_recipeHead.toFixed(3)}** | **${r.ratios.mapOverW8_sameSchemeHead.toFixed(3)}** | | |`);
  }
  process.stdout.write(out.join('\n') + '\n');
} else {
  process.stdout.write(JSON.stringify({ benchmark: 'decode weight bytes per token, from storedBytes / makePlan', rows, date: new Date().toISOString() }, null, 2) + '\n');
}
