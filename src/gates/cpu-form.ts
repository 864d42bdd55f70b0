// The CPU-gate form of a graph: the same numbers as the graph itself on ONNX Runtime's CPU EP, in a
// form its fast kernels run, with every weight still read from the export's (memory-mapped) files.
//
// Why: at 4B size the W8 graphs' com.microsoft MatMulNBits(bits=8) has no packed CPU kernel in ORT
// 1.30 (MLAS packs 8-bit B only for int8 activations, accuracy_level 4, which changes the numbers),
// so each call dequantizes the whole weight into a freshly allocated fp32 buffer and runs SGEMM on
// it: > 28 min for one decode graph. What the form does instead (each rewrite gives the graph's own
// numbers bit for bit; test/gates/cpu-form.test.ts holds it to that):
//  - MatMulNBits(bits=8, codes, per-row scales, implicit zero point 128) → DequantizeLinear(axis 0,
//    zero point 128) → com.microsoft FusedMatMul(transB=1): MatMulNBits' own fallback (dequantize,
//    then MlasGemm(NoTrans, Trans)) spelled in other ops, so the same SGEMM call sums the same way.
//    MatMulNBits(bits=4) (W4 blocks): the same, its nibbles unpacked and scaled per block in float
//    ops (opset 17 has no blocked or 4-bit DequantizeLinear; matMulNBits4).
//  - In a one-token graph (decode, lm-head) each such weight, and each Cast(bf16|fp16 weight) →
//    Gemm(transB=1), is split into row blocks of about `blockBytes` of fp32 (each an external
//    initializer pointing into the same file at its rows' offset), dequantized or cast block by
//    block into a cache-sized buffer, and the Gemm outputs concatenated. With one activation row
//    MLAS's SGEMM takes its M=1 path, where each output is one dot product over K whatever the
//    block, so the numbers do not change; the weight's bytes are read once per call instead of
//    written and read again as fp32. Multi-row (prefill) graphs keep whole weights: there the
//    SGEMM's K stride depends on the columns each thread gets, which blocks would change.
//  - Copies (`copies` > 1, one-token graphs): the graph's activation nodes repeated once per case
//    of a batch of teacher-forced cases, every weight block dequantized or cast once and fed to
//    each copy's own M=1 Gemm, so one conversion and one cache-resident read of the block serve
//    `copies` cases. Each copy runs the very kernels one case runs alone (a batched [B,1,K] MatMul
//    would not: ORT flattens it to one M=B SGEMM, other sums). A block's products meet in one
//    Concat across the copies, which keeps the copies in step: ORT runs a block's conversion and
//    all its Gemms together instead of holding every converted block for the later copies.
//    Inputs named in `sharedInputs` (the KV caches) are fed once, to every copy.
//  - A cache window (`window`, one-token graphs): the KV-cache inputs and the attention mask are
//    cut, inside the graph, to the first W slots (plus the new token's), W fed per call (see
//    windowRows): the gate's prompts fill ~100 of a 4B graph's 4,096 slots, and each copy's
//    attention otherwise transposed, concatenated and multiplied the whole cache (45 % of a decode
//    case). The slots cut are masked for every case of the call, so their softmax weights are 0, and
//    W is a multiple of WINDOW_GRANULE = MLAS's SGEMM K stride (128): probs·V then adds the same
//    partial sums in the same order (the cut stride blocks added exact zeros), the softmax's vector
//    lanes see the same elements, and every score is the same dot product over the head dim.
//  - Session options (CPU_GATE_SESSION_OPTIONS): no constant folding (it would turn a Cast of a
//    bf16 weight into a private fp32 copy, 16 GB at 4B) and no prepacking (ORT copies every
//    constant Gemm weight into a private packed buffer: the fp32 graphs' 8 GB).
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type * as ort from 'onnxruntime-node';
import { OnnxModel } from '../onnx/reader.js';
import { onnx, toNumber } from '../onnx/proto.js';
import { linkOrCopy } from '../io/files.js';
import { GRAPHS_JSON, type ExportManifest } from '../export/graphs.js';
import { writeProbeModel } from './probe.js';

const DT = onnx.TensorProto.DataType;
const MS = 'com.microsoft';

/**
 * ORT session options the gate runs a CPU form with. 'basic' keeps ORT off the level-2 rewrites
 * that turn DequantizeLinear→MatMul into int8 kernels quantizing activations (not what the graph
 * says); ConstantFolding off keeps each weight's Cast/DequantizeLinear per call, reading the mapped
 * file, instead of a private fp32 copy; prepacking off keeps constant fp32 Gemm weights mapped too.
 */
