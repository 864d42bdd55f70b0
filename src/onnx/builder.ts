import { ELEM, defaultElemType, tensorByteLength, tensorBytes, type ElemType, type TensorData, type WeightElemType } from './dtype.js';
import type { ExternalDataWriter, ExternalRef } from './external.js';
import { onnx } from './proto.js';

/**
 * Default-domain opset. 17 because it is what the QNN EP's op builders and Qualcomm AI Hub
 * exports are exercised with, it has LayerNormalization (17) and per-axis DequantizeLinear
 * (13), and it predates the opset-18 move of Reduce* axes / Split sizes from attributes to
 * inputs. Note: in 17 Split has no `num_outputs` attribute; an equal split is expressed by
 * the number of outputs alone (or a `split` input). 16-bit Q/DQ needs opset 21 in the ONNX
 * domain, so with 17 those use 'com.microsoft' QuantizeLinear/DequantizeLinear (as ORT's
 * quantizer emits), hence that domain is always available.
 */
export const DEFAULT_OPSET = 17;
export const MS_DOMAIN = 'com.microsoft';
/** IR 8 is the newest the vendored onnx-proto schema (onnx 1.10) describes; opset 17 needs >= 8. */
export const IR_VERSION = 8;
/**
 * A graph at opset 21 (the QAIRT path's W4: int4 and blocked DequantizeLinear are opset 21) is
 * stamped IR 10, the IR that has int4. The vendored schema lacks the INT4 enum value, which changes
 * nothing on the wire (a data type is an int32 field).
 */
export const IR_VERSION_OPSET21 = 10;

/** Reduce ops whose `axes` became an input at opset 18 (ReduceSum's did at 13). */
const REDUCE_AXES_18 = new Set(['ReduceMean', 'ReduceMax', 'ReduceMin', 'ReduceProd', 'ReduceL1', 'ReduceL2', 'ReduceLogSum', 'ReduceLogSumExp', 'ReduceSumSquare']);

/** A number is a static dim; a string a symbolic one (dim_param). */
export type Dim = number | string;

export interface ValueType {
  dtype: ElemType;
  shape?: readonly Dim[];
}

export interface OutputType {
  /** Defaults to the propagated element type. */
  dtype?: ElemType;
  /** Required: onnx.checker rejects graph outputs without a shape. null omits it (ORT accepts that). */
  shape: readonly Dim[] | null;
}

type AttrKind = 'int' | 'float' | 'string' | 'ints' | 'floats' | 'strings' | 'tensor';
export interface TensorAttr {
  data: TensorData;
  dims: readonly number[];
  dtype?: ElemType;
}

/** An attribute with an explicit type; plain values are inferred (integer number → int). */
export class Attr {
  constructor(
    readonly kind: AttrKind,
    readonly value: number | string | readonly number[] | readonly string[] | TensorAttr,
  ) {}
}
export const attr = {
  int: (v: number) => new Attr('int', v),
  /** Use for float attributes whose value is integral (e.g. alpha: 1), else they encode as int. */
  float: (v: number) => new Attr('float', v),
  string: (v: string) => new Attr('string', v),
  ints: (v: readonly number[]) => new Attr('ints', v),
  floats: (v: readonly number[]) => new Attr('floats', v),
  strings: (v: readonly string[]) => new Attr('strings', v),
  tensor: (data: TensorData, dims: readonly number[], dtype?: ElemType) => new Attr('tensor', { data, dims, dtype }),
};
export type AttrValue = number | string | readonly number[] | readonly string[] | Attr;
export type Attrs = Record<string, AttrValue | undefined>;

export interface OpOptions {
  /** Node domain, e.g. 'com.microsoft'. Other domains need g.opset() first. */
  domain?: string;
  /** Base for the node name (made unique). */
  name?: string;
  /** Explicit output value names (must be unused); length fixes the output count. */
  outputs?: readonly string[];
  /** Output element type(s) when the simple propagation rule below is wrong for this op. */
  dtype?: ElemType | readonly ElemType[];
}

export interface InitializerInfo {
  name: string;
  dtype: WeightElemType;
  dims: number[];
  byteLength: number;
  /** Set when the bytes live in the external data file (the builder no longer holds them). */
  external?: ExternalRef;
}

