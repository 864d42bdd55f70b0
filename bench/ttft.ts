// Time to first token: what a prompt costs with batched prefill against decoding over it.
//
// 1. From each real recipe's plan (no checkpoint, no timing), per arch and prompt length: the weight
//    bytes read and the graph executions until the first token, both ways. Decode on the NPU is bound
//    by the weights it reads, so the byte ratio is the headline. Counted: every shard's context
//    weights once per call (a prefill call of N tokens reads them once, a decode call once per
//    token); the lm-head once (both ways it runs only for the last prompt token); PhiMoE's experts
//    from their host tables: decode reads the two chosen experts of every layer per token, prefill at
//    most every expert of every layer per chunk (the upper bound: a chunk's tokens may choose fewer).
//    The embedding rows are the same both ways and left out. A recipe whose prefill graphs the
//    planner drops for an arch decodes over the prompt there (said in the row).
// 2. On the tiny twins, the runtime's measured wall time to first token on this machine's CPU
//    (qhx_generate, onnxruntime CPU), prefill and decode over the prompt, in the same run, on a prompt
//    of 2N + 3 tokens (two full chunks and a padded one).
//
//   node --import tsx bench/ttft.ts [--recipes qwen3-4b,qwen3.5-4b,gemma-4-e4b,phi-tiny-moe,qwen3-vl-2b]
//       [--archs v79,v81] [--lengths 128,512,2048] [--twins tiny-qwen3,tiny-qwen3.5,tiny-phimoe,tiny-gemma4 | --twins '']
//       [--repeat 3] [--json]
import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { assembleBundle, MANIFEST } from '../src/bundle/assemble.js';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { getFamily } from '../src/families/index.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import { cacheRoot } from '../src/paths.js';
import { planRecipe } from '../src/plan/for-recipe.js';
import type { ShardPlan } from '../src/plan/shards.js';
import { archSettings, loadRecipe } from '../src/recipe/load.js';
import { ensureNative } from '../src/toolchain/native.js';
import { benchArgs, median, positiveInt } from './util.js';

const { values: arg, num } = benchArgs({
  recipes: { type: 'string', default: 'qwen3-4b,qwen3.5-4b,gemma-4-e4b,phi-tiny-moe,qwen3-vl-2b' },
  archs: { type: 'string', default: 'v79,v81' },
  lengths: { type: 'string', default: '128,512,2048' },
  twins: { type: 'string', default: 'tiny-qwen3,tiny-qwen3.5,tiny-phimoe,tiny-gemma4' },
  repeat: { type: 'string', default: '3' },
  json: { type: 'boolean' },
});
const list = (s: string) => s.split(',').map((x) => x.trim()).filter(Boolean);
const lengths = list(arg.lengths).map((x) => {
  const n = Number(x);
  if (!positiveInt(n)) throw new Error(`--lengths: '${x}' is not a positive whole number`);
  return n;
});
const repeat = num('repeat', positiveInt);

interface PlanRow {
  recipe: string;
  arch: string;
  prefill: number;
  /** Why the bundle decodes over the prompt (no prefill length, or the planner dropped the graphs). */
  decodesOverPrompt?: string;
  length: number;
  prefillBytes: number;
  decodeBytes: number;
  prefillCalls: number;
  decodeCalls: number;
  /** prefillBytes / decodeBytes. */
  ratio: number;
}

/** Bytes one pass over the layers reads, and for PhiMoE one expert of one layer (from its host tables). */
function weights(plan: ShardPlan, experts: number) {
  const layers = plan.shards.reduce((a, s) => a + s.weightBytes, 0);
  const expertTables = plan.hostTables.filter((t) => t.name.startsWith('experts.')).reduce((a, t) => a + t.bytes, 0);
  return { layers, lmHead: plan.lmHead.bytes, expert: experts ? expertTables / (plan.layers * experts) : 0, graphsPerToken: plan.shards.length };
}

async function planRows(): Promise<PlanRow[]> {
  const rows: PlanRow[] = [];
  for (const id of list(arg.recipes)) {
    const { recipe, file } = loadRecipe(id);
    if (!recipe.config) throw new Error(`${file}: no recorded config (bench/ttft.ts plans from it)`);
    const family = getFamily(recipe.family);
    const config = family.parseConfig(recipe.config, file) as { experts?: number };
    const experts = config.experts ?? 0;
    for (const archId of list(arg.archs)) {
      const plan = await planRecipe(id, archId);
      const { settings } = archSettings(recipe, archId, file);
      const dropped = (plan.dropped ?? []).filter((d) => /prefill/.test(d.graph));
      const n = settings.prefillLength;
      const why = !n ? 'the recipe sets no prefill length' : dropped.length ? `the planner drops its prefill graphs for ${archId}: ${dropped[0].why}` : undefined;
      const w = weights(plan, experts);
      // PhiMoE: per layer an attention+router call, then its experts (decode: one call with the two
      // chosen; prefill: one call per expert the chunk chose, at most all of them).
      const perToken = experts ? { bytes: w.layers + plan.layers * 2 * w.expert, calls: plan.layers * 2 } : { bytes: w.layers, calls: w.graphsPerToken };
      const perChunk = experts ? { bytes: w.layers + plan.layers * experts * w.expert, calls: plan.layers * (1 + experts) } : perToken;
      for (const length of lengths) {
        const decodeBytes = length * perToken.bytes + w.lmHead;
        const chunks = Math.ceil(length / (n || 1));
        const prefillBytes = why ? decodeBytes : chunks * perChunk.bytes + w.lmHead;
        const decodeCalls = length * perToken.calls + 1;
        rows.push({
          recipe: id, arch: archId, prefill: why ? 0 : n, ...(why ? { decodesOverPrompt: why } : {}), length,
          prefillBytes, decodeBytes, prefillCalls: why ? decodeCalls : chunks * perChunk.calls + 1, decodeCalls, ratio: prefillBytes / decodeBytes,
        });
      }
    }
  }
  return rows;
}

