// Host overhead per decoded token of the C++ runtime (qhx_generate): everything a decode step costs
// but graph execution — embedding lookup from the f16 host table, position/mask updates, KV rows
// written into the caches, recurrent-state buffer flips, the argmax over the vocabulary; for PhiMoE
// also the host's top-2 routing per layer and the rebinding of the experts graph's inputs to the
// chosen experts' rows of the mapped expert tables. Measured for Qwen3-4B-, Qwen3.5-4B- and
// Phi-tiny-MoE-shaped bundles (state sizes from the recorded configs, v81 plans and maxContext);
// target <= 1 ms/token. A shape is a recipe's recorded config and arch settings (bench/shapes.ts;
// phi-tiny-moe's hub revision is unpinned, which planning does not need).
//
// The bundles are synthetic: each graph has exactly the real graph's inputs and outputs (they are
// taken from the family module's own component builders, run on a throwaway builder) and the
// manifest is made by the real assembler (assembleBundle → family.bindings), but the compute is
// trivial (identities, a slice for the KV rows and router logits, a tile for the logits), so the
// graph Run calls are short and the host work is what remains. The runtime itself reports
// host_overhead_ms_per_token (decode step wall time minus time inside Run calls).
//
// Baseline, same run: copying each shape's whole state once (Float32Array.set per state buffer), the
// per-token cost a runtime that copied state instead of binding it in place would pay; for PhiMoE
// also copying the two chosen experts' rows of every layer (bench/expert-touch.ts).
//
// PhiMoE also: bytes of the expert tables touched per token, measured (fincore after runs that
// start with none resident) beside the no-reuse upper bound and the page-exact prediction from the
// routes (bench/expert-touch.ts says how, and why on tmpfs).
//
// Also start-up (load_ms): the default load (big files size-checked) against --verify (every file
// hashed), in the same run.
//
//   node --import tsx bench/host-overhead.ts [--keep] [--tokens 64] [--repeat 3] [--copy-repeat 7]
//                                            [--threads 1] [--recipes qwen3-4b,qwen3.5-4b,phi-tiny-moe]
//                                            [--tables-on shm|disk]
import { spawnSync } from 'node:child_process';
import { benchArgs, median, positiveInt } from './util.js';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { cpus, release, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { assembleBundle, MANIFEST } from '../src/bundle/assemble.js';
import type { Manifest } from '../src/bundle/manifest.js';
import { GRAPHS_JSON, graphName, layoutOf, type ExportManifest, type GraphEntry } from '../src/export/graphs.js';
import { getFamily } from '../src/families/index.js';
import type { GraphBindings, MadeTable } from '../src/families/types.js';
import { GraphBuilder } from '../src/onnx/builder.js';
import { writeModel } from '../src/onnx/writer.js';
import type { ShardPlan } from '../src/plan/shards.js';
import type { WeightStore } from '../src/quant/weights.js';
import { baseScheme } from '../src/recipe/schema.js';
import { ensureNative } from '../src/toolchain/native.js';
import { loadShape, type BenchShape } from './shapes.js';
import { dropResidency, isTmpfs, pagesOfPairs, residentBytes, routedPairs, routerSliceStart, slabBytes, tableBytes, timeExpertCopy, writeSparseTables } from './expert-touch.js';

// ---- arguments -----------------------------------------------------------------------------

const { values: arg, num } = benchArgs({
  keep: { type: 'boolean' }, tokens: { type: 'string', default: '64' }, repeat: { type: 'string', default: '3' },
  'copy-repeat': { type: 'string', default: '7' }, threads: { type: 'string', default: '1' },
  // Recipe ids (each with a recorded config).
  recipes: { type: 'string', default: 'qwen3-4b,qwen3.5-4b,phi-tiny-moe' },
  // Where a shape with made tables (PhiMoE's expert rows) keeps its bundle: shm (tmpfs, exact touched
  // pages) or disk (os.tmpdir(); fincore then counts readahead too). See bench/expert-touch.ts.
  'tables-on': { type: 'string', default: 'shm' },
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
if (arg['tables-on'] !== 'shm' && arg['tables-on'] !== 'disk') throw new Error(`--tables-on '${arg['tables-on']}': shm or disk`);
const SHM = '/dev/shm';
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
 * the last one: generated ids vary, and the host's argmax scans the real vocab size). PhiMoE: the
 * hand-off = hidden_in, the router logits E values of hidden_in at a per-layer offset (routes vary by
 * token and layer); the experts graph reads its hand-off, routing weights and expert rows (so its
 * inputs are used, and the rows' pages are touched as the real graph would touch them) and adds 0 ×
 * their sum to the residual it passes on.
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
  let passOn = residual.name;
  const read = b.inputs.filter((i) => i.bind === 'hand-off' || i.bind === 'routing-weights' || i.bind === 'host-rows');
  if (read.length) {
    const sums = read.flatMap((i) => {
      // A vector whole; a matrix [rows, cols] one element per 4 KiB along each row plus its last
      // column (strided Slices read only those): no gap between read bytes exceeds a page, so every
      // page of the rows is touched, for the price of a few thousand elements.
      const last = i.shape.length - 1;
      const cols = i.shape[last];
      const step = 4096 / (i.dtype === 'int8' ? 1 : i.dtype === 'float16' ? 2 : 4);
      const parts = i.shape.length < 2 ? [i.name] : [
        g.op('Slice', [i.name, g.constInt64([0]), g.constInt64([cols]), g.constInt64([last]), g.constInt64([step])]),
        g.op('Slice', [i.name, g.constInt64([cols - 1]), g.constInt64([cols]), g.constInt64([last])]),
      ];
      return parts.map((x) => g.op('ReduceSum', [i.dtype === 'float32' ? x : g.op('Cast', [x], { to: 1 })], { keepdims: 0 }));
    });
    const total = sums.reduce((acc, x) => g.op('Add', [acc, x]));
    passOn = g.op('Add', [residual.name, g.op('Mul', [total, g.constFloat32([0], [])])]);
  }
  for (const o of b.outputs) {
    let value: string;
    switch (o.bind) {
      case 'residual':
        value = passOn;
        break;
      case 'logits':
        value = tiled(vocab);
        break;
      case 'hand-off':
        value = residual.name;
        break;
      case 'router-logits': {
        const E = o.shape[o.shape.length - 1];
        const at = routerSliceStart(o.layer, E, H);
        value = g.op('Slice', [residual.name, g.constInt64([at]), g.constInt64([at + E]), g.constInt64([2])]);
        break;
      }
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
        throw new Error(`${name}: ${o.name}: the bench binds no ${o.bind} output`);
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
  embeddingFile: string;
  /** The family's made tables (PhiMoE's expert rows and scales), as sparse files in the bundle. */
  madeTables: Array<MadeTable & { path: string }>;
}

async function makeBundle(shape: BenchShape, dir: string): Promise<Bundle> {
  const { settings, plan } = shape;
  const family = getFamily(shape.family);
  const config = family.parseConfig(shape.rawConfig, `${shape.file} (config)`);
  const { maxContext, prefillLength } = settings;
  // The family's first host table is the token embedding the host looks rows up in.
  const [vocab, hidden] = family.hostTables(config)[0].shape;
  const exportDir = join(dir, 'export');
  const ckptDir = join(dir, 'checkpoint');
  const root = join(dir, 'bundle');
  for (const d of [exportDir, ckptDir]) mkdirSync(d, { recursive: true });

  // The same components and graphs runExport writes (the plan's, minus what it dropped), each graph
  // with the real interface its family builder gives (run against the stub store) and the entry
  // fields the export gives it (role, per-variant layer range), in the settings' schemes (the
  // experts graph's row inputs are int8 + scales in W8).
  const dropped = new Set((plan.dropped ?? []).map((d) => d.graph));
  const schemes = { scheme: baseScheme(settings.quant), lmHeadScheme: baseScheme(settings.lmHead.quant) };
  const contexts: ExportManifest['contexts'] = [];
  for (const c of family.components(config, layoutOf(plan, { prefillLength, maxContext }))) {
    const entries: GraphEntry[] = [];
    for (const v of c.variants) {
      const name = graphName(c.name, v.name);
      if (dropped.has(name)) continue;
      const iface = await v.build(new GraphBuilder(name), { store: stubStore(), ...schemes });
      const scheme = c.weights === 'lmHead' ? schemes.lmHeadScheme : schemes.scheme;
      const full: GraphEntry = { name, file: `${name}.onnx`, component: c.name, kind: c.kind, variant: v.name, n: v.n, ...(v.role ? { role: v.role } : {}), scheme, ...c.entry, ...v.entry, ...iface };
      writeModel(trivialGraph(name, family.bindings(config, full, maxContext), vocab), join(exportDir, full.file), { externalThreshold: Infinity });
      entries.push(full);
    }
    // No weights: an empty data file keeps the context's files list what the assembler expects.
    writeFileSync(join(exportDir, `${c.name}.data`), '');
    contexts.push({ name: c.name, data: `${c.name}.data`, dataBytes: 0, graphs: entries });
  }

  log(`${shape.id}: writing the f16 embedding table [${vocab}, ${hidden}] (${((vocab * hidden * 2) / 1e9).toFixed(2)} GB)`);
  writeEmbedding(join(exportDir, 'embedding.f16.bin'), vocab, hidden);
  const exp: ExportManifest = {
    family: shape.family, scheme: baseScheme(settings.quant), lmHeadScheme: baseScheme(settings.lmHead.quant), w8Form: 'matmulnbits', maxContext, contexts,
    embedding: { file: 'embedding.f16.bin', dtype: 'float16', shape: [vocab, hidden] },
  };
  const made = family.madeTables?.(config, baseScheme(settings.quant)).tables ?? [];
  if (made.length) {
    log(`${shape.id}: made tables as sparse files at their real sizes: ${made.map((t) => `${t.name} ${t.dtype} [${t.shape.join(', ')}]`).join('; ')} (${(made.reduce((a, t) => a + tableBytes(t), 0) / 1e9).toFixed(2)} GB)`);
    exp.madeTables = writeSparseTables(exportDir, made);
  }
  writeFileSync(join(exportDir, GRAPHS_JSON), JSON.stringify(exp, null, 2));
  // The assembler reads config.json and tokenizer.json from the checkpoint. The tokenizer is a stub:
  // the assembler's special-token reader needs a model.vocab, the runtime refuses a model that is not
  // BPE and then runs on token ids (--prompt-ids) and prints no text.
  writeFileSync(join(ckptDir, 'config.json'), JSON.stringify(shape.rawConfig));
  writeFileSync(join(ckptDir, 'tokenizer.json'), JSON.stringify({ model: { vocab: {} } }));
  // Links the made tables into the bundle (same inode: dropping their pages drops the bundle's).
  const manifest = await assembleBundle({
    recipe: { id: shape.id, family: shape.family }, arch: shape.arch, graphsDir: exportDir, embeddingDir: exportDir, checkpointDir: ckptDir, maxNewTokens: newTokens,
  }, root);
  return {
    manifestPath: join(root, MANIFEST), root, manifest, plan, maxContext, embeddingFile: join(root, 'embedding.f16.bin'),
    madeTables: (exp.madeTables ?? []).map((t) => ({ ...t, path: join(root, t.file) })),
  };
}

// ---- measuring -------------------------------------------------------------------------------

interface Timings {
  load_ms: number;
  prefill_ms: number;
  decode_ms_per_token: number;
  host_overhead_ms_per_token: number;
  decode_steps: number;
}

function runGenerate(qhx: string, b: Bundle, opts: { verify?: boolean; tokens?: number } = {}): { timings: Timings; generated: number[] } {
  const tokens = opts.tokens ?? newTokens;
  const args = [b.manifestPath, 'cpu', '-', b.root, String(tokens), '--prompt-ids', PROMPT.join(','), '--json', '--ignore-eos', ...(opts.verify ? ['--verify'] : [])];
  const r = spawnSync(qhx, args, { encoding: 'utf8', maxBuffer: 64 << 20, env: { ...process.env, FORGE_ORT_THREADS: ortThreads } });
  if (r.status !== 0) throw new Error(`qhx_generate ${args.join(' ')} exited ${r.status}${r.signal ? ` (${r.signal})` : ''}: ${r.stderr.trim()}`);
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { timings: Timings; generated_ids: number[] };
  if (out.generated_ids.length !== tokens) throw new Error(`qhx_generate gave ${out.generated_ids.length} tokens, not ${tokens}`);
  return { timings: out.timings, generated: out.generated_ids };
}

/**
 * PhiMoE: the expert-table bytes one run of `tokens` new tokens touches, starting with none of them
 * resident (bench/expert-touch.ts), per routed token (every prompt token runs the same per-layer
 * step as a decode token: phimoe has no batched prefill), against the no-reuse upper bound (two
 * experts' slabs of every table in every layer, per token) and the page-exact prediction from the
 * routes the trivial graphs produce.
 */
function measureTouch(qhx: string, b: Bundle, tokens: number) {
  for (const t of b.madeTables) dropResidency(t.path);
  const left = b.madeTables.filter((t) => residentBytes(t.path) > 0);
  if (left.length) throw new Error(`${left.map((t) => t.path).join(', ')}: pages still resident after dropping them; the touched-bytes figure would be wrong`);
  const { timings, generated } = runGenerate(qhx, b, { tokens });
  const resident = b.madeTables.map((t) => residentBytes(t.path));
  // The tokens that ran the layers: the prompt's, then each generated one but the last (never fed back).
  const fed = [...PROMPT, ...generated.slice(0, -1)];
  const [L, E] = b.madeTables[0].shape;
  const { pairs, afterToken } = routedPairs(b.embeddingFile, b.manifest.model.hidden, L, E, fed);
  const tables = b.madeTables.map((t, i) => ({ name: t.name, dtype: t.dtype, tableBytes: tableBytes(t), slabBytes: slabBytes(t), residentBytes: resident[i], predictedBytes: pagesOfPairs(t, pairs) }));
  const measured = resident.reduce((a, x) => a + x, 0);
  const predicted = tables.reduce((a, t) => a + t.predictedBytes, 0);
  const upperPerToken = 2 * L * tables.reduce((a, t) => a + t.slabBytes, 0);
  const perToken = measured / fed.length;
  return {
    newTokens: tokens,
    routedTokens: fed.length,
    decodeSteps: timings.decode_steps,
    distinctTokens: new Set(fed).size,
    expertsTouched: pairs.size,
    expertsInTables: L * E,
    // From the routes: how many fed tokens it took until every (layer, expert) slab had been read.
    routedTokensUntilAllTouched: afterToken.indexOf(L * E) + 1 || null,
    residentBytes: measured,
    predictedBytes: predicted,
    ratioMeasuredOverPredicted: measured / predicted,
    bytesPerRoutedToken: perToken,
    bytesPerDecodeStep: timings.decode_steps ? measured / timings.decode_steps : null,
    upperBoundBytesPerToken: upperPerToken,
    ratioMeasuredOverUpperBound: perToken / upperPerToken,
    tables,
  };
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
let shmWork: string | undefined;
const shapes: Record<string, unknown> = {};
try {
  for (const id of recipeIds) {
    const shape = await loadShape(id, ARCH);
    // A shape with made tables lives on tmpfs unless --tables-on disk (bench/expert-touch.ts: why).
    const hasTables = getFamily(shape.family).madeTables !== undefined;
    const onShm = hasTables && arg['tables-on'] === 'shm' && existsSync(SHM) && isTmpfs(SHM);
    if (hasTables && arg['tables-on'] === 'shm' && !onShm) log(`${id}: ${SHM} is not a tmpfs here: the bundle goes to ${tmpdir()}, and resident bytes include readahead`);
    const dir = join(onShm ? (shmWork ??= mkdtempSync(join(SHM, 'forge-host-overhead-'))) : work, id);
    const b = await makeBundle(shape, dir);
    const bytesOf = (kind: 'kv-cache' | 'recurrent') => b.manifest.state.filter((s) => s.kind === kind).reduce((a, s) => a + numel(s.shape) * 4, 0);
    const kvBytes = bytesOf('kv-cache');
    const recurrentBytes = bytesOf('recurrent');
    const runs: Timings[] = [];
    for (let r = 0; r < repeat; r++) {
      runs.push(runGenerate(build.qhxGenerate, b).timings);
      log(`${id}: run ${r + 1}/${repeat}: ${JSON.stringify(runs[r])}`);
    }
    const host = median(runs.map((t) => t.host_overhead_ms_per_token));
    const decode = median(runs.map((t) => t.decode_ms_per_token));
    const graphRun = median(runs.map((t) => t.decode_ms_per_token - t.host_overhead_ms_per_token));
    const stateCopyMs = timeStateCopy(b.manifest.state);
    const expertCopyMs = b.madeTables.length ? timeExpertCopy(b.madeTables, copyRepeat) : undefined;
    // Start-up: the default load checks the big files' sizes; --verify also hashes them (here the
    // f16 embedding table and the made tables at their real sizes; the graphs' data files are empty).
    const verified = Array.from({ length: repeat }, () => runGenerate(build.qhxGenerate, b, { verify: true }).timings.load_ms);
    const loadMs = median(runs.map((t) => t.load_ms));
    const loadVerifyMs = median(verified);
    const embeddingBytes = b.manifest.model.vocab * b.manifest.model.hidden * 2;
    const madeTableBytes = b.madeTables.reduce((a, t) => a + tableBytes(t), 0);
    // Last: these runs start with the tables' pages dropped. A short run (the prompt and one token)
    // and a full one: the per-token figure falls as later tokens re-use experts already touched.
    const touch = b.madeTables.length ? [1, newTokens].map((tokens) => {
      const m = measureTouch(build.qhxGenerate, b, tokens);
      log(`${id}: ${tokens} new token(s): ${(m.residentBytes / 1e6).toFixed(1)} MB of expert tables touched (${m.expertsTouched}/${m.expertsInTables} experts), ${(m.bytesPerRoutedToken / 1e6).toFixed(2)} MB per routed token, upper bound ${(m.upperBoundBytesPerToken / 1e6).toFixed(2)} MB`);
      return m;
    }) : undefined;
    shapes[id] = {
      source: shape.source,
      layers: b.manifest.model.layers,
      hidden: b.manifest.model.hidden,
      vocab: b.manifest.model.vocab,
      maxContext: b.maxContext,
      shards: b.plan.shards.map((s) => [s.first, s.last]),
      contexts: b.plan.contexts,
      graphs: b.plan.graphs,
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
      ...(expertCopyMs !== undefined ? { expertCopyMs, ratioHostOverheadOverExpertCopy: host / expertCopyMs } : {}),
      ratioHostOverheadOverTarget: host / TARGET_MS,
      withinTarget: host <= TARGET_MS,
      ...(touch ? { expertTables: { on: onShm ? 'tmpfs' : 'disk (resident bytes include readahead)', bytes: madeTableBytes, touch } } : {}),
      startup: {
        loadMs, loadVerifyMs, ratioVerifyOverDefault: loadVerifyMs / loadMs, embeddingBytes, madeTableBytes,
        sha256MBPerS: (embeddingBytes + madeTableBytes) / 1e6 / ((loadVerifyMs - loadMs) / 1000),
      },
      runs,
    };
    if (!keep) rmSync(dir, { recursive: true, force: true });
  }
} finally {
  for (const w of [work, shmWork]) {
    if (!w) continue;
    if (!keep) rmSync(w, { recursive: true, force: true });
    else log(`kept ${w}`);
  }
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
    'hostOverheadMsPerToken = decode step wall time minus time inside Run calls (native/src/greedy_loop.cpp); graphRunMsPerToken = the rest',
    `stateCopyMs = median of ${copyRepeat} Float32Array.set copies of every state buffer (KV caches + recurrent states, one copy each): the per-token cost of copying state instead of binding it in place`,
    `expertCopyMs (phimoe) = median of ${copyRepeat} copies of two experts' slabs of every expert table in every layer: the per-token cost of copying the chosen rows instead of binding them in place`,
    'expertTables.touch (phimoe): fincore resident bytes of the expert tables after a run that started with none resident (1 and --tokens new tokens), per routed token (prompt tokens included: no batched prefill); predictedBytes = the pages of the (layer, expert) slabs the routes of the fed tokens pick; upperBoundBytesPerToken = 2 experts × layers × every table\'s slab, i.e. no expert re-used across tokens',
    'graphs: the real I/O (family component builders) with trivial compute; manifest: assembleBundle (family.bindings); made tables: sparse files at their real sizes',
    `startup: median load_ms (manifest checks + sessions) of the ${repeat} runs above (big files size-checked) vs ${repeat} runs with --verify (every file hashed); sha256MBPerS = (embedding + made table) bytes / the difference`,
  ],
  machine: { cores: cpus().length, cpuModel: cpus()[0]?.model, memGB: +(totalmem() / 1e9).toFixed(1), node: process.version, kernel: release() },
  date: new Date().toISOString(),
};
process.stdout.write(JSON.stringify(report, null, 2) + '\n');
