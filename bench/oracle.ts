// The oracle gate at real size: each exported graph run for a few traced steps as exported
// (`asis`: MatMulNBits as is, the session options the gate used before the CPU form) and in its
// CPU-gate form (src/gates/cpu-form.ts; `cpu`: one case per call, `cpuN`: N teacher-forced cases
// per call of a one-token graph, as copies sharing each converted weight block, as the oracle
// stage runs them), in the same run, with the time per case split into building the feeds,
// session.run and the comparison, the CPU seconds per case (all threads of this process: a figure
// less distorted by a shared machine than wall time), the session load, private (RssAnon) and
// mapped (RssFile) peaks, and whether each form's outputs equal the first form's bit for bit.
// Each graph's full-trace time is extrapolated as load + cases × mean case; `--whole 16-whole,16` then
// runs the real oracle stage code (runOracleGate, CPU form) over every graph and step, once per
// listed cases-per-call, and says whether every row's cosine and error are the same.
//
//   node --import tsx bench/oracle.ts --export DIR[,DIR…] --checkpoint CKPT --work DIR
//        [--steps 3] [--graphs shard0.decode,…] [--forms asis,cpu,cpu8,cpu8-whole] [--block-bytes N] [--whole 16-whole,16]
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
import { GRAPHS_JSON, type ExportManifest, type GraphEntry } from '../src/export/graphs.js';
import { Trace, type TraceMeta, type TracePrompt } from '../src/gates/trace.js';
import { GateTally } from '../src/gates/compare.js';
import { writeProbeModel } from '../src/gates/probe.js';
import { DEFAULT_BLOCK_BYTES, gateSessionOptions, writeGateModel } from '../src/gates/cpu-form.js';
import { formOptions, gateForm, runGateCases, runOracleGate } from '../src/gates/oracle.js';

const { values: a, num } = benchArgs({
  export: { type: 'string', default: '' }, checkpoint: { type: 'string', default: '' }, work: { type: 'string', default: '' },
  steps: { type: 'string', default: '3' }, graphs: { type: 'string', default: '' }, forms: { type: 'string', default: 'asis,cpu' },
  'block-bytes': { type: 'string', default: String(DEFAULT_BLOCK_BYTES) }, whole: { type: 'string', default: '' },
});
if (!a.export || !a.checkpoint || !a.work) {
  process.stderr.write('usage: oracle.ts --export DIR[,DIR…] --checkpoint CKPT --work DIR [--steps N] [--graphs a,b] [--forms asis,cpu,cpu8] [--block-bytes N] [--whole 16-whole,16]\n');
  process.exit(2);
}
const steps = num('steps', positiveInt);
const blockBytes = num('block-bytes', positiveInt);
const exportDirs = a.export.split(',');
const forms = a.forms.split(',');
for (const f of forms) if (f !== 'asis' && !/^cpu([1-9]\d*)?(-whole)?$/.test(f)) throw new Error(`--forms: '${f}' is none of asis, cpu, cpuN (N cases per call), cpu-whole, cpuN-whole (the whole KV cache, no window)`);

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
interface Measured { form: string; loadS: number; cases: number; feedS: number; runS: number; compareS: number; cpuS: number; anonGB: number; fileGB: number; estS: number; outputs?: Map<string, Float32Array[]> }
const scratch = join(a.work, 'scratch');
const rows: Array<{ graph: string; m: Measured[]; same: string }> = [];
for (const [k, dir] of exportDirs.entries()) {
  for (const c of manifests[k].contexts) for (const g of c.graphs) {
    if (a.graphs && !a.graphs.split(',').includes(g.name)) continue;
    const label = `${manifests[k].scheme}/${g.name}`;
    const m: Measured[] = [];
    for (const form of forms) m.push(await measure(dir, g, manifests[k].maxContext, form));
    // Every form's outputs against the first form's, value for value.
    const same = m.slice(1).map((x) => {
      let eq = 0, n = 0, maxAbs = 0;
      for (const [name, xs] of m[0].outputs!) xs.forEach((v, i) => { const y = x.outputs!.get(name)![i]; for (let j = 0; j < v.length; j++) { n++; if (Object.is(v[j], y[j])) eq++; else maxAbs = Math.max(maxAbs, Math.abs(v[j] - y[j])); } });
      return `${x.form}: ${eq}/${n} equal, max |diff| ${maxAbs}`;
    }).join('; ');
    rows.push({ graph: label, m, same });
    for (const x of m) delete x.outputs;
    process.stderr.write(`${label}: ${JSON.stringify({ m, same })}\n`);
  }
}