interface TwinRow {
  recipe: string;
  prefill: number;
  promptTokens: number;
  /** Median over --repeat runs, ms from the prompt's first call to the first token's argmax. */
  prefillMs: number;
  decodeOverPromptMs: number;
  speedup: number;
  sameTokens: boolean;
}

async function twinRows(): Promise<TwinRow[]> {
  const twins = list(arg.twins);
  if (!twins.length) return [];
  const native = await ensureNative();
  const rows: TwinRow[] = [];
  for (const id of twins) {
    const record = await build({ recipe: id, arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-ttft-build-')), progress: silentProgress, until: 'quantize' });
    if (!record.ok) throw new Error(`${id}: ${record.error}`);
    const entry = (stage: string) => join(cacheRoot(), stage, record.stages.find((s) => s.name === stage)!.key!);
    const { recipe } = loadRecipe(id);
    const { arch, settings } = archSettings(recipe, 'v81');
    const n = settings.prefillLength;
    if (!n) throw new Error(`${id}: the recipe sets no prefill length, nothing to compare`);
    const dir = mkdtempSync(join(tmpdir(), 'forge-ttft-bundle-'));
    const manifest = await assembleBundle({ recipe, arch, graphsDir: entry('quantize'), embeddingDir: entry('quantize'), checkpointDir: readCheckpointRef(entry('fetch')).absDir, maxNewTokens: 4 }, dir);
    // Text ids only: an image or audio token would ask for an encoder output the prompt does not bring.
    const media = new Set(Object.entries(manifest.hostOpParams ?? {}).filter(([k]) => /^(image|audio)_token_id$/.test(k)).map(([, v]) => v));
    const prompt = Array.from({ length: 2 * n + 3 }, (_, i) => (i * 37 + 11) % manifest.model.vocab).map((id) => (media.has(id) ? 1 : id));
    const run = (prefill: boolean) => {
      const args = [join(dir, MANIFEST), 'cpu', '-', dir, '1', '--prompt-ids', prompt.join(','), '--json', '--ignore-eos', ...(prefill ? [] : ['--no-prefill'])];
      const r = spawnSync(native.qhxGenerate, args, { encoding: 'utf8', maxBuffer: 64 << 20 });
      if (r.status !== 0) throw new Error(`qhx_generate ${args.join(' ')} exited ${r.status}: ${r.stderr.trim()}`);
      const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { timings: { prefill_ms: number }; generated_ids: number[]; prefill: boolean };
      // The runtime says which way it took the prompt: a bundle it would not prefill measures nothing here.
      if (out.prefill !== prefill) throw new Error(`${id}: qhx_generate ${prefill ? 'did not prefill' : 'prefilled'} the prompt (${args.join(' ')})`);
      return out;
    };
    const a = Array.from({ length: repeat }, () => run(true));
    const b = Array.from({ length: repeat }, () => run(false));
    const prefillMs = median(a.map((x) => x.timings.prefill_ms));
    const decodeOverPromptMs = median(b.map((x) => x.timings.prefill_ms));
    rows.push({ recipe: id, prefill: n, promptTokens: prompt.length, prefillMs, decodeOverPromptMs, speedup: decodeOverPromptMs / prefillMs, sameTokens: a[0].generated_ids.join() === b[0].generated_ids.join() });
  }
  return rows;
}

const plans = await planRows();
const twins = await twinRows();
if (arg.json) {
  console.log(JSON.stringify({ plans, twins }));
} else {
  const gb = (b: number) => (b / 1e9).toFixed(2);
  console.log('Weights read until the first token (GB), from each plan; prefill / decode over the prompt:');
  console.log(`${'recipe'.padEnd(14)} ${'arch'.padEnd(4)} ${'N'.padStart(4)} ${'prompt'.padStart(6)} ${'prefill GB'.padStart(10)} ${'decode GB'.padStart(10)} ${'calls'.padStart(12)}  ratio`);
  for (const r of plans) {
    console.log(`${r.recipe.padEnd(14)} ${r.arch.padEnd(4)} ${String(r.prefill).padStart(4)} ${String(r.length).padStart(6)} ${gb(r.prefillBytes).padStart(10)} ${gb(r.decodeBytes).padStart(10)} ${`${r.prefillCalls}/${r.decodeCalls}`.padStart(12)}  ${r.ratio < 1 ? `1/${(1 / r.ratio).toFixed(1)}` : '1'}${r.decodesOverPrompt ? `  (decodes over the prompt: ${r.decodesOverPrompt.split(':')[0]})` : ''}`);
  }
  if (twins.length) {
    console.log('\nTwins on this machine\'s CPU (qhx_generate, onnxruntime CPU), time to first token, median of', repeat, 'runs:');
    for (const t of twins) console.log(`${t.recipe.padEnd(14)} N ${t.prefill}, prompt ${t.promptTokens} tokens: prefill ${t.prefillMs.toFixed(1)} ms, decode over the prompt ${t.decodeOverPromptMs.toFixed(1)} ms: ${t.speedup.toFixed(2)}×${t.sameTokens ? '' : '  (first tokens differ!)'}`);
  }
}