export const CPU_GATE_SESSION_OPTIONS: ort.InferenceSession.SessionOptions = {
  graphOptimizationLevel: 'basic',
  extra: {
    session: { disable_prepacking: '1' },
    optimization: { disable_specified_optimizers: 'ConstantFolding' },
  },
};

/**
 * Session options for a CPU form of `copies` copies: CPU_GATE_SESSION_OPTIONS, and with copies ORT's
 * QDQ transformers off, whose EnsureUniqueDQForNodeUnit (level basic) would give each copy's Gemm
 * its own DequantizeLinear of a shared block: the conversion once per copy again (measured: 8× the
 * DequantizeLinear calls). One copy has one consumer per block, so the option changes nothing there.
 */
export function gateSessionOptions(copies: number): ort.InferenceSession.SessionOptions {
  if (copies === 1) return CPU_GATE_SESSION_OPTIONS;
  const extra = CPU_GATE_SESSION_OPTIONS.extra as { session: Record<string, string>; optimization: Record<string, string> };
  return { ...CPU_GATE_SESSION_OPTIONS, extra: { ...extra, session: { ...extra.session, disable_quant_qdq: '1' } } };
}

/**
 * fp32 bytes of one row block: its dequantized copy stays in cache (L3) between being written and
 * read. Smaller blocks mean more nodes, and ORT 1.30's session load grows faster than linearly with
 * them (measured: 2,432 blocks of 640 KB load in 10 s, 608 in 0.6 s); 4 MiB gives ~1,800 blocks per
 * 4B shard, loaded in ~7 s.
 */
export const DEFAULT_BLOCK_BYTES = 4 << 20;

/** The graph input (int64 [1]) a windowed form reads its per-call window W from. */
export const WINDOW_INPUT = 'cpu_form_window';
/** W is a multiple of this: MLAS_SGEMM_STRIDEK, the K stride of ORT's fp32 SGEMM (see the top). */
export const WINDOW_GRANULE = 128;

/** A one-token graph's KV-cache inputs [1, kv, ctx, d] (position axis 2) and additive mask [1, 1, 1, ctx + 1]. */
export interface CacheWindow {
  cache: string[];
  mask: string;
}

/**
 * The window W a call of a windowed form needs: every slot any of its cases' masks (`masks`, each
 * [ctx + 1] values, the last the new token's) leaves visible (above MASKED), rounded up to
 * WINDOW_GRANULE, at most ctx.
 */
export function windowRows(masks: Float32Array[], ctx: number, masked: number): number {
  let need = 1;
  for (const m of masks) {
    if (m.length !== ctx + 1) throw new Error(`cache window: a mask of ${m.length} values, not ctx + 1 = ${ctx + 1}`);
    for (let j = ctx - 1; j >= need; j--) if (m[j] > masked) { need = j + 1; break; }
  }
  return Math.min(ctx, Math.ceil(need / WINDOW_GRANULE) * WINDOW_GRANULE);
}

export interface CpuFormOptions {
  /** Activation rows per call (the graph's tokens): weights are split into row blocks only when 1. */
  tokensPerCall: number;
  /** Target fp32 bytes per row block (rows rounded down to a multiple of 16, at least 16). */
  blockBytes?: number;
  /** Cases per call (one-token graphs): the graph's copies, copy b's values named copyName(v, b). */
  copies?: number;
  /** Graph inputs every copy reads as they are (fed once); the others get one per copy. */
  sharedInputs?: string[];
  /** One-token graphs: cut the KV cache and mask to a window fed per call in WINDOW_INPUT (see the top). */
  window?: CacheWindow;
}

/** Copy b's name of a value (copy 0 keeps the graph's own names). */
export function copyName(name: string, b: number): string {
  return b === 0 ? name : `${name}#${b}`;
}

export interface CpuFormStats {
  /** MatMulNBits nodes rewritten to DequantizeLinear → Gemm. */
  matMulNBits: number;
  /** Cast(bf16|fp16 weight) → Gemm pairs split into row blocks. */
  castGemm: number;
  /** Row blocks written in all (a weight left whole counts as one). */
  blocks: number;
  /** Nodes left as they were because the form does not cover them, each with the reason. */
  kept: string[];
}

type Tensor = onnx.ITensorProto;
type Node = onnx.INodeProto;

function attrInt(n: Node, name: string, dflt?: number): number {
  const a = n.attribute?.find((x) => x.name === name);
  if (!a) {
    if (dflt === undefined) throw new Error(`node ${n.name}: attribute ${name} missing`);
    return dflt;
  }
  return toNumber(a.i);
}