async function measure(dir: string, g: GraphEntry, maxContext: number, form: string): Promise<Measured> {
  rmSync(scratch, { recursive: true, force: true });
  const probes = Object.keys(g.probes);
  const gf = gateForm(g, form === 'asis' ? 1 : copiesOf(form), form !== 'asis' && !form.endsWith('-whole'));
  const model = form === 'asis'
    ? writeProbeModel(join(dir, g.file), probes, scratch)
    : writeGateModel(join(dir, g.file), probes, scratch, formOptions(g, gf, blockBytes)).path;
  resetPeaks();
  let t = performance.now();
  const session = await ort.InferenceSession.create(model, form === 'asis' ? { graphOptimizationLevel: 'basic' } : gateSessionOptions(gf.copies));
  const loadS = (performance.now() - t) / 1000;
  const tally = new GateTally(trace.meta.vocab);
  const outputs = new Map<string, Float32Array[]>();
  let cases = 0, runS = 0, compareS = 0;
  const all = family.gateCases(config, g, trace, maxContext, dir);
  async function* first(n: number) {
    for (let k = 0; k < n; k++) {
      const next = await all.next();
      if (next.done) return;
      yield next.value;
    }
  }
  const cpu0 = process.cpuUsage();
  t = performance.now();
  await runGateCases(session, g.file, first(steps), gf, (c, output) => {
    const t2 = performance.now();
    for (const name of Object.keys(c.expected)) {
      const y = output(name);
      tally.add(name, y, c.expected[name], `step ${c.step}`, c.masks?.[name]);
      outputs.set(name, [...(outputs.get(name) ?? []), y.slice()]);
    }
    compareS += (performance.now() - t2) / 1000;
    cases++;
  }, (n, s) => {
    runS += s;
    process.stderr.write(`  ${form} ${g.name} call of ${n} case(s): run ${s.toFixed(2)} s\n`);
  });
  const wallS = (performance.now() - t) / 1000;
  const cpu = process.cpuUsage(cpu0);
  await all.return(undefined);
  await session.release();
  const feedS = wallS - runS - compareS;
  const perCase = wallS / cases;
  return { form, loadS: +loadS.toFixed(2), cases, feedS: +feedS.toFixed(2), runS: +runS.toFixed(2), compareS: +compareS.toFixed(2), cpuS: +((cpu.user + cpu.system) / 1e6).toFixed(2), anonGB: gb(peaks[0]), fileGB: gb(peaks[1]), estS: Math.round(loadS + perCase * caseCount(g)), outputs };
}

/** Copies a form name asks for: `cpu` is the CPU form of one case per call, `cpu8` of 8 (either with `-whole`: no cache window). */
function copiesOf(form: string): number {
  const n = form.replace(/-whole$/, '').slice(3);
  return n ? Number(n) : 1;
}

// ---- report ----------------------------------------------------------------------------------
const lines = [`| graph | cases (full trace) | ${forms.map((f) => `${f}: load s, s/case (feed+run+compare), CPU s/case, est. full s, private/mapped GB`).join(' | ')} | ${forms.slice(1).map((f) => `${forms[0]}/${f} (est. full)`).join(' | ')} | outputs vs ${forms[0]} |`];
const total: Record<string, number> = {};
for (const r of rows) {
  const cells = r.m.map((x) => {
    total[x.form] = (total[x.form] ?? 0) + x.estS;
    return `${x.loadS}, ${((x.feedS + x.runS + x.compareS) / x.cases).toFixed(3)} (${(x.feedS / x.cases).toFixed(3)}+${(x.runS / x.cases).toFixed(3)}+${(x.compareS / x.cases).toFixed(3)}), ${(x.cpuS / x.cases).toFixed(3)}, ${x.estS}, ${x.anonGB}/${x.fileGB}`;
  });
  const g = manifests.flatMap((mf) => mf.contexts.flatMap((c) => c.graphs)).find((x) => r.graph.endsWith(`/${x.name}`))!;
  lines.push(`| ${r.graph} | ${caseCount(g)} | ${cells.join(' | ')} | ${r.m.slice(1).map((x) => (r.m[0].estS / x.estS).toFixed(2)).join(' | ')} | ${r.same} |`);
}
lines.push(`| total (extrapolated) | | ${forms.map((f) => `${total[f] ?? 0} s`).join(' | ')} | ${forms.slice(1).map((f) => (total[forms[0]] / total[f]).toFixed(2)).join(' | ')} | |`);
process.stdout.write(`${steps} cases per graph measured, block ${blockBytes} B\n${lines.join('\n')}\n`);

let firstWhole: string | undefined;
for (const whole of a.whole ? a.whole.split(',') : []) {
  const wholeCopies = Number(whole.replace(/-whole$/, ''));
  if (!positiveInt(wholeCopies)) throw new Error(`--whole: '${a.whole}' is not a list of cases per call (N, or N-whole for the whole KV cache each call)`);
  const windowed = !whole.endsWith('-whole');
  rmSync(scratch, { recursive: true, force: true });
  resetPeaks();
  const t = performance.now();
  const cpu0 = process.cpuUsage();
  const r = await runOracleGate('qwen3', a.checkpoint, traceDir, exportDirs.map((d, i) => ({ label: `v${i}`, dir: d, minCosine: 0 })), 0, scratch,
    (done, n, label) => process.stderr.write(`[${((performance.now() - t) / 1000).toFixed(0)} s] graph ${done + 1}/${n} ${label}\n`), wholeCopies, windowed);
  const cpu = process.cpuUsage(cpu0);
  process.stdout.write(`whole oracle (runOracleGate, CPU form, ${wholeCopies} case(s) per call of a one-token graph, ${windowed ? 'cache window' : 'whole cache'}): ${((performance.now() - t) / 1000).toFixed(1)} s (CPU ${((cpu.user + cpu.system) / 1e6).toFixed(1)} s), private peak ${gb(peaks[0])} GB, mapped peak ${gb(peaks[1])} GB, ${Object.keys(r.graphs).length} graphs\n`);
  // Same numbers whatever the cases per call: every row's cosine and max error as the first run's.
  const table = JSON.stringify(r.rows.map((x) => [x.variant, x.graph, x.output, x.minCosine, x.maxAbs]));
  if (firstWhole === undefined) firstWhole = table;
  else process.stdout.write(`  rows (min cosine, max abs error) identical to the first --whole run: ${table === firstWhole}\n`);
}
await trace.close();
rmSync(scratch, { recursive: true, force: true });
