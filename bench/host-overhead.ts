// Host overhead per decoded token of the C++ runtime (qhx_generate): everything a decode step costs
// but graph execution — embedding lookup from the f16 host table, position/mask updates, KV rows
// written into the caches, recurrent-state buffer flips, the argmax over the vocabulary. Measured
// for Qwen3-4B-shaped and Qwen3.5-4B-shaped bundles (state sizes from the recipes' recorded configs,
// v81 plans and maxContext); target <= 1 ms/token.
//
// The bundles are synthetic: each graph has exactly the real graph's inputs and outputs (they are
// taken from the family module's own component builders, run on a throwaway builder) and the
// manifest is made by the real assembler (assembleBundle → family.bindings → kvDecoderBindings), but
// the compute is trivial (identities, a slice for the KV rows, a tile for the logits), so the graph
// Run calls are short and the host work is what remains. The runtime itself reports
// host_overhead_ms_per_token (decode step wall time minus time inside Run calls).
//
// Baseline, same run: copying each shape's whole state once (Float32Array.set per state buffer), the
// per-token cost a runtime that copied state instead of binding it in place would pay.
//
// Also start-up (load_ms): the default load (big files size-checked) against --verify (every file
// hashed), in the same run.
//
//   node --import tsx bench/host-overhead.ts [--keep] [--tokens 64] [--repeat 3] [--copy-repeat 7]
//                                            [--threads 1] [--recipes qwen3-4b,qwen3.5-4b]
import { spawnSync } from 'node:child_process';
import { benchArgs, median, positiveInt } from './util.js';
import { closeSync, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { cpus, release, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { assembleBundle, MANIFEST } from '../src/bundle/assemble.js';
import type { Manifest } from '../src/bundle/manifest.js';
import { GRAPHS_JSON, graphName, layoutOf, type ExportManifest, type GraphEntry } from '../src/families/export-stage.js';
import { getFamily } from '../src/families/index.js';
import type { GraphBindings } from '../src/families/types.js';
import { GraphBuilder } from '../src/onnx/builder.js';
import { writeModel } from '../src/onnx/writer.js';
import { planRecipe } from '../src/plan/for-recipe.js';
import type { ShardPlan } from '../src/plan/shards.js';
import type { WeightStore } from '../src/quant/weights.js';
import { archSettings, loadRecipe } from '../src/recipe/load.js';
import { ensureNative } from '../src/toolchain/native.js';

// ---- arguments -----------------------------------------------------------------------------

const { values: arg, num } = benchArgs({
  keep: { type: 'boolean' }, tokens: { type: 'string', default: '64' }, repeat: { type: 'string', default: '3' },
  'copy-repeat': { type: 'string', default: '7' }, threads: { type: 'string', default: '1' },
  recipes: { type: 'string', default: 'qwen3-4b,qwen3.5-4b' },
});
const keep = arg.keep === true;
const newTokens = num('tokens', positiveInt);
const repeat = num('repeat', positiveInt);
const copyRepeat = num('copy-repeat', positiveInt);
// One intra-op thread by default: on the device the graphs run on the NPU, and ORT's spinning CPU
// worker threads would otherwise compete with the host thread on this 2-core box, inflating exactly
// the time between Run calls that this bench measures.
const ortThreads = String(num('threads', (n) => Number.isInteger(n) && n >= 0));
const recipeIds = arg.recipes.split(',').filter(Boolean);
const ARCH = 'v81';
const TARGET_MS = 1;
// A few ordinary token ids; generated ids follow from the embedding rows (see trivialGraph).
const PROMPT = [785, 6722, 315, 9625, 374];

const log = (m: string) => process.stderr.write(`[host-overhead] ${m}\n`);
const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

// ---- the real graph interface ----------------------------------------------------------------

/**
 * A weight store that stores nothing: the family's graph code runs as in an export, but a linear
 * is an Identity and a small tensor a zero initializer. Only the interface it returns (input and
 * output names, dtypes, shapes) is kept; the graph itself is thrown away.
 */
function stubStore(): WeightStore {
  const stub = {
    linear: async (g: GraphBuilder, x: string) => g.op('Identity', [x]),
    small: async (g: GraphBuilder, name: string, shape: number[]) =>
      (g.typeOf(name) !== undefined ? name : g.initializer(name, new Float32Array(numel(shape)), shape)),
  };
  return stub as unknown as WeightStore;
}

// ---- the trivial graph -----------------------------------------------------------------------

/**
 * A graph with the bindings' inputs and outputs and next to no compute: hidden_out = hidden_in,
 * each new KV row block a slice of hidden_in, each new recurrent state an Identity of the old one,
 * logits = hidden_in tiled out to the vocab (so the next token is the argmax of the embedding row of
 * the last one: generated ids vary, and the host's argmax scans the real vocab size).
 */
function trivialGraph(name: string, b: GraphBindings, vocab: number): GraphBuilder {
  const g = new GraphBuilder(name);
  for (const i of b.inputs) g.input(i.name, i.dtype, i.shape);
  const residual = b.inputs.find((i) => i.bind === 'residual');
  if (!residual) throw new Error(`${name}: no residual input`);
  const [, n, H] = residual.shape;
  const tiled = (width: number) => {
    const x = Math.ceil(width / H) > 1 ? g.op('Tile', [residual.name, g.constInt64([1, 1, Math.ceil(width / H)])]) : residual.name;
    return g.op('Slice', [x, g.constInt64([0]), g.constInt64([width]), g.constInt64([2])]);
  };
  for (const o of b.outputs) {
    let value: string;
    switch (o.bind) {
      case 'residual':
        value = residual.name;
        break;
      case 'logits':
        value = tiled(vocab);
        break;
      case 'state-rows': {
        // [1, kv, n, d] rows on axis 2: n rows of kv·d values, heads moved in front of the rows.
        if (o.shape.length !== 4 || o.axis !== 2) throw new Error(`${name}: ${o.name} rows of shape [${o.shape}] on axis ${o.axis} (expected [1, kv, n, d] on axis 2)`);
        const [, kv, , d] = o.shape;
        const rows = g.op('Reshape', [tiled(kv * d), g.constInt64([1, n, kv, d])]);
        value = g.op('Transpose', [rows], { perm: [0, 2, 1, 3] });
        break;
      }
      case 'state-replace': {
        const from = b.inputs.find((i) => i.bind === 'state' && i.state === o.state);
        if (!from) throw new Error(`${name}: ${o.name} replaces state ${o.state}, which no input reads`);
        value = from.name;
        break;
      }
      default:
        throw new Error(`${name}: ${o.name}: the decoder bench binds no ${o.bind} output`);
    }
    g.output(value, o.name, { shape: o.shape, dtype: o.dtype });
  }
  return g;
}

// ---- the synthetic bundle --------------------------------------------------------------------

/**
 * The f16 host table [vocab, hidden]: values ±[0.5, 1) from xorshift32. Only rows the prompt and the
 * generated ids touch are ever read, so one 64 MiB random block is written over and over.
 */
function writeEmbedding(file: string, vocab: number, hidden: number): void {
  const block = new Uint16Array(32 << 20);
  let s = 0x9e3779b9;
  for (let i = 0; i < block.length; i++) {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    block[i] = (s & 0x83ff) | 0x3800; // sign + 10 mantissa bits, exponent of 0.5
  }
  const bytes = new Uint8Array(block.buffer);
  const total = vocab * hidden * 2;
  const fd = openSync(file, 'w');
  try {
    for (let off = 0; off < total; ) off += writeSync(fd, bytes, 0, Math.min(bytes.length, total - off), off);
  } finally {
    closeSync(fd);
  }
}

interface Bundle {
  manifestPath: string;
  root: string;
  manifest: Manifest;
  plan: ShardPlan;
  maxContext: number;
}

async function makeBundle(recipeId: string, dir: string): Promise<Bundle> {
  const { recipe, file } = loadRecipe(recipeId);
  if (!recipe.config) throw new Error(`${file}: no recorded config, cannot shape a synthetic bundle`);
  const { arch, settings } = archSettings(recipe, ARCH, file);
  const family = getFamily(recipe.family);
  const config = family.parseConfig(recipe.config, `${file} (config)`);
  const plan = await planRecipe(recipeId, ARCH);
  const { maxContext, prefillLength } = settings;
  // The family's first host table is the token embedding the host looks rows up in.
  const [vocab, hidden] = family.hostTables(config)[0].shape;
  const exportDir = join(dir, 'export');
  const ckptDir = join(dir, 'checkpoint');
  const root = join(dir, 'bundle');
  for (const d of [exportDir, ckptDir]) mkdirSync(d, { recursive: true });

  // The same components and graphs runExport writes (the plan's, minus what it dropped), each graph
  // with the real interface its family builder gives (run against the stub store).
  const dropped = new Set((plan.dropped ?? []).map((d) => d.graph));
  const contexts: ExportManifest['contexts'] = [];
  for (const c of family.components(config, layoutOf(plan, { prefillLength, maxContext }))) {
    const entries: GraphEntry[] = [];
    for (const v of c.variants) {
      const name = graphName(c.name, v.name);
      if (dropped.has(name)) continue;
      // Scheme labels only: the stub store ignores them.
      const iface = await v.build(new GraphBuilder(name), { store: stubStore(), scheme: 'w8', lmHeadScheme: 'fp16' });
      const full: GraphEntry = { name, file: `${name}.onnx`, component: c.name, kind: c.kind, variant: v.name, n: v.n, scheme: c.weights === 'lmHead' ? 'fp16' : 'w8', ...c.entry, ...iface };
      writeModel(trivialGraph(name, family.bindings(config, full, maxContext), vocab), join(exportDir, full.file), { externalThreshold: Infinity });
      entries.push(full);
    }
    // No weights: an empty data file keeps the context's files list what the assembler expects.
    writeFileSync(join(exportDir, `${c.name}.data`), '');
    contexts.push({ name: c.name, data: `${c.name}.data`, dataBytes: 0, graphs: entries });
  }

  log(`${recipeId}: writing the f16 embedding table [${vocab}, ${hidden}] (${((vocab * hidden * 2) / 1e9).toFixed(2)} GB)`);
  writeEmbedding(join(exportDir, 'embedding.f16.bin'), vocab, hidden);
  const exp: ExportManifest = {
    family: recipe.family, scheme: settings.quant, lmHeadScheme: settings.lmHead.quant, w8Form: 'matmulnbits', maxContext, contexts,
    embedding: { file: 'embedding.f16.bin', dtype: 'float16', shape: [vocab, hidden] },
  };
  writeFileSync(join(exportDir, GRAPHS_JSON), JSON.stringify(exp, null, 2));
  // The assembler reads config.json and tokenizer.json from the checkpoint. The tokenizer is a stub
  // the runtime cannot load: it then runs on token ids (--prompt-ids) and prints no text.
  writeFileSync(join(ckptDir, 'config.json'), JSON.stringify(recipe.config));
  writeFileSync(join(ckptDir, 'tokenizer.json'), '{}');
  const manifest = await assembleBundle({
    recipe: { id: recipe.id, family: recipe.family }, arch, graphsDir: exportDir, embeddingDir: exportDir, checkpointDir: ckptDir, maxNewTokens: newTokens,
  }, root);
  return { manifestPath: join(root, MANIFEST), root, manifest, plan, maxContext };
}

// ---- measuring -------------------------------------------------------------------------------

interface Timings {
  load_ms: number;
  prefill_ms: number;
  decode_ms_per_token: number;
  host_overhead_ms_per_token: number;
  decode_steps: number;
}

function runGenerate(qhx: string, b: Bundle, verify = false): Timings {
  const args = [b.manifestPath, 'cpu', '-', b.root, String(newTokens), '--prompt-ids', PROMPT.join(','), '--json', '--ignore-eos', ...(verify ? ['--verify'] : [])];
  const r = spawnSync(qhx, args, { encoding: 'utf8', maxBuffer: 64 << 20, env: { ...process.env, FORGE_ORT_THREADS: ortThreads } });
  if (r.status !== 0) throw new Error(`qhx_generate ${args.join(' ')} exited ${r.status}${r.signal ? ` (${r.signal})` : ''}: ${r.stderr.trim()}`);
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { timings: Timings; generated_ids: number[] };
  if (out.generated_ids.length !== newTokens) throw new Error(`qhx_generate gave ${out.generated_ids.length} tokens, not ${newTokens}`);
  return out.timings;
}

/** Median ms to copy every state buffer of the manifest once (what a copy-in/copy-out runtime pays per token). */
function timeStateCopy(state: Manifest['state']): number {
  const src = state.map((s) => new Float32Array(numel(s.shape)).fill(1));
  const dst = state.map((s) => new Float32Array(numel(s.shape)));
  const copyAll = () => {
    for (let i = 0; i < src.length; i++) dst[i].set(src[i]);
  };
  copyAll(); // first touch of dst's pages is not a per-token cost
  const ms: number[] = [];
  for (let r = 0; r < copyRepeat; r++) {
    const t0 = process.hrtime.bigint();
    copyAll();
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return median(ms);
}

// ---- main ------------------------------------------------------------------------------------

const build = await ensureNative();
log(`runtime: ${build.qhxGenerate}`);
const work = mkdtempSync(join(tmpdir(), 'forge-host-overhead-'));
const shapes: Record<string, unknown> = {};
try {
  for (const id of recipeIds) {
    const dir = join(work, id);
    const b = await makeBundle(id, dir);
    const bytesOf = (kind: 'kv-cache' | 'recurrent') => b.manifest.state.filter((s) => s.kind === kind).reduce((a, s) => a + numel(s.shape) * 4, 0);
    const kvBytes = bytesOf('kv-cache');
    const recurrentBytes = bytesOf('recurrent');
    const runs: Timings[] = [];
    for (let r = 0; r < repeat; r++) {
      runs.push(runGenerate(build.qhxGenerate, b));
      log(`${id}: run ${r + 1}/${repeat}: ${JSON.stringify(runs[r])}`);
    }
    const host = median(runs.map((t) => t.host_overhead_ms_per_token));
    const decode = median(runs.map((t) => t.decode_ms_per_token));
    const graphRun = median(runs.map((t) => t.decode_ms_per_token - t.host_overhead_ms_per_token));
    const stateCopyMs = timeStateCopy(b.manifest.state);
    // Start-up: the default load checks the big files' sizes; --verify also hashes them (here the
    // f16 embedding table at its real size; the synthetic graphs' data files are small).
    const verified = Array.from({ length: repeat }, () => runGenerate(build.qhxGenerate, b, true).load_ms);
    const loadMs = median(runs.map((t) => t.load_ms));
    const loadVerifyMs = median(verified);
    const embeddingBytes = b.manifest.model.vocab * b.manifest.model.hidden * 2;
    shapes[id] = {
      layers: b.manifest.model.layers,
      hidden: b.manifest.model.hidden,
      vocab: b.manifest.model.vocab,
      maxContext: b.maxContext,
      shards: b.plan.shards.map((s) => [s.first, s.last]),
      lmHead: b.plan.lmHead.placement,
      hostOp: b.manifest.hostOp,
      stateBuffers: b.manifest.state.length,
      stateBytes: kvBytes + recurrentBytes,
      kvBytes,
      recurrentBytes,
      hostOverheadMsPerToken: host,
      // The box is shared: the spread over runs says how much of a single figure is noise.
      hostOverheadMsPerTokenRange: [Math.min(...runs.map((t) => t.host_overhead_ms_per_token)), Math.max(...runs.map((t) => t.host_overhead_ms_per_token))],
      decodeMsPerToken: decode,
      graphRunMsPerToken: graphRun,
      stateCopyMs,
      ratioHostOverheadOverStateCopy: host / stateCopyMs,
      ratioHostOverheadOverTarget: host / TARGET_MS,
      withinTarget: host <= TARGET_MS,
      startup: {
        loadMs, loadVerifyMs, ratioVerifyOverDefault: loadVerifyMs / loadMs, embeddingBytes,
        sha256MBPerS: embeddingBytes / 1e6 / ((loadVerifyMs - loadMs) / 1000),
      },
      runs,
    };
    if (!keep) rmSync(dir, { recursive: true, force: true });
  }
} finally {
  if (!keep) rmSync(work, { recursive: true, force: true });
  else log(`kept ${work}`);
}

const report = {
  bench: 'host-overhead',
  arch: ARCH,
  targetMsPerToken: TARGET_MS,
  prompt: PROMPT,
  newTokens,
  repeat,
  ortThreads: Number(ortThreads),
  shapes,
  notes: [
    `per shape: qhx_generate run ${repeat} times (${newTokens} new tokens, --ignore-eos, CPU EP); each timing is the median over runs of the runtime's own per-token figure`,
    'hostOverheadMsPerToken = decode step wall time minus time inside Run calls (native/src/decoder_generate.cpp); graphRunMsPerToken = the rest',
    `stateCopyMs = median of ${copyRepeat} Float32Array.set copies of every state buffer (KV caches + recurrent states, one copy each): the per-token cost of copying state instead of binding it in place`,
    'graphs: the real I/O (family component builders) with trivial compute; manifest: assembleBundle (family.bindings)',
    `startup: median load_ms (manifest checks + sessions) of the ${repeat} runs above (big files size-checked) vs ${repeat} runs with --verify (every file hashed); sha256MBPerS = embedding bytes / the difference`,
  ],
  machine: { cores: cpus().length, cpuModel: cpus()[0]?.model, memGB: +(totalmem() / 1e9).toFixed(1), node: process.version, kernel: release() },
  date: new Date().toISOString(),
};
process.stdout.write(JSON.stringify(report, null, 2) + '\n');