function attrF(n: Node, name: string, dflt: number): number {
  const a = n.attribute?.find((x) => x.name === name);
  return a ? (a.f ?? 0) : dflt;
}

const intAttr = (name: string, i: number): onnx.IAttributeProto => ({ name, type: onnx.AttributeProto.AttributeType.INT, i });

function externalOf(t: Tensor): { location: string; offset: number; length: number } | undefined {
  if (t.dataLocation !== onnx.TensorProto.DataLocation.EXTERNAL) return undefined;
  const kv = Object.fromEntries((t.externalData ?? []).map((e) => [e.key ?? '', e.value ?? '']));
  return { location: kv.location, offset: Number(kv.offset ?? 0), length: Number(kv.length ?? 0) };
}

/**
 * Rows [r0, r0+n) of a 2-D-in-effect weight (first dim = rows) as a tensor of its own: a reference
 * at the rows' offset in the same data file when external, else a copy of those raw bytes.
 */
function rowSlice(t: Tensor, name: string, rowBytes: number, r0: number, n: number, cols: number): Tensor {
  const slice: Tensor = { name, dataType: t.dataType, dims: [n, cols] };
  const ext = externalOf(t);
  if (ext) {
    slice.dataLocation = onnx.TensorProto.DataLocation.EXTERNAL;
    slice.externalData = [
      { key: 'location', value: ext.location },
      { key: 'offset', value: String(ext.offset + r0 * rowBytes) },
      { key: 'length', value: String(n * rowBytes) },
    ];
  } else {
    if (!t.rawData?.byteLength) throw new Error(`initializer ${t.name}: inline data not in raw_data`);
    slice.rawData = t.rawData.subarray(r0 * rowBytes, (r0 + n) * rowBytes);
  }
  return slice;
}

/** Rows per block for a weight with `cols` columns: about blockBytes of fp32, a multiple of 16, at least 16. */
export function blockRows(cols: number, blockBytes = DEFAULT_BLOCK_BYTES): number {
  return Math.max(16, Math.floor(blockBytes / (cols * 4) / 16) * 16);
}

class Rewriter {
  readonly stats: CpuFormStats = { matMulNBits: 0, castGemm: 0, blocks: 0, kept: [] };
  private readonly inits = new Map<string, Tensor>();
  private readonly consumers = new Map<string, number>();
  private readonly producers = new Map<string, Node>();
  private readonly names = new Set<string>();
  private readonly drop = new Set<string>();
  private readonly added: Tensor[] = [];
  private readonly addedByName = new Map<string, Tensor>();
  private readonly zeroPoints = new Map<number, string>();
  private counter = 0;
  /** Values each copy has its own of (copies > 1): per-copy graph inputs and what is computed from them. */
  private readonly perCopy = new Set<string>();

  constructor(private readonly model: OnnxModel, private readonly o: Required<Omit<CpuFormOptions, 'window'>> & Pick<CpuFormOptions, 'window'>) {
    const g = model.graph;
    if (!Number.isInteger(o.copies) || o.copies < 1) throw new Error(`CPU form: copies must be a positive integer, not ${o.copies}`);
    if (o.copies > 1 && o.tokensPerCall !== 1) throw new Error(`${model.path}: copies are for one-token graphs (this one takes ${o.tokensPerCall} tokens per call)`);
    const inputs = new Set((g.input ?? []).map((v) => v.name!));
    for (const n of o.sharedInputs) if (!inputs.has(n)) throw new Error(`${model.path}: shared input ${n} is not an input of the graph`);
    if (o.copies > 1) for (const v of inputs) if (!o.sharedInputs.includes(v)) this.perCopy.add(v);
    for (const t of g.initializer ?? []) this.inits.set(t.name!, t);
    for (const n of g.node ?? []) {
      for (const i of n.input ?? []) this.consumers.set(i, (this.consumers.get(i) ?? 0) + 1);
      for (const out of n.output ?? []) this.producers.set(out, n);
      this.names.add(n.name ?? '');
      for (const v of [...(n.input ?? []), ...(n.output ?? [])]) this.names.add(v);
    }
    for (const v of [...(g.input ?? []), ...(g.output ?? [])]) {
      this.names.add(v.name!);
      this.consumers.set(v.name!, (this.consumers.get(v.name!) ?? 0) + 1); // a graph output is a consumer too
    }
    for (const t of g.initializer ?? []) this.names.add(t.name!);
  }

