// Bytes one decode step moves, per recipe, arch, position and layout: the weights from the planner's
// own accounting (quant/bytes.ts over families/tensors.ts modelTensors, checked against makePlan under
// the recipe's settings), and everything else from the family's own graph interfaces and bindings
// (src/bundle/decode-traffic.ts): KV caches and recurrent state read and written, host-table rows (the
// embedding row, Gemma's per-layer-embedding rows, PhiMoE's two selected experts' int8 rows and
// scales per layer), masks, and the other graph inputs and outputs (residual hand-offs, positions,
// routing weights, logits). No checkpoint, no timing: decode on the NPU is bound by these bytes over
// the memory bandwidth.
//
//   node --import tsx bench/decode-bytes.ts [--recipes qwen3-4b,…] [--archs v79,v81]
//       [--positions 128,512,2048,max] [--map precisions.json] [--markdown | --json]
//
// Layouts (one row each per position):
// - hand-made: the hand-made bundles' documented layout counted conservatively as its weights alone
//   (W8 layers in the QDQ form, one float32 scale a row; the lm-head fp16, or W8 where the hand-made
//   bundle documents an int8 one: Qwen3-VL), no state, no host rows, no I/O: a lower bound on its bytes.
// - forge-before: forge's layout as built today: the recipe's settings (W8 layers, its lm-head), caches
//   and recurrent states crossing the graph boundary as float32, caches whole (maxContext slots, or the
//   ring's window) every step, whatever the position.
// - forge-w4-f16-projection: a PROJECTION, not a build: W4 layers and a W4 lm-head (planned), caches and
//   states crossing the boundary as f16, caches and masks read only as far as filled. f16 state I/O and
//   filled-only cache reads do not exist yet (the later steps of issue 34); other I/O as built.
// - forge-before (w4 + map), with --map FILE (a JSON object {tensorName: 'w4' | 'w8' | 'fp16'}, e.g. a
//   `quant: 'auto'` build's promotions): the layer matmuls in the map's scheme where it names them and
//   W4 elsewhere (planned as quant 'auto' with that map), the recipe's lm-head, I/O as built.
// Position p: p tokens already cached when the step runs (a ring reads min(p, window) in the
// projection); `max` is the recipe's maxContext, the cache full.
//
// Default output: a table (MB = 10^6 bytes); --markdown: the same as a Markdown table; --json: rows
// {recipe, arch, position, layout, bytesPerToken, parts, ratioToHandMade, hostRowsByTable, contexts}.
import { readFileSync } from 'node:fs';
import { getFamily } from '../src/families/index.js';
import { modelTensors } from '../src/families/tensors.js';
import type { TensorSpec } from '../src/families/types.js';
import { storedBytes } from '../src/quant/bytes.js';
import type { PrecisionMap } from '../src/quant/precision.js';
import { archSettings, loadRecipe } from '../src/recipe/load.js';
import type { ArchSettings, QuantScheme } from '../src/recipe/schema.js';
import { benchArgs } from './util.js';
import { AS_BUILT, emptyIo, type StateForm } from '../src/bundle/decode-traffic.js';
import { qdqW8Bytes } from './hand-made.js';
import { decodeSteps, partsSum as sum, type DecodeParts as Parts } from '../src/bundle/decode-bytes.js';

const { values: arg } = benchArgs({
  recipes: { type: 'string', default: 'qwen3-4b,qwen3.5-4b,gemma-4-e4b,phi-tiny-moe,qwen3-vl-2b' },
  archs: { type: 'string', default: 'v79,v81' },
  positions: { type: 'string', default: '128,512,2048,max' },
  map: { type: 'string', default: '' },
  markdown: { type: 'boolean' },
  json: { type: 'boolean' },
});

/**
 * The hand-made bundles' lm-head, where it is documented as other than fp16: Qwen3-VL's int8 lm-head
 * in the graph (shared/REFERENCE.md, "Hand-made v79 bundle").
 */
const HAND_MADE_LM_HEAD: Record<string, 'w8' | 'fp16'> = { 'qwen3-vl-2b': 'w8' };

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

interface Row {
  recipe: string;
  arch: string;
  position: number;
  layout: string;
  bytesPerToken: number;
  parts: Parts;
  ratioToHandMade: number;
  hostRowsByTable: Record<string, number>;
  /** Contexts of the plan the layout's graphs come from (null: the hand-made weights-only count). */
  contexts: number | null;
}


function positionsFor(maxContext: number): number[] {
  const ps = arg.positions.split(',').map((s) => (s.trim() === 'max' ? maxContext : Number(s)));
  for (const p of ps) if (!Number.isInteger(p) || p < 0) throw new Error(`--positions: '${arg.positions}' holds something other than whole numbers and 'max'`);
  return [...new Set(ps.filter((p) => p <= maxContext))].sort((a, b) => a - b);
}

const map = readMap(arg.map);
const precisionMap: PrecisionMap | undefined = map ? Object.fromEntries([...map].map(([k, v]) => [k, { scheme: v, why: `--map ${arg.map}` }])) : undefined;
const rows: Row[] = [];