export interface GraphBuilderOptions {
  /** Tensors above the sink's threshold are written to it inside initializer() and released. */
  externalSink?: ExternalDataWriter;
  /** Extra or overriding opset imports: { '': 17, 'com.microsoft': 1 }. */
  opsets?: Record<string, number>;
  docString?: string;
  /**
   * Exact rescalings of named ops (forge bisect's fix for a value fp16 cannot hold): an op builder
   * that supports one asks rescaleFor(its scope) and rewrites itself (blocks.ts rmsNorm).
   */
  rescale?: readonly RescaleRule[];
}

/** `match`: a pattern over op scopes (`layers.2/input_layernorm`); `scale`: a power of two. */
export interface RescaleRule { match: string; scale: number }

interface Init extends InitializerInfo {
  bytes?: Uint8Array; // absent when external
}

// Ops whose output type is not that of input 0.
const FIXED_OUT: Record<string, ElemType> = {
  Shape: 'int64', Size: 'int64', ArgMax: 'int64', ArgMin: 'int64', NonZero: 'int64',
  Equal: 'bool', Less: 'bool', LessOrEqual: 'bool', Greater: 'bool', GreaterOrEqual: 'bool',
  Not: 'bool', And: 'bool', Or: 'bool', Xor: 'bool', IsNaN: 'bool', IsInf: 'bool',
};

export class GraphBuilder {
  readonly name: string;
  readonly sink?: ExternalDataWriter;
  private readonly opsets = new Map<string, number>([['', DEFAULT_OPSET]]);
  private readonly inputs: onnx.IValueInfoProto[] = [];
  private readonly outputs: onnx.IValueInfoProto[] = [];
  private readonly nodes: onnx.INodeProto[] = [];
  private readonly inits: Init[] = [];
  private readonly types = new Map<string, ElemType | undefined>(); // every value name in the graph
  private readonly producer = new Map<string, onnx.INodeProto>();
  private readonly nodeNames = new Set<string>();
  private readonly docString?: string;

  /**
   * The name scope of the nodes made now (`layers.3`, `layers.3/input_layernorm`): node names are
   * `<scope>/<op>`, so a graph's nodes say which layer and block they compute (forge bisect's probes
   * read them). Set by the family's layer builders; '' outside any.
   */
  scope = '';
  private readonly rescales: Array<{ rule: RescaleRule; re: RegExp; hits: number }>;

  constructor(name: string, opts: GraphBuilderOptions = {}) {
    this.name = name;
    this.rescales = (opts.rescale ?? []).map((rule) => ({ rule, re: new RegExp(`^(?:${rule.match})$`), hits: 0 }));
    this.sink = opts.externalSink;
    this.docString = opts.docString;
    for (const [d, v] of Object.entries(opts.opsets ?? {})) this.opsets.set(d, v);
  }

  /** Import (or re-version) an operator-set domain. */
  opset(domain: string, version: number): this {
    this.opsets.set(domain, version);
    return this;
  }

  /** The imported version of a domain's operator set (the default domain's unless named). */
  opsetVersion(domain = ''): number | undefined {
    return this.opsets.get(domain);
  }

  input(name: string, dtype: ElemType, shape: readonly Dim[]): string {
    this.claim(name, dtype);
    this.inputs.push(valueInfo(name, { dtype, shape }));
    return name;
  }

  /**
   * Add a weight. With an external sink and more bytes than its threshold, the bytes are
   * written to the data file now and not kept; otherwise the builder keeps a reference to
   * `data` until written, so do not mutate it afterwards. dtype defaults from the array
   * type (Uint16Array → float16; pass 'uint16' for real uint16, Uint8Array + 'bool' for bool).
   */
  initializer(name: string, data: TensorData, dims: readonly number[], dtype: ElemType = defaultElemType(data)): string {
    const bytes = tensorBytes(data, dims, dtype, `initializer ${name}`);
    this.claim(name, dtype);
    const init: Init = { name, dtype, dims: [...dims], byteLength: bytes.byteLength };
    if (this.sink?.wants(bytes.byteLength)) init.external = this.sink.append(bytes);
    else init.bytes = bytes;
    this.inits.push(init);
    return name;
  }

