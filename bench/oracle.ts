// The oracle gate at real size: each exported graph run for a few traced steps as exported
// (MatMulNBits as is, the session options the gate used before the CPU form) and in its CPU-gate
// form (src/gates/cpu-form.ts, CPU_GATE_SESSION_OPTIONS), in the same run, with the time per case
// split into building the feeds, session.run and the comparison, the session load, private
// (RssAnon) and mapped (RssFile) peaks, and whether both forms' outputs agree bit for bit. Each
// graph's full-trace time is extrapolated as load + cases × mean case; `--whole` then runs the
// real oracle stage code (runOracleGate, CPU form) over every graph and step and times it.
//
//   node --import tsx bench/oracle.ts --export DIR[,DIR…] --checkpoint CKPT --work DIR
//        [--steps 3] [--graphs shard0.decode,…] [--forms asis,cpu] [--block-bytes N] [--whole]
//
// The trace is synthetic (random values of the checkpoint's shapes: 2 prompts of 8 and 10 tokens,
// 64 new tokens each, 144 steps as in issue 12), written once into --work: a gate run on it times
// the same work as on HF's trace, but its cosines say nothing. qwen3-family checkpoints only.
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import * as ort from 'onnxruntime-node';
import { benchArgs, positiveInt } from './util.js';
import { getFamily } from '../src/families/index.js';
import type { Family } from '../src/families/types.js';
import { GRAPHS_JSON, type ExportManifest, type GraphEntry } from '../src/families/export-stage.js';
import { Trace, type TraceMeta, type TracePrompt } from '../src/gates/trace.js';
import { GateTally } from '../src/gates/compare.js';
import { writeProbeModel } from '../src/gates/probe.js';
import { CPU_GATE_SESSION_OPTIONS, DEFAULT_BLOCK_BYTES, writeGateModel } from '../src/gates/cpu-form.js';
import { runOracleGate } from '../src/gates/oracle.js';

const { values: a, num } = benchArgs({
  export: { type: 'string', default: '' }, checkpoint: { type: 'string', default: '' }, work: { type: 'string', default: '' },
  steps: { type: 'string', default: '3' }, graphs: { type: 'string', default: '' }, forms: { type: 'string', default: 'asis,cpu' },
  'block-bytes': { type: 'string', default: String(DEFAULT_BLOCK_BYTES) }, whole: { type: 'boolean' },
});
if (!a.export || !a.checkpoint || !a.work) {
  process.stderr.write('usage: oracle.ts --export DIR[,DIR…] --checkpoint CKPT --work DIR [--steps N] [--graphs a,b] [--forms asis,cpu] [--block-bytes N] [--whole]\n');
  process.exit(2);
}
const steps = num('steps', positiveInt);
const blockBytes = num('block-bytes', positiveInt);
const exportDirs = a.export.split(',');
const forms = a.forms.split(',') as Array<'asis' | 'cpu'>;
for (const f of forms) if (f !== 'asis' && f !== 'cpu') throw new Error(`--forms: '${f}' is neither asis nor cpu`);

// ---- memory: a worker samples /proc/<pid>/status every 20 ms while the main thread is in ORT ----
const peaks = new Int32Array(new SharedArrayBuffer(8)); // kB: [RssAnon, RssFile] maxima since reset
new Worker(`
  const { workerData } = require('node:worker_threads');
  const { readFileSync } = require('node:fs');
  const p = new Int32Array(workerData.buf);
  const kb = (s, k) => Number(s.match(new RegExp(k + ':\\\\s+(\\\\d+)'))[1]);
  setInterval(() => {
    const s = readFileSync('/proc/${process.pid}/status', 'utf8');
    // Only this thread raises the peaks; the main thread only reads or zeroes them.
    Atomics.store(p, 0, Math.max(Atomics.load(p, 0), kb(s, 'RssAnon')));
    Atomics.store(p, 1, Math.max(Atomics.load(p, 1), kb(s, 'RssFile')));
  }, 20);
`, { eval: true, workerData: { buf: peaks.buffer } }).unref();
const resetPeaks = () => { Atomics.store(peaks, 0, 0); Atomics.store(peaks, 1, 0); };
const gb = (kb: number) => +(kb / 1024 / 1024).toFixed(2);

// ---- synthetic trace -------------------------------------------------------------------------
const family = getFamily('qwen3') as Family<{ layers: number; hidden: number; vocab: number; kvHeads: number; headDim: number }>;
const config = family.parseConfig(JSON.parse(readFileSync(join(a.checkpoint, 'config.json'), 'utf8')), 'config.json') as any;
const manifests = exportDirs.map((d) => JSON.parse(readFileSync(join(d, GRAPHS_JSON), 'utf8')) as ExportManifest);
const traceDir = join(a.work, 'trace');
writeSyntheticTrace(traceDir, manifests[0].maxContext);
const trace = await Trace.open(traceDir);