for (const id of arg.recipes.split(',')) {
  const { recipe, file } = loadRecipe(id);
  if (!recipe.config) throw new Error(`${file}: no recorded config`);
  const family = getFamily(recipe.family);
  const config = family.parseConfig(recipe.config, `${file} (config)`);
  const tensors = await modelTensors(family, config);
  const layer = tensors.layers.flat();
  const head: TensorSpec[] = [...tensors.final, ...tensors.lmHead];
  if (map) {
    const known = new Set(layer.map((t) => t.name));
    const unknown = [...map.keys()].filter((k) => !known.has(k));
    if (unknown.length) process.stderr.write(`[decode-bytes] ${id}: ${unknown.length} map entries name no layer tensor of this model (ignored), e.g. ${unknown.slice(0, 3).join(', ')}\n`);
  }

  for (const archId of arg.archs.split(',')) {
    const { arch, settings } = archSettings(recipe, archId, file);

    /** A forge layout: the plan under `s` gives the weights (checked against its own bytes) and the graphs (src/bundle/decode-bytes.ts). */
    const forge = (s: ArchSettings, form: StateForm, precision?: PrecisionMap) => decodeSteps(family, config, arch, s, form, precision);

    const handLmHead: QuantScheme = HAND_MADE_LM_HEAD[id] ?? 'fp16';
    const handMade: Parts = {
      layerWeights: layer.reduce((a, t) => a + qdqW8Bytes(t), 0),
      lmHeadWeights: head.reduce((a, t) => a + (handLmHead === 'w8' ? qdqW8Bytes(t) : storedBytes(t, handLmHead)), 0),
      ...emptyIo(),
    };
    // Later steps of issue 34 add their layouts here (f16 state I/O, caches read as far as filled) once built.
    const layouts: Array<[string, (p: number) => { parts: Parts; hostRowsByTable: Record<string, number>; contexts: number | null }]> = [
      ['hand-made', () => ({ parts: handMade, hostRowsByTable: {}, contexts: null })],
      ['forge-before', await forge(settings, AS_BUILT)],
    ];
    if (precisionMap) layouts.push(['forge-before (w4 + map)', await forge({ ...settings, quant: 'auto' }, AS_BUILT, precisionMap)]);
    layouts.push(['forge-w4-f16-projection', await forge({ ...settings, quant: 'w4', lmHead: { ...settings.lmHead, quant: 'w4' } }, { bytes: 2, cacheRead: 'filled' })]);
    for (const position of positionsFor(settings.maxContext)) {
      const base = sum(handMade);
      for (const [layout, at] of layouts) {
        const { parts, hostRowsByTable, contexts } = at(position);
        const bytesPerToken = sum(parts);
        rows.push({ recipe: id, arch: archId, position, layout, bytesPerToken, parts, ratioToHandMade: bytesPerToken / base, hostRowsByTable, contexts });
      }
    }
  }
}

// ---- output ---------------------------------------------------------------------------------------

if (arg.json) {
  process.stdout.write(JSON.stringify({ benchmark: 'bytes one decode step moves, from the planner and the graph interfaces', date: new Date().toISOString(), rows }, null, 2) + '\n');
} else {
  // Archs whose rows agree in every figure share one line ("v79, v81").
  const byRecipe = new Map<string, Map<string, Row[]>>();
  for (const r of rows) {
    const recipeArchs = byRecipe.get(r.recipe) ?? new Map<string, Row[]>();
    byRecipe.set(r.recipe, recipeArchs);
    recipeArchs.set(r.arch, [...(recipeArchs.get(r.arch) ?? []), r]);
  }
  const shown: Array<Row & { archs: string }> = [];
  for (const recipeArchs of byRecipe.values()) {
    const groups = new Map<string, { archs: string[]; rows: Row[] }>();
    for (const [a, rs] of recipeArchs) {
      const key = JSON.stringify(rs.map((r) => [r.position, r.layout, r.parts]));
      const g = groups.get(key) ?? { archs: [], rows: rs };
      g.archs.push(a);
      groups.set(key, g);
    }
    for (const g of groups.values()) for (const r of g.rows) shown.push({ ...r, archs: g.archs.join(', ') });
  }
  const mb = (b: number) => (b / 1e6).toLocaleString('en-US', { minimumFractionDigits: 1, maximumFractionDigits: 1 });
  const kb = (b: number) => (b / 1e3).toLocaleString('en-US', { maximumFractionDigits: 0 });
  const header = ['recipe', 'arch', 'position', 'layout', 'MB/token', '× hand-made', 'weights MB', 'KV read MB', 'KV write kB', 'state r+w MB', 'host rows MB', 'masks + other I/O kB'];
  const cells = shown.map((r) => [
    r.recipe, r.archs, String(r.position), r.layout, mb(r.bytesPerToken), r.ratioToHandMade.toFixed(3),
    mb(r.parts.layerWeights + r.parts.lmHeadWeights), mb(r.parts.kvRead), kb(r.parts.kvWrite), mb(r.parts.stateRead + r.parts.stateWrite),
    (r.parts.hostRows / 1e6).toFixed(3), kb(r.parts.masks + r.parts.graphIn + r.parts.graphOut),
  ]);
  if (arg.markdown) {
    const line = (c: string[]) => `| ${c.join(' | ')} |`;
    process.stdout.write([line(header), line(header.map((_, i) => (i < 4 ? '---' : '---:'))), ...cells.map(line)].join('\n') + '\n');
  } else {
    const width = header.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i].length)));
    const line = (c: string[]) => c.map((x, i) => (i < 4 ? x.padEnd(width[i]) : x.padStart(width[i]))).join('  ');
    const out = [line(header), width.map((w) => '-'.repeat(w)).join('  ')];
    let last = '';
    for (const [i, c] of cells.entries()) {
      const group = `${shown[i].recipe}|${shown[i].archs}|${shown[i].position}`;
      if (last && group !== last) out.push('');
      last = group;
      out.push(line(c));
    }
    out.push('', 'MB = 10^6 B. forge-w4-f16-projection is a projection (f16 state I/O and filled-only cache reads are not built yet); hand-made counts its weights alone.');
    process.stdout.write(out.join('\n') + '\n');
  }
}