  /**
   * Add a weight whose bytes are already in an external data file (written by the caller, e.g. one
   * data file shared by a shard's prefill and decode graphs).
   */
  externalInitializer(name: string, dtype: WeightElemType, dims: readonly number[], ref: ExternalRef): string {
    const expected = tensorByteLength(dtype, dims);
    if (ref.length !== expected) throw new Error(`initializer ${name}: ${ref.length} external bytes for ${dtype}[${dims.join(',')}] (${expected} expected)`);
    // A bfloat16 weight only feeds a Cast, an int4 one a DequantizeLinear (each names its own output type): no value type to propagate.
    this.claim(name, dtype === 'bfloat16' || dtype === 'int4' ? undefined : dtype);
    this.inits.push({ name, dtype, dims: [...dims], byteLength: ref.length, external: ref });
    return name;
  }

  /** int64 initializer, e.g. a Reshape shape or Transpose-free axes input. */
  constInt64(values: readonly (number | bigint)[], dims: readonly number[] = [values.length], name?: string): string {
    const data = BigInt64Array.from(values, (v) => BigInt(v));
    return this.initializer(name ?? this.fresh('const_i64'), data, dims, 'int64');
  }

  /** float32 initializer; dims [] for a scalar. */
  constFloat32(values: readonly number[], dims: readonly number[] = [values.length], name?: string): string {
    return this.initializer(name ?? this.fresh('const_f32'), Float32Array.from(values), dims, 'float32');
  }

  /**
   * Append a node. Inputs are value names ('' for an omitted optional input). Returns the
   * output name, or the list of names when `outputs` (the count) is 2 or more; a count of 1
   * returns the name. Several explicit output names need the count too. Output dtype is propagated
   * as: opts.dtype, else Cast's `to`, DequantizeLinear's scale type, Where's input 1, a fixed type for
   * compare/index ops, else the type of input 0 (enough for output value_info).
   */
  op(type: string, inputs: readonly string[], attrs?: Attrs, outputs?: 1, opts?: OpOptions): string;
  op(type: string, inputs: readonly string[], attrs: Attrs | undefined, outputs: number, opts?: OpOptions): string[];
  op(type: string, inputs: readonly string[], attrs: Attrs = {}, outputs?: number, opts: OpOptions = {}): string | string[] {
    const domain = opts.domain ?? '';
    if (!this.opsets.has(domain)) {
      if (domain !== MS_DOMAIN) throw new Error(`op ${type}: domain '${domain}' not imported; call opset() first`);
      this.opsets.set(MS_DOMAIN, 1);
    }
    for (const i of inputs) if (i !== '' && !this.types.has(i)) throw new Error(`op ${type}: unknown input '${i}'`);
    const count = outputs ?? opts.outputs?.length ?? 1;
    if (opts.outputs && opts.outputs.length !== count) throw new Error(`op ${type}: ${opts.outputs.length} output names for ${count} outputs`);
    if (!domain) [inputs, attrs] = this.spellForOpset(type, inputs, attrs, count);
    const nodeName = this.uniqueNode(opts.name ?? (this.scope ? `${this.scope}/${type}` : type));
    const dtypes = this.outTypes(type, inputs, attrs, count, opts.dtype);
    const outs = Array.from({ length: count }, (_, k) => {
      const n = opts.outputs ? opts.outputs[k] : this.fresh(count === 1 ? `${nodeName}_out` : `${nodeName}_out${k}`);
      this.claim(n, dtypes[k]);
      return n;
    });
    const node: onnx.INodeProto = { name: nodeName, opType: type, input: [...inputs], output: outs };
    if (domain) node.domain = domain;
    const a = Object.entries(attrs).filter(([, v]) => v !== undefined);
    if (a.length) node.attribute = a.map(([k, v]) => encodeAttr(k, v!));
    this.nodes.push(node);
    for (const o of outs) this.producer.set(o, node);
    return count === 1 ? outs[0] : outs;
  }

  /**
   * Mark `value` as a graph output named `name` (a node output is renamed in place; an
   * input/initializer gets an Identity). Symbolic dims ('seq') are fine in the shape.
   */
  output(value: string, name: string, type: OutputType): string {
    if (!this.types.has(value)) throw new Error(`output: unknown value '${value}'`);
    let out = value;
    if (name !== value) {
      const node = this.producer.get(value);
      if (node && !this.outputs.some((o) => o.name === value)) {
        this.claim(name, this.types.get(value));
        node.output = node.output!.map((o) => (o === value ? name : o));
        for (const n of this.nodes) n.input = n.input!.map((i) => (i === value ? name : i));
        this.types.delete(value);
        this.producer.delete(value);
        this.producer.set(name, node);
      } else {
        this.op('Identity', [value], {}, 1, { outputs: [name] });
      }
      out = name;
    }
    const dtype = type.dtype ?? this.types.get(out);
    if (!dtype) throw new Error(`output ${out}: element type unknown, pass { dtype }`);
    this.outputs.push(valueInfo(out, { dtype, shape: type.shape ?? undefined }));
    return out;
  }

