// forge bisect, op by op on the simulator: which op of a graph leaves the reference once the graph
// is compiled for the HTP (fp16). The graph's nodes carry name scopes (`layers.2/input_layernorm/Mul`,
// builder.ts), so a probe variant of the shipped graph — every float value the scoped ops make turned
// into an extra graph output — says where in the layer the numbers go. It is compiled and run on the
// simulator, and run on the CPU (the oracle gate's form), for the first traced cases; each op's
// output is compared between the two.
//
// The op named is the first, in graph order, that makes a value fp16 cannot hold (|v| > 65504 on the
// CPU) out of float inputs that fp16 could, and whose simulator output is off (non-finite, or under
// the cosine): an overflow. An input already out of range (the
// attention mask's −1e9) is the graph's intent, not a fault, and what reads it is not named. Failing
// that, the first op whose simulator output is non-finite, and failing that the first whose cosine
// with the CPU falls under the threshold.
import { existsSync, mkdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { OnnxModel } from '../onnx/reader.js';
import { onnx } from '../onnx/proto.js';
import { writeProbeModel } from '../gates/probe.js';
import { gateSessionOptions, writeGateModel } from '../gates/cpu-form.js';
import { formOptions, gateForm, runGateCases } from '../gates/oracle.js';
import { compare } from '../gates/compare.js';
import { compileContext } from '../toolchain/qnn/compile.js';
import { simulateBatch, writeFeeds, type HtpArch } from '../gates/emulation.js';
import { openSafetensors } from '../io/safetensors.js';
import { toFloat32 } from '../io/dtype.js';
import { sha256OfFile } from '../engine/hash.js';
import { gateCasesOf } from '../families/types.js';
import type { Family } from '../families/types.js';
import type { GateCase } from '../families/types.js';
import type { GraphEntry } from '../export/graphs.js';
import type { Trace } from '../gates/trace.js';

/** The largest finite fp16 value. */
export const FP16_MAX = 65504;

export interface OpFigure {
  /** The node's name (`layers.2/input_layernorm/Mul`) and type. */
  node: string;
  op: string;
  /** Its scope (the name less the op: `layers.2/input_layernorm`) and layer, when it is in one. */
  scope: string;
  layer: number | null;
  value: string;
  /** Smallest cosine, simulator vs CPU, over the probed cases (−1: a non-finite entry on the simulator). */
  cosine: number;
  /** Largest |v| on the CPU, and over its float inputs (graph inputs and probed values). */
  cpuMaxAbs: number;
  inputMaxAbs: number;
  /** Largest finite |v| on the simulator, and how many entries were non-finite or at fp16's limit there. */
  simMaxAbs: number;
  simNonFinite: number;
  simSaturated: number;
}

export interface ProbeResult {
  graph: string;
  /** The cases probed: prompt/step of each. */
  cases: Array<{ prompt: number; step: number }>;
  ops: OpFigure[];
  /** Values left out: their CPU form has another size than the compiled graph's. */
  skipped?: number;
  /** The op named and why. */
  first?: OpFigure;
  why?: 'overflow' | 'non-finite' | 'cosine';
  /** Hash of the probed graph (the cache key with the cases' count). */
  graphSha256: string;
  cached: boolean;
  seconds: number;
}

const FLOAT = onnx.TensorProto.DataType.FLOAT;
const FIXED: Record<string, number> = { Shape: 7, Size: 7, ArgMax: 7, ArgMin: 7, NonZero: 7, Equal: 9, Less: 9, LessOrEqual: 9, Greater: 9, GreaterOrEqual: 9, Not: 9, And: 9, Or: 9, Xor: 9, IsNaN: 9, IsInf: 9 };

/** Element types of every node output, propagated as the builder types them (its graphs carry no value_info). */
export function valueTypes(g: onnx.IGraphProto): Map<string, number> {
  const t = new Map<string, number>();
  for (const i of g.input ?? []) t.set(i.name!, i.type?.tensorType?.elemType ?? 0);
  for (const i of g.initializer ?? []) t.set(i.name!, i.dataType ?? 0);
  for (const n of g.node ?? []) {
    const cast = n.opType === 'Cast' ? Number(n.attribute?.find((a) => a.name === 'to')?.i ?? 0) : undefined;
    const dq = n.opType === 'DequantizeLinear' || n.opType === 'MatMulNBits' ? FLOAT : undefined;
    const type = cast ?? dq ?? FIXED[n.opType ?? ''] ?? t.get(n.input?.[0] ?? '') ?? 0;
    for (const o of n.output ?? []) t.set(o, type);
  }
  return t;
}

/** The scoped float node outputs of a graph, in graph order, with their node. */
export function probedValues(modelPath: string): Array<{ node: string; op: string; value: string; inputs: string[] }> {
  const g = OnnxModel.load(modelPath).graph;
  const types = valueTypes(g);
  const outputs = new Set((g.output ?? []).map((o) => o.name));
  return (g.node ?? []).flatMap((n) => (n.name ?? '').includes('/') ? (n.output ?? []).filter((o) => o && types.get(o) === FLOAT && !outputs.has(o)).map((o) => ({ node: n.name!, op: n.opType!, value: o, inputs: (n.input ?? []).filter((i) => types.get(i) === FLOAT) })) : []);
}

export const scopeOf = (node: string) => node.slice(0, node.lastIndexOf('/'));
export const layerOf = (node: string) => {
  const m = /^layers\.(\d+)\//.exec(node);
  return m ? Number(m[1]) : null;
};

async function firstCases(cases: AsyncIterable<GateCase>, n: number): Promise<GateCase[]> {
  const out: GateCase[] = [];
  for await (const c of cases) {
    // gateCases refills its buffers in place: copies.
    out.push({ ...c, feeds: Object.fromEntries(Object.entries(c.feeds).map(([k, f]) => [k, { ...f, data: f.data.slice() }])) });
    if (out.length >= n) break;
  }
  return out;
}

async function* replay(cases: GateCase[]): AsyncIterable<GateCase> {
  for (const c of cases) yield c;
}

const maxAbsFinite = (a: Float32Array) => {
  let m = 0;
  for (const v of a) if (Number.isFinite(v) && Math.abs(v) > m) m = Math.abs(v);
  return m;
};

export interface ProbeInput<C> {
  family: Family<C>; config: C; entry: GraphEntry; trace: Trace; maxContext: number;
  /** The shipped export the graph is from. */
  graphsDir: string;
  arch: HtpArch; fp16: boolean; threshold: number; python: string; script: string; timeoutSeconds: number;
  /** Where probe results are kept, by graph hash and case count: a second bisect reads them. */
  cacheDir: string;
  /** Traced cases probed (the first ones in trace order; default 4). */
  cases?: number;
  log?: (m: string) => void;
}

export async function probeGraph<C>(o: ProbeInput<C>): Promise<ProbeResult> {
  const t0 = performance.now();
  const model = join(o.graphsDir, o.entry.file);
  const n = o.cases ?? 4;
  const sha = await sha256OfFile(model);
  // The graph file holds no weights (they are external data) and the cases come from the trace: two
  // checkpoints with one architecture give the same file. The key adds the export's and the trace's
  // cache entries (each named by the digest of everything it was made from).
  const from = createHash('sha256').update(`${sha}\n${realpathSync(o.graphsDir)}\n${realpathSync(o.trace.dir)}`).digest('hex');
  const cacheFile = join(o.cacheDir, `${from.slice(0, 32)}.${o.fp16 ? 'fp16' : 'fp32'}.${n}.${o.threshold}.json`);
  if (existsSync(cacheFile)) return { ...(JSON.parse(readFileSync(cacheFile, 'utf8')) as ProbeResult), cached: true, seconds: (performance.now() - t0) / 1000 };
  const values = probedValues(model);
  if (!values.length) throw new Error(`${model}: no scoped node outputs to probe (its nodes have no layers.i/… names: exported before name scopes?)`);
  const names = values.map((v) => v.value);
  const work = join(o.cacheDir, `.work-${process.pid}`);
  rmSync(work, { recursive: true, force: true });
  mkdirSync(work, { recursive: true });
  try {
    const cases = await firstCases(gateCasesOf(o.family, o.config, o.entry, o.trace, o.maxContext, o.graphsDir), n);
    // The CPU: the oracle gate's form of the graph, one case a call, the probes as outputs; no cache
    // window (it would shorten the attention's values, which the simulator computes over the whole cache).
    const cpu = new Map<string, Float32Array[]>();
    const form = gateForm(o.entry, 1, false);
    const { path } = writeGateModel(model, names, join(work, 'cpu'), formOptions(o.entry, form));
    const session = await ort.InferenceSession.create(path, gateSessionOptions(form.copies));
    try {
      await runGateCases(session, o.entry.file, replay(cases), form, (_c, output) => {
        for (const v of names) (cpu.get(v) ?? cpu.set(v, []).get(v)!).push(output(v).slice());
      });
    } finally {
      await session.release();
    }
    // The simulator: the same graph with the same extra outputs, compiled for the arch.
    o.log?.(`probe: compiling ${o.entry.name} with ${names.length} op outputs for the simulator`);
    const simModel = writeProbeModel(model, names, join(work, 'sim'));
    const report = await compileContext({ graphs: [simModel], outDir: join(work, 'ctx'), contextName: 'probe', arch: { socModel: o.arch.socModel, dspArch: o.arch.dspArch, vtcmMb: o.arch.vtcmMb }, fp16: o.fp16, timeoutSeconds: o.timeoutSeconds, separate: true, python: o.python });
    const wrapper = report.wrappers[0].path;
    const feeds = join(work, 'feeds.safetensors');
    const out = join(work, 'out.safetensors');
    await writeFeeds(feeds, cases);
    o.log?.(`probe: running ${cases.length} cases of ${o.entry.name} on the simulator`);
    await simulateBatch(o.python, o.script, wrapper, o.arch, o.fp16, feeds, out, o.timeoutSeconds, `probing ${o.entry.name}`);
    const sim = new Map<string, Float32Array[]>();
    const file = await openSafetensors(out);
    try {
      for (const v of names) {
        sim.set(v, await Promise.all(cases.map(async (_c, i) => {
          const info = file.tensors.get(`${i}/${v}`);
          if (!info) throw new Error(`probing ${o.entry.name}: the simulator gave no ${v} for case ${i}`);
          return toFloat32(info.dtype, await file.read(info.name));
        })));
      }
    } finally {
      await file.close();
    }
    // Graph inputs' magnitudes (what reads the attention mask reads −1e9 on purpose).
    const inputMax = new Map<string, number>();
    for (const c of cases) for (const [k, f] of Object.entries(c.feeds)) if (f.data instanceof Float32Array) inputMax.set(k, Math.max(inputMax.get(k) ?? 0, maxAbsFinite(f.data)));
    const cpuMax = new Map<string, number>();
    // A value whose CPU form differs in size (a rewrite of the gate's CPU form) is left out, and counted.
    const same = values.filter((v) => cpu.get(v.value)!.every((c, i) => c.length === sim.get(v.value)![i].length));
    const ops: OpFigure[] = same.map((v) => {
      const c = cpu.get(v.value)!, s = sim.get(v.value)!;
      let cosine = 1, simMaxAbs = 0, simNonFinite = 0, simSaturated = 0;
      for (let i = 0; i < c.length; i++) {
        cosine = Math.min(cosine, compare(s[i], c[i]).cosine);
        for (const x of s[i]) {
          if (!Number.isFinite(x)) simNonFinite++;
          else if (Math.abs(x) >= FP16_MAX) simSaturated++;
        }
        simMaxAbs = Math.max(simMaxAbs, maxAbsFinite(s[i]));
      }
      const cpuMaxAbs = Math.max(...c.map(maxAbsFinite));
      cpuMax.set(v.value, cpuMaxAbs);
      const inputMaxAbs = Math.max(0, ...v.inputs.map((i) => cpuMax.get(i) ?? inputMax.get(i) ?? 0));
      return { node: v.node, op: v.op, scope: scopeOf(v.node), layer: layerOf(v.node), value: v.value, cosine, cpuMaxAbs, inputMaxAbs, simMaxAbs, simNonFinite, simSaturated };
    });
    // The simulator must show it: a value out of fp16's range the HTP still got right (it did on a
    // square of 1.3e5 here) is not the fault.
    const overflow = ops.find((x) => x.cpuMaxAbs > FP16_MAX && x.inputMaxAbs <= FP16_MAX && (x.simNonFinite > 0 || x.cosine < o.threshold));
    const nonFinite = ops.find((x) => x.simNonFinite > 0 && x.inputMaxAbs <= FP16_MAX);
    const low = ops.find((x) => x.cosine < o.threshold);
    const [first, why] = overflow ? [overflow, 'overflow' as const] : nonFinite ? [nonFinite, 'non-finite' as const] : low ? [low, 'cosine' as const] : [undefined, undefined];
    const result: ProbeResult = { graph: o.entry.name, ...(values.length > same.length ? { skipped: values.length - same.length } : {}), cases: cases.map((c) => ({ prompt: c.prompt, step: c.step })), ops, ...(first ? { first, why } : {}), graphSha256: sha, cached: false, seconds: (performance.now() - t0) / 1000 };
    writeFileSync(cacheFile, JSON.stringify(result));
    return result;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
