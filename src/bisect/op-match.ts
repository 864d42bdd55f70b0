// forge bisect, quantization link: the ops of one layer's graph at fp32 and the same layer at the
// shipped precision, paired. The two graphs come from the same builder but differ where a matrix is
// read: fp32 is Reshape → Gemm(x, Cast(w)) → Reshape, W4/W8 is MatMulNBits(x, codes, scales) (or
// Gemm on a DequantizeLinear), so node names (`layers.2/Gemm_3` vs `layers.2/MatMulNBits_3`) and
// the value names made from them do not line up. An op is paired by what it computes instead: its
// type and the keys of its activation inputs, a matmul by its matrix (the checkpoint tensor its
// weight initializer is named after) and its activation input; ops that only reshape (Reshape,
// Squeeze, Pad with zeros …) are the value they read, not ops of their own. Weights and constants
// (values no graph input reaches) are not ops either.
import { OnnxModel } from '../onnx/reader.js';
import { onnx } from '../onnx/proto.js';
import { valueTypes } from './probe.js';

/** One op output of a graph, activation-derived and float. */
export interface GraphOp {
  node: string;
  op: string;
  /** The value it makes (its name in this graph). */
  value: string;
  /** The values it reads that are activations (another op's value or a graph input), aliases resolved. */
  inputs: string[];
  /** A matmul's matrix: the checkpoint tensor of its weight (`model.layers.2.mlp.down_proj.weight`). */
  matrix?: string;
  /** What it computes, the same in both graphs (interned: see OpKeys). */
  key: string;
}

/** Ops that keep their input's numbers in the same order (shape, or zero padding): a value, not an op. */
const ALIAS = new Set(['Reshape', 'Squeeze', 'Unsqueeze', 'Flatten', 'Identity', 'Pad']);
const MATMUL = new Set(['Gemm', 'MatMul', 'MatMulNBits', 'FusedMatMul']);

/** Interns key strings to short ids: one instance for both graphs, so equal computations get equal keys. */
export class OpKeys {
  private readonly ids = new Map<string, string>();
  id(text: string): string {
    let k = this.ids.get(text);
    if (k === undefined) this.ids.set(text, (k = `k${this.ids.size}`));
    return k;
  }
}

/**
 * The float ops of a graph in graph order, each with its key. A key seen twice in one graph (two
 * ops that compute the same thing from the same inputs) gets its occurrence appended.
 */
export function graphOps(modelPath: string, keys: OpKeys): GraphOp[] {
  const g = OnnxModel.load(modelPath).graph;
  const types = valueTypes(g);
  const inits = new Set((g.initializer ?? []).map((t) => t.name!));
  const key = new Map<string, string>();
  // A constant value's root initializer: what a weight read (Cast, DequantizeLinear …) starts from.
  const root = new Map<string, string>();
  const alias = new Map<string, string>();
  for (const i of g.input ?? []) if (!inits.has(i.name!)) key.set(i.name!, keys.id(`in:${i.name}`));
  for (const i of inits) root.set(i, i);
  const seen = new Map<string, number>();
  const ops: GraphOp[] = [];
  const real = (v: string) => alias.get(v) ?? v;
  for (const n of g.node ?? []) {
    const ins = (n.input ?? []).filter((i) => i);
    const act = ins.filter((i) => key.has(i));
    if (!act.length) {
      // Weights and constants: remember where they come from.
      const r = ins.map((i) => root.get(i)).find((x) => x !== undefined);
      for (const o of n.output ?? []) if (o) root.set(o, r ?? o);
      continue;
    }
    const type = n.opType ?? '';
    if (ALIAS.has(type)) {
      const src = ins[0];
      for (const o of n.output ?? []) if (o && key.has(src)) {
        key.set(o, key.get(src)!);
        alias.set(o, real(src));
      }
      continue;
    }
    const weights = ins.filter((i) => !key.has(i)).map((i) => root.get(i) ?? i);
    const matrix = MATMUL.has(type) && act.length === 1 && weights.length ? matrixName(weights[0]) : undefined;
    const outs = n.output ?? [];
    outs.forEach((o, k) => {
      if (!o) return;
      const text = matrix ? `mm(${matrix},${key.get(act[0])})` : `${type}(${ins.map((i) => key.get(i) ?? 'c').join(',')})${outs.length > 1 ? `#${k}` : ''}`;
      const count = seen.get(text) ?? 0;
      seen.set(text, count + 1);
      const id = keys.id(count ? `${text}@${count}` : text);
      key.set(o, id);
      if (types.get(o) !== onnx.TensorProto.DataType.FLOAT) return;
      ops.push({ node: n.name ?? '', op: type, value: o, inputs: [...new Set(act.map(real))], ...(matrix ? { matrix } : {}), key: id });
    });
  }
  return ops;
}

/** The checkpoint tensor a weight initializer stores (a row range's or a scale's name less its suffix). */
export const matrixName = (init: string) => init.replace(/\.scale$/, '').replace(/\.rows_\d+_\d+$/, '');

/** The shipped graph's ops that the fp32 graph computes too (by key), each with its fp32 value's name. */
export function pairOps(shipped: GraphOp[], fp32: GraphOp[]): Array<{ shipped: GraphOp; fp32: GraphOp }> {
  const byKey = new Map(fp32.map((o) => [o.key, o]));
  return shipped.flatMap((s) => {
    const f = byKey.get(s.key);
    return f ? [{ shipped: s, fp32: f }] : [];
  });
}