  /** Element type of a value, when known. */
  typeOf(value: string): ElemType | undefined {
    return this.types.get(value);
  }

  initializers(): InitializerInfo[] {
    return this.inits.map(({ bytes: _b, ...info }) => ({ ...info, dims: [...info.dims] }));
  }

  /** Tensor bytes the builder still references (inline initializers only). */
  retainedBytes(): number {
    return this.inits.reduce((s, i) => s + (i.bytes?.byteLength ?? 0), 0);
  }

  /**
   * The ModelProto. `place` decides where bytes the builder still holds go (the writer uses it
   * to move large inline tensors to a data file when there was no sink at build time).
   */
  toModelProto(place?: (init: InitializerInfo, bytes: Uint8Array) => ExternalRef | undefined): onnx.IModelProto {
    const initializer = this.inits.map((i) => {
      const ref = i.external ?? (place ? place(i, i.bytes!) : undefined);
      const t: onnx.ITensorProto = { dims: i.dims, dataType: ELEM[i.dtype].code, name: i.name };
      if (ref) {
        t.externalData = [
          { key: 'location', value: ref.location },
          { key: 'offset', value: String(ref.offset) },
          { key: 'length', value: String(ref.length) },
        ];
        t.dataLocation = onnx.TensorProto.DataLocation.EXTERNAL;
      } else {
        t.rawData = i.bytes!;
      }
      return t;
    });
    const graph: onnx.IGraphProto = {
      name: this.name,
      node: this.nodes,
      initializer,
      input: this.inputs,
      output: this.outputs,
    };
    if (this.docString) graph.docString = this.docString;
    // Sorted so the bytes do not depend on the order domains were first used.
    const opsetImport = [...this.opsets].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([domain, version]) => ({ domain, version }));
    const irVersion = (this.opsets.get('') ?? DEFAULT_OPSET) >= 21 ? IR_VERSION_OPSET21 : IR_VERSION;
    return { irVersion, producerName: 'forge', opsetImport, graph };
  }

  /**
   * Graph code writes ops as opset 17 spells them; at opset 18 or later two of those spellings
   * changed, and are rewritten here so one graph function serves both: a Reduce op's `axes` attribute
   * becomes an int64 input, and an equal Split (no `split` input) names its `num_outputs`.
   */
  private spellForOpset(type: string, inputs: readonly string[], attrs: Attrs, count: number): [readonly string[], Attrs] {
    if ((this.opsets.get('') ?? DEFAULT_OPSET) < 18) return [inputs, attrs];
    if (REDUCE_AXES_18.has(type) && attrs.axes !== undefined) {
      const { axes, ...rest } = attrs;
      return [[inputs[0], this.constInt64((axes instanceof Attr ? axes.value : axes) as readonly number[])], rest];
    }
    if (type === 'Split' && !inputs[1] && attrs.num_outputs === undefined) return [inputs, { ...attrs, num_outputs: count }];
    return [inputs, attrs];
  }

  private claim(name: string, dtype: ElemType | undefined): void {
    if (!name) throw new Error('empty value name');
    if (this.types.has(name)) throw new Error(`value name '${name}' already used`);
    this.types.set(name, dtype);
  }

  /** Runs `fn` with `name` appended to the scope (async builders included), restoring it after. */
  async scoped<T>(name: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.scope;
    this.scope = prev ? `${prev}/${name}` : name;
    try {
      return await fn();
    } finally {
      this.scope = prev;
    }
  }

  /** The rescale factor for an op scope (the first rule that matches), counted as used. */
  rescaleFor(scope: string): number | undefined {
    const r = this.rescales.find((x) => x.re.test(scope));
    if (!r) return undefined;
    r.hits++;
    return r.rule.scale;
  }

  /**
   * A state input or output (a KV cache) that holds its values times `scale` under a rescale rule
   * (v_proj's values, which o_proj scales back): the runtime carries the state as it is, but the
   * gates, which feed HF's states, must scale them alike (GraphEntry.stateScales).
   */
  scaleState(name: string, scale: number): void {
    if (scale !== 1) this.stateScales[name] = scale;
  }

  /** The state I/O this graph holds rescaled, by name. */
  readonly stateScales: Record<string, number> = {};

  /** The rescale rules no op of this graph asked for. */
  unusedRescales(): RescaleRule[] {
    return this.rescales.filter((r) => !r.hits).map((r) => r.rule);
  }

  private fresh(base: string): string {
    if (!this.types.has(base)) return base;
    for (let k = 1; ; k++) if (!this.types.has(`${base}_${k}`)) return `${base}_${k}`;
  }

  private uniqueNode(base: string): string {
    let n = base;
    for (let k = 1; this.nodeNames.has(n); k++) n = `${base}_${k}`;
    this.nodeNames.add(n);
    return n;
  }

  private outTypes(type: string, inputs: readonly string[], attrs: Attrs, count: number, given?: ElemType | readonly ElemType[]): (ElemType | undefined)[] {
    if (given !== undefined) return typeof given === 'string' ? Array(count).fill(given) : [...given];
    let t: ElemType | undefined = FIXED_OUT[type] ?? (inputs[0] ? this.types.get(inputs[0]) : undefined);
    if (type === 'ConstantOfShape') t = 'float32'; // its default when no value is given
    if (type === 'Cast') t = elemFromAttr(attrs.to);
    else if (type === 'DequantizeLinear') t = this.types.get(inputs[1]);
    else if (type === 'Where') t = this.types.get(inputs[1]);
    else if (type === 'QuantizeLinear') t = inputs[2] ? this.types.get(inputs[2]) : 'uint8';
    else if ((type === 'Constant' || type === 'ConstantOfShape') && attrs.value instanceof Attr) {
      const v = attrs.value.value as TensorAttr;
      t = v.dtype ?? defaultElemType(v.data);
    }
    return Array(count).fill(t);
  }
}