  private fresh(base: string): string {
    let n: string;
    do n = `${base}.cpu${this.counter++}`; while (this.names.has(n));
    this.names.add(n);
    return n;
  }

  private node(opType: string, inputs: string[], attrs: onnx.IAttributeProto[] = [], base = opType, domain?: string): string {
    const out = this.fresh(`${base}_out`);
    this.out.push({ name: this.fresh(base), opType, input: inputs, output: [out], attribute: attrs, ...(domain ? { domain } : {}) });
    return out;
  }

  private initializer(t: Tensor): string {
    this.added.push(t);
    this.addedByName.set(t.name!, t);
    return t.name!;
  }

  private zeroPoint128(n: number): string {
    let name = this.zeroPoints.get(n);
    if (!name) {
      name = this.initializer({ name: this.fresh(`zero_point_128x${n}`), dataType: DT.UINT8, dims: [n], rawData: new Uint8Array(n).fill(128) });
      this.zeroPoints.set(n, name);
    }
    return name;
  }

  private out: Node[] = [];
  /** The graph's default-domain opset (read in run()). */
  private opset = 0;

  /** `name` as copy b sees it: its own when the value is per copy, else the one shared value. */
  private rn(name: string, b: number): string {
    return name && this.perCopy.has(name) ? copyName(name, b) : name;
  }

  /**
   * Emits a node of the graph: once when it reads no per-copy value (weights, constants), else
   * once per copy, copy b reading and writing copy b's values.
   */
  private emit(n: Node): void {
    if (this.o.copies === 1 || !(n.input ?? []).some((i) => this.perCopy.has(i))) {
      this.out.push(n);
      return;
    }
    for (const v of n.output ?? []) this.perCopy.add(v);
    for (let b = 0; b < this.o.copies; b++) {
      const outs = (n.output ?? []).map((v) => this.copyValue(v, b));
      this.out.push({ ...n, name: this.copyValue(n.name ?? '', b), input: (n.input ?? []).map((i) => this.rn(i, b)), output: outs });
    }
  }

  private copyValue(v: string, b: number): string {
    if (b === 0 || !v) return v;
    const c = copyName(v, b);
    if (this.names.has(c)) throw new Error(`${this.model.path}: copy name ${c} is taken in the graph`);
    this.names.add(c);
    return c;
  }

  run(): CpuFormStats {
    const g = this.model.graph;
    const defaultOpset = (this.model.proto.opsetImport ?? []).find((o) => !o.domain)?.version;
    this.opset = defaultOpset == null ? 0 : toNumber(defaultOpset);
    if (defaultOpset == null || this.opset < 13) throw new Error(`${this.model.path}: the CPU form needs ONNX opset 13 or later (per-axis DequantizeLinear), the graph imports ${defaultOpset ?? 'none'}`);
    if (this.o.window) this.openWindow(this.o.window);
    for (const n0 of g.node ?? []) {
      const n = this.windowed(n0);
      if (n.opType === 'MatMulNBits' && n.domain === 'com.microsoft') {
        const why = this.matMulNBits(n);
        if (why) {
          this.stats.kept.push(`${n.name}: ${why}`);
          this.emit(n);
        }
        continue;
      }
      if (n.opType === 'Gemm' && this.castGemm(n)) continue;
      this.emit(n);
    }
    // The Casts of split weights (each came before its Gemm) go: the blocks cast themselves.
    this.out = this.out.filter((n) => !(n.opType === 'Cast' && this.drop.has(n.output![0])));
    g.node = this.out;
    const used = new Set(this.out.flatMap((n) => n.input ?? []));
    g.initializer = [...(g.initializer ?? []).filter((t) => used.has(t.name!) || !this.replaced.has(t.name!)), ...this.added];
    if (this.o.copies > 1) {
      const copiesOf = (vs: onnx.IValueInfoProto[], what: string) => vs.flatMap((v) => {
        if (!this.perCopy.has(v.name!)) {
          if (what === 'output') throw new Error(`${this.model.path}: output ${v.name} does not depend on any per-copy input`);
          return [v];
        }
        return Array.from({ length: this.o.copies }, (_, b) => ({ ...v, name: copyName(v.name!, b) }));
      });
      g.input = copiesOf(g.input ?? [], 'input');
      g.output = copiesOf(g.output ?? [], 'output');
    }
    return this.stats;
  }

  private readonly replaced = new Set<string>();

  /** Windowed values (the cut caches and mask) by the graph input they replace. */
  private readonly windowOf = new Map<string, string>();
  /** Values computed from a windowed one: their position axis has W + 1 slots, not ctx + 1. */
  private readonly inWindow = new Set<string>();
  private windowSlots = 0;