function writeSyntheticTrace(dir: string, maxContext: number): void {
  if (existsSync(join(dir, 'trace.json'))) return;
  mkdirSync(dir, { recursive: true });
  const L = config.layers as number, H = config.hidden as number, V = config.vocab as number, kv = config.kvHeads * config.headDim;
  const prompts = [8, 10].map((n, p) => ({ text: `synthetic ${p}`, prompt_tokens: Array.from({ length: n }, (_, i) => 100 + i), generated: Array.from({ length: 64 }, (_, i) => 200 + i), steps: n + 63 }));
  const header: Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }> = {};
  let off = 0;
  const add = (name: string, n: number) => { header[name] = { dtype: 'F32', shape: [n], data_offsets: [off, off + n * 4] }; off += n * 4; };
  prompts.forEach((pr, p) => {
    for (let t = 0; t < pr.steps; t++) {
      for (let i = 0; i <= L; i++) add(`p${p}/s${t}/h.${i}`, H);
      for (let i = 0; i < L; i++) { add(`p${p}/s${t}/k.${i}`, kv); add(`p${p}/s${t}/v.${i}`, kv); }
      add(`p${p}/s${t}/final`, H);
      add(`p${p}/s${t}/logits`, V);
    }
  });
  const json = Buffer.from(JSON.stringify(header).padEnd(Math.ceil(JSON.stringify(header).length / 8) * 8, ' '));
  const data = new Float32Array(off / 4);
  let seed = 12345;
  for (let i = 0; i < data.length; i++) data[i] = ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32 - 0.5);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  writeFileSync(join(dir, 'trace.safetensors'), Buffer.concat([len, json, Buffer.from(data.buffer)]));
  // Random tensors: no runner-up or margins to record (the oracle gate reads neither).
  const meta: Omit<TraceMeta, 'margins' | 'prompts'> & { prompts: Array<Omit<TracePrompt, 'runner_up' | 'margins'>> } = { family: 'qwen3', layers: L, hidden: H, vocab: V, kv_heads: config.kvHeads, head_dim: config.headDim, max_context: maxContext, new_tokens: 64, prompts, tensors: 'trace.safetensors' };
  writeFileSync(join(dir, 'trace.json'), JSON.stringify(meta));
}

/** Cases a graph gets over the whole trace (what gateCases yields), without building them. */
function caseCount(g: GraphEntry): number {
  return trace.meta.prompts.reduce((s, p) => s + (g.n === 1 ? p.steps : Math.ceil(p.prompt_tokens.length / g.n)), 0);
}

// ---- per graph: a few steps in each form ----------------------------------------------------
interface Measured { form: string; loadS: number; cases: number; feedS: number; runS: number; compareS: number; anonGB: number; fileGB: number; estS: number; outputs?: Map<string, Float32Array[]> }
const scratch = join(a.work, 'scratch');
const rows: Array<{ graph: string; m: Measured[]; same?: string }> = [];
for (const [k, dir] of exportDirs.entries()) {
  for (const c of manifests[k].contexts) for (const g of c.graphs) {
    if (a.graphs && !a.graphs.split(',').includes(g.name)) continue;
    const label = `${manifests[k].scheme}/${g.name}`;
    const m: Measured[] = [];
    for (const form of forms) m.push(await measure(dir, g, manifests[k].maxContext, form));
    let same: string | undefined;
    if (m.length === 2) {
      let eq = 0, n = 0, maxAbs = 0;
      for (const [name, xs] of m[0].outputs!) xs.forEach((x, i) => { const y = m[1].outputs!.get(name)![i]; for (let j = 0; j < x.length; j++) { n++; if (Object.is(x[j], y[j])) eq++; else maxAbs = Math.max(maxAbs, Math.abs(x[j] - y[j])); } });
      same = `${eq}/${n} equal, max |diff| ${maxAbs}`;
    }
    rows.push({ graph: label, m, same });
    for (const x of m) delete x.outputs;
    process.stderr.write(`${label}: ${JSON.stringify({ m, same })}\n`);
  }
}