function elemFromAttr(v: AttrValue | undefined): ElemType | undefined {
  const code = v instanceof Attr ? v.value : v;
  return (Object.keys(ELEM) as ElemType[]).find((k) => ELEM[k].code === code);
}

function valueInfo(name: string, t: ValueType): onnx.IValueInfoProto {
  const tensorType: onnx.TypeProto.ITensor = { elemType: ELEM[t.dtype].code };
  if (t.shape) tensorType.shape = { dim: t.shape.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) };
  return { name, type: { tensorType } };
}

function encodeAttr(name: string, v: AttrValue): onnx.IAttributeProto {
  const T = onnx.AttributeProto.AttributeType;
  const a = v instanceof Attr ? v : inferAttr(name, v);
  switch (a.kind) {
    case 'int': return { name, type: T.INT, i: checkInt(name, a.value as number) };
    case 'float': return { name, type: T.FLOAT, f: a.value as number };
    case 'string': return { name, type: T.STRING, s: new TextEncoder().encode(a.value as string) };
    case 'ints': return { name, type: T.INTS, ints: (a.value as number[]).map((x) => checkInt(name, x)) };
    case 'floats': return { name, type: T.FLOATS, floats: [...(a.value as number[])] };
    case 'strings': return { name, type: T.STRINGS, strings: (a.value as string[]).map((s) => new TextEncoder().encode(s)) };
    case 'tensor': {
      const { data, dims, dtype = defaultElemType(data) } = a.value as TensorAttr;
      const rawData = tensorBytes(data, dims, dtype, `attribute ${name}`).slice();
      return { name, type: T.TENSOR, t: { dims: [...dims], dataType: ELEM[dtype].code, rawData } };
    }
  }
}

function inferAttr(name: string, v: Exclude<AttrValue, Attr>): Attr {
  if (typeof v === 'number') return new Attr(Number.isInteger(v) ? 'int' : 'float', v);
  if (typeof v === 'string') return new Attr('string', v);
  if (v.length === 0) throw new Error(`attribute ${name}: empty list is ambiguous, use attr.ints/floats/strings`);
  if (typeof v[0] === 'string') return new Attr('strings', v);
  return new Attr((v as number[]).every(Number.isInteger) ? 'ints' : 'floats', v);
}

function checkInt(name: string, x: number): number {
  if (!Number.isSafeInteger(x)) throw new Error(`attribute ${name}: ${x} is not an integer`);
  return x;
}