  /** A node (emitted like the graph's own: per copy when it reads a per-copy value); returns its output. */
  private emitOp(opType: string, inputs: string[], attrs: onnx.IAttributeProto[] = []): string {
    const out = this.fresh(`${opType}_out`);
    this.emit({ name: this.fresh(opType), opType, input: inputs, output: [out], attribute: attrs });
    return out;
  }

  private int64(name: string, values: number[]): string {
    return this.initializer({ name: this.fresh(name), dataType: DT.INT64, dims: [values.length], rawData: new Uint8Array(BigInt64Array.from(values.map(BigInt)).buffer) });
  }

  /** Cuts each cache input to its first W rows and the mask to its first W slots and the new token's. */
  private openWindow(w: CacheWindow): void {
    const g = this.model.graph;
    const dimsOf = (name: string) => {
      const v = (g.input ?? []).find((x) => x.name === name);
      if (!v) throw new Error(`${this.model.path}: cache window: ${name} is not an input of the graph`);
      return (v.type?.tensorType?.shape?.dim ?? []).map((d) => (d.dimValue == null ? NaN : toNumber(d.dimValue)));
    };
    if (this.o.tokensPerCall !== 1) throw new Error(`${this.model.path}: a cache window is for one-token graphs`);
    const maskDims = dimsOf(w.mask);
    const ctx = maskDims[3] - 1;
    if (maskDims.length !== 4 || !(ctx > 0)) throw new Error(`${this.model.path}: cache window: mask ${w.mask} is [${maskDims}], not [1, 1, 1, ctx + 1]`);
    for (const c of w.cache) {
      const d = dimsOf(c);
      if (d.length !== 4 || d[2] !== ctx) throw new Error(`${this.model.path}: cache window: ${c} is [${d}], not [1, kv, ${ctx}, d]`);
    }
    (g.input ??= []).push({ name: WINDOW_INPUT, type: { tensorType: { elemType: DT.INT64, shape: { dim: [{ dimValue: 1 }] } } } });
    this.names.add(WINDOW_INPUT);
    const zero = this.int64('window_start', [0]);
    for (const c of w.cache) this.windowOf.set(c, this.emitOp('Slice', [c, zero, WINDOW_INPUT, this.int64('axis', [2])]));
    const slots = this.emitOp('Slice', [w.mask, zero, WINDOW_INPUT, this.int64('axis', [3])]);
    const own = this.emitOp('Slice', [w.mask, this.int64('ctx', [ctx]), this.int64('ctx1', [ctx + 1]), this.int64('axis', [3])]);
    this.windowOf.set(w.mask, this.emitOp('Concat', [slots, own], [intAttr('axis', 3)]));
    for (const v of this.windowOf.values()) this.inWindow.add(v);
    this.windowSlots = ctx + 1;
  }

  /**
   * A node of the graph as the windowed form reads it: the windowed caches and mask in place of the
   * inputs, and a Reshape of a windowed value given -1 where its shape constant says ctx + 1 slots.
   */
  private windowed(n: Node): Node {
    if (!this.windowOf.size || !(n.input ?? []).some((i) => this.windowOf.has(i) || this.inWindow.has(i))) return n;
    const input = (n.input ?? []).map((i) => this.windowOf.get(i) ?? i);
    for (const o of n.output ?? []) this.inWindow.add(o);
    if (n.opType !== 'Reshape' || !this.inWindow.has(input[0])) return { ...n, input };
    const shape = this.inits.get(input[1]);
    const dims = shape && shape.dataType === DT.INT64 ? Array.from(new BigInt64Array(Uint8Array.from(this.model.initializerBytes(input[1])).buffer), Number) : undefined;
    if (!dims) throw new Error(`${this.model.path}: cache window: Reshape ${n.name} of a cached value has no int64 initializer shape`);
    const at = dims.flatMap((d, k) => (d === this.windowSlots ? [k] : []));
    if (at.length === 0) return { ...n, input };
    if (at.length > 1 || dims.includes(-1)) throw new Error(`${this.model.path}: cache window: Reshape ${n.name} to [${dims}]: cannot tell its slot axis`);
    dims[at[0]] = -1;
    this.replaced.add(input[1]); // dropped unless another node still reads it
    return { ...n, input: [input[0], this.int64(`${input[1]}.window`, dims)] };
  }

  private readonly ready = new Map<string, string>();
  private zero: string | undefined;