async function measure(dir: string, g: GraphEntry, maxContext: number, form: 'asis' | 'cpu'): Promise<Measured> {
  rmSync(scratch, { recursive: true, force: true });
  const probes = Object.keys(g.probes);
  const model = form === 'cpu'
    ? writeGateModel(join(dir, g.file), probes, scratch, { tokensPerCall: g.n, blockBytes }).path
    : writeProbeModel(join(dir, g.file), probes, scratch);
  resetPeaks();
  let t = performance.now();
  const session = await ort.InferenceSession.create(model, form === 'cpu' ? CPU_GATE_SESSION_OPTIONS : { graphOptimizationLevel: 'basic' });
  const loadS = (performance.now() - t) / 1000;
  const tally = new GateTally(trace.meta.vocab);
  const outputs = new Map<string, Float32Array[]>();
  let cases = 0, feedS = 0, runS = 0, compareS = 0;
  const it = family.gateCases(config, g, trace, maxContext);
  while (cases < steps) {
    t = performance.now();
    const next = await it.next();
    if (next.done) break;
    const c = next.value;
    const feeds: Record<string, ort.Tensor> = {};
    for (const [name, f] of Object.entries(c.feeds)) feeds[name] = new ort.Tensor(f.dtype, f.data, f.dims);
    const t1 = performance.now();
    const out = await session.run(feeds);
    const t2 = performance.now();
    for (const [name, expected] of Object.entries(c.expected)) {
      const y = out[name].data as Float32Array;
      tally.add(name, y, expected, `step ${c.step}`, c.masks?.[name]);
      outputs.set(name, [...(outputs.get(name) ?? []), y.slice()]);
    }
    const t3 = performance.now();
    feedS += (t1 - t) / 1000; runS += (t2 - t1) / 1000; compareS += (t3 - t2) / 1000;
    process.stderr.write(`  ${form} ${g.name} case ${cases}: feed ${((t1 - t) / 1000).toFixed(2)} s, run ${((t2 - t1) / 1000).toFixed(2)} s\n`);
    cases++;
  }
  await it.return(undefined);
  await session.release();
  const perCase = (feedS + runS + compareS) / cases;
  return { form, loadS: +loadS.toFixed(2), cases, feedS: +feedS.toFixed(2), runS: +runS.toFixed(2), compareS: +compareS.toFixed(2), anonGB: gb(peaks[0]), fileGB: gb(peaks[1]), estS: Math.round(loadS + perCase * caseCount(g)), outputs };
}

// ---- report ----------------------------------------------------------------------------------
const lines = [`| graph | cases (full trace) | ${forms.map((f) => `${f}: load s, s/case (feed+run+compare), est. full s, private/mapped GB`).join(' | ')} | ${forms.length === 2 ? 'asis/cpu | outputs' : ''} |`];
const total: Record<string, number> = {};
for (const r of rows) {
  const cells = r.m.map((x) => {
    total[x.form] = (total[x.form] ?? 0) + x.estS;
    return `${x.loadS}, ${((x.feedS + x.runS + x.compareS) / x.cases).toFixed(2)} (${(x.feedS / x.cases).toFixed(2)}+${(x.runS / x.cases).toFixed(2)}+${(x.compareS / x.cases).toFixed(2)}), ${x.estS}, ${x.anonGB}/${x.fileGB}`;
  });
  const g = manifests.flatMap((mf) => mf.contexts.flatMap((c) => c.graphs)).find((x) => r.graph.endsWith(`/${x.name}`))!;
  lines.push(`| ${r.graph} | ${caseCount(g)} | ${cells.join(' | ')} | ${r.m.length === 2 ? `${(r.m[0].estS / r.m[1].estS).toFixed(2)} | ${r.same}` : ''} |`);
}
lines.push(`| total (extrapolated) | | ${forms.map((f) => `${total[f]} s`).join(' | ')} | ${forms.length === 2 ? (total.asis / total.cpu).toFixed(2) : ''} | |`);
process.stdout.write(`${steps} cases per graph measured, block ${blockBytes} B\n${lines.join('\n')}\n`);

if (a.whole) {
  rmSync(scratch, { recursive: true, force: true });
  resetPeaks();
  const t = performance.now();
  const r = await runOracleGate('qwen3', a.checkpoint, traceDir, exportDirs.map((d, i) => ({ label: `v${i}`, dir: d, minCosine: 0 })), 0, scratch,
    (done, n, label) => process.stderr.write(`[${((performance.now() - t) / 1000).toFixed(0)} s] graph ${done + 1}/${n} ${label}\n`));
  process.stdout.write(`whole oracle (runOracleGate, CPU form): ${((performance.now() - t) / 1000).toFixed(1)} s, private peak ${gb(peaks[0])} GB, mapped peak ${gb(peaks[1])} GB, ${Object.keys(r.graphs).length} graphs\n`);
}
await trace.close();
rmSync(scratch, { recursive: true, force: true });