  /** A boolean true computed from `x` (Size(x) > 0): a data dependency on x for nodes that need one. */
  private readyFlag(x: string): string {
    let flag = this.ready.get(x);
    if (!flag) {
      this.zero ??= this.initializer({ name: this.fresh('zero'), dataType: DT.INT64, dims: [], rawData: new Uint8Array(8) });
      const zero = this.zero;
      flag = this.node('Greater', [this.node('Size', [x]), zero]);
      this.ready.set(x, flag);
    }
    return flag;
  }

  /** Rewrites one MatMulNBits, or says why it is kept. */
  private matMulNBits(n: Node): string | undefined {
    const [a, bName, sName, ...rest] = n.input ?? [];
    if (rest.some((i) => i)) return 'has a zero-point, g_idx or bias input';
    const bits = attrInt(n, 'bits');
    if (bits !== 8 && bits !== 4) return `bits=${bits}`;
    const K = attrInt(n, 'K');
    const N = attrInt(n, 'N');
    const bs = attrInt(n, 'block_size');
    const b = this.inits.get(bName);
    const s = this.inits.get(sName);
    if (!b || !s) return 'codes or scales are not initializers';
    if (b.dataType !== DT.UINT8 || s.dataType !== DT.FLOAT) return 'codes not uint8 or scales not float';
    const blocks = Math.ceil(K / bs);
    if (blocks * bs !== K) return `K=${K} is not a multiple of block_size ${bs}`;
    if (bits === 4) return this.matMulNBits4(n, a, b, s, K, N, bs);
    const scales = new Float32Array(Uint8Array.from(this.model.initializerBytes(sName)).buffer); // a copy: inline bytes are a view into the model's buffer
    if (scales.length !== N * blocks) return `${scales.length} scales for N=${N} × ${blocks} blocks`;
    const rowScales = new Float32Array(N);
    for (let r = 0; r < N; r++) {
      rowScales[r] = scales[r * blocks];
      for (let k = 1; k < blocks; k++) if (!Object.is(scales[r * blocks + k], rowScales[r])) return `row ${r} has more than one scale (block-wise, not per-row W8)`;
    }
    this.replaced.add(bName);
    this.replaced.add(sName);
    this.stats.matMulNBits++;
    const ready = this.readyFlag(a);
    this.rowBlocks(N, K, (r0, rows, tag) => {
      const w = this.initializer(rowSlice(b, this.fresh(`${bName}${tag}`), K, r0, rows, K));
      const sc = this.initializer({ name: this.fresh(`${sName}${tag}`), dataType: DT.FLOAT, dims: [rows], rawData: new Uint8Array(rowScales.slice(r0, r0 + rows).buffer) });
      // The scales pass through Where(ready, s, s) (the same values) so the dequantization waits
      // for its activation: with only initializer inputs ORT runs it as early as it likes, and
      // at 4B a prefill graph then held ~7 GB of dequantized weights at once (measured 9.7 GB).
      const gated = this.node('Where', [ready, sc, sc]);
      return this.node('DequantizeLinear', [w, gated, this.zeroPoint128(rows)], [intAttr('axis', 0)]);
    }, a, n.output![0], true);
    return undefined;
  }

  /**
   * MatMulNBits(bits=4, zero point 8) the way its CPU fallback computes it: each row block's codes
   * (two a byte, low nibble first) unpacked in float (lo = f − 16·⌊f/16⌋, hi = ⌊f/16⌋: exact),
   * (q − 8)·s with one rounding per weight, then FusedMatMul(transB=1) as for W8. The codes and the
   * scales stay references into the export's file, sliced by rows.
   */
  private matMulNBits4(n: Node, a: string, b: Tensor, s: Tensor, K: number, N: number, bs: number): undefined {
    const blocks = K / bs;
    this.replaced.add(b.name!);
    this.replaced.add(s.name!);
    this.stats.matMulNBits++;
    const ready = this.readyFlag(a);
    const f32 = (name: string, values: number[], dims: number[] = []) => this.initializer({ name: this.fresh(name), dataType: DT.FLOAT, dims, rawData: new Uint8Array(Float32Array.from(values).buffer) });
    const sixteen = f32('sixteen', [16]);
    const eight = f32('eight', [8]);
    this.rowBlocks(N, K, (r0, rows, tag) => {
      const codes = this.initializer(rowSlice(b, this.fresh(`${b.name}${tag}`), K / 2, r0, rows, K / 2));
      const sc = this.initializer(rowSlice(s, this.fresh(`${s.name}${tag}`), blocks * 4, r0, rows, blocks));
      // The scales wait for the activation, as W8's do (see matMulNBits).
      const gated = this.node('Where', [ready, sc, sc]);
      const f = this.node('Cast', [codes], [intAttr('to', DT.FLOAT)]);
      const hi = this.node('Floor', [this.node('Div', [f, sixteen])]);
      const lo = this.node('Sub', [f, this.node('Mul', [hi, sixteen])]);
      const pair = this.int64('pair', [rows, K / 2, 1]);
      const q = this.node('Concat', [this.node('Reshape', [lo, pair]), this.node('Reshape', [hi, pair])], [intAttr('axis', 2)]);
      const centred = this.node('Sub', [this.node('Reshape', [q, this.int64('blocks', [rows, blocks, bs])]), eight]);
      const w = this.node('Mul', [centred, this.node('Reshape', [gated, this.int64('scales', [rows, blocks, 1])])]);
      return this.node('Reshape', [w, this.int64('weight', [rows, K])]);
    }, a, n.output![0], true);
    return undefined;
  }

  /**
   * x · weightᵀ over row blocks of the weight (one whole block in a multi-row graph), concatenated
   * into `output`: `weight` makes a block's float [rows, K] value. A 2-D x goes through
   * Gemm(transB=1); an N-D one (MatMulNBits' input) through com.microsoft FusedMatMul(transB=1),
   * which makes the same MlasGemm(NoTrans, Trans) call with x's leading dims as M, no reshapes.
   */
  private rowBlocks(N: number, K: number, weight: (r0: number, rows: number, tag: string) => string, x: string, output: string, nd = false): void {
    const step = this.o.tokensPerCall === 1 ? blockRows(K, this.o.blockBytes) : N;
    const B = this.o.copies;
    const parts: string[] = [];
    for (let r0 = 0; r0 < N; r0 += step) {
      const rows = Math.min(step, N - r0);
      const w = weight(r0, rows, step >= N ? '' : `.rows${r0}`);
      const products = Array.from({ length: B }, (_, b) => nd
        ? this.node('FusedMatMul', [this.rn(x, b), w], [intAttr('transB', 1)], 'FusedMatMul', MS)
        : this.node('Gemm', [this.rn(x, b), w], [intAttr('transB', 1)]));
      // Copies: the block's products side by side along axis 0 (each copy's leading dim is 1).
      parts.push(B === 1 ? products[0] : this.node('Concat', products, [intAttr('axis', 0)]));
      this.stats.blocks++;
    }
    if (B === 1) {
      if (parts.length === 1) this.out[this.out.length - 1].output = [output];
      else this.out.push({ name: this.fresh('Concat'), opType: 'Concat', input: parts, output: [output], attribute: [intAttr('axis', -1)] });
      return;
    }
    const all = parts.length === 1 ? parts[0] : this.node('Concat', parts, [intAttr('axis', -1)]);
    this.perCopy.add(output);
    const outs = Array.from({ length: B }, (_, b) => this.copyValue(output, b));
    this.out.push({ name: this.fresh('Split'), opType: 'Split', input: [all], output: outs, attribute: [intAttr('axis', 0), ...(this.opset >= 18 ? [intAttr('num_outputs', B)] : [])] });
  }

  /**
   * `w` [dims] through Reshape to its own shape, the shape passing through Where(ready(x), s, s): the
   * same values (a Reshape is a view), but whatever reads them waits for x. A Cast of a weight has
   * only initializer inputs, so ORT may run every one of them first: at 4B the fp32 reference held
   * all its weights in fp32 at once (the W8 dequantization's 9.7 GB, above).
   */
  private gatedWeight(w: string, dims: number[], x: string): string {
    // One gated shape per shape and activation, shared by its blocks (a node and an initializer per
    // block multiplied what ORT's session load walks; not measured on its own).
    const key = `${x}\u0000${dims.join(',')}`;
    let gated = this.gatedShapes.get(key);
    if (!gated) {
      const shape = this.initializer({ name: this.fresh(`${w}.shape`), dataType: DT.INT64, dims: [dims.length], rawData: new Uint8Array(BigInt64Array.from(dims.map(BigInt)).buffer) });
      this.gatedShapes.set(key, (gated = this.node('Where', [this.readyFlag(x), shape, shape])));
    }
    const out = this.node('Reshape', [w, gated]);
    // Its shape, which ORT cannot infer through the gate: without it every value downstream of the
    // block has unknown dims (measured: session load of a 4-layer Qwen3-4B fp32 decode graph with 8
    // copies 10.9 CPU-s without, 0.96 with).
    const elemType = (this.inits.get(w) ?? this.addedByName.get(w))?.dataType;
    (this.model.graph.valueInfo ??= []).push({ name: out, type: { tensorType: { elemType, shape: { dim: dims.map((d) => ({ dimValue: d })) } } } });
    return out;
  }

  private readonly gatedShapes = new Map<string, string>();

  /**
   * Gemm(x, Cast(bf16|fp16 weight), transB=1): each Cast waits for x (gatedWeight), and in a
   * one-token graph the weight is split into row blocks. False when the node is not one.
   */
  private castGemm(n: Node): boolean {
    const [x, wv, c] = n.input ?? [];
    if (c || attrInt(n, 'transA', 0) !== 0 || attrInt(n, 'transB', 0) !== 1 || attrF(n, 'alpha', 1) !== 1) return false;
    const cast = this.producers.get(wv);
    if (!cast || cast.opType !== 'Cast' || attrInt(cast, 'to') !== DT.FLOAT || this.consumers.get(wv) !== 1) return false;
    const w = this.inits.get(cast.input![0]);
    if (!w || (w.dataType !== DT.BFLOAT16 && w.dataType !== DT.FLOAT16) || w.dims?.length !== 2) return false;
    const [N, K] = w.dims.map(toNumber);
    this.drop.add(wv);
    if (this.o.copies === 1 && (this.o.tokensPerCall !== 1 || blockRows(K, this.o.blockBytes) >= N)) {
      // One block: the Gemm as it was, its Cast made again after the gate (the old one goes).
      const cast2 = this.node('Cast', [this.gatedWeight(w.name!, [N, K], x)], [intAttr('to', DT.FLOAT)]);
      this.out.push({ ...n, input: [x, cast2] });
      return true;
    }
    this.stats.castGemm++;
    this.replaced.add(w.name!);
    this.rowBlocks(N, K, (r0, rows, tag) => {
      const slice = this.initializer(rowSlice(w, this.fresh(`${w.name}${tag}`), K * 2, r0, rows, K));
      return this.node('Cast', [this.gatedWeight(slice, [rows, K], x)], [intAttr('to', DT.FLOAT)]);
    }, x, n.output![0]);
    return true;
  }
}

/** Rewrites `model` in place into its CPU-gate form (see the top of this file). */
export function toCpuForm(model: OnnxModel, o: CpuFormOptions): CpuFormStats {
  return new Rewriter(model, { blockBytes: DEFAULT_BLOCK_BYTES, copies: 1, sharedInputs: [], ...o }).run();
}

/**
 * The gate's copy of a graph: its probe outputs added (writeProbeModel) and in CPU form, in
 * `scratch` beside hard links to its data files. Returns the path and what the form did.
 */
export function writeGateModel(modelPath: string, probes: string[], scratch: string, o: CpuFormOptions): { path: string; stats: CpuFormStats } {
  let stats: CpuFormStats | undefined;
  const probed = probes.flatMap((p) => Array.from({ length: o.copies ?? 1 }, (_, b) => copyName(p, b)));
  const path = writeProbeModel(modelPath, probed, scratch, (m) => void (stats = toCpuForm(m, o)));
  return { path, stats: stats! };
}

/**
 * The CPU form of a whole export directory (graphs.json and its graphs, same names; every data
 * file hard-linked, never copied on one filesystem), e.g. for a host bundle whose graphs ONNX
 * Runtime's CPU EP runs. Run its graphs with CPU_GATE_SESSION_OPTIONS (the native runtime's CPU
 * sessions set the same: native/src/shared_weights.cpp configure_cpu_session).
 */
export function writeCpuFormExport(exportDir: string, outDir: string, o: { blockBytes?: number } = {}): Record<string, CpuFormStats> {
  const manifest = JSON.parse(readFileSync(join(exportDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  mkdirSync(outDir, { recursive: true });
  const stats: Record<string, CpuFormStats> = {};
  for (const c of manifest.contexts) {
    // Each graph's data files (its context's, the checkpoint's read in place) are linked by writeProbeModel.
    for (const g of c.graphs) stats[g.name] = writeGateModel(join(exportDir, g.file), [], outDir, { tokensPerCall: g.n, ...o }).stats;
  }
  if (manifest.embedding) linkOrCopy(join(exportDir, manifest.embedding.file), join(outDir, manifest.embedding.file));
  for (const t of manifest.madeTables ?? []) linkOrCopy(join(exportDir, t.file), join(outDir, t.file));
  writeFileSync(join(outDir, GRAPHS_JSON), JSON.stringify(manifest, null, 2));
  return stats;
}
