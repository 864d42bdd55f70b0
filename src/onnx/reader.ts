import { closeSync, fstatSync, openSync, readFileSync, readSync, renameSync, rmSync, statSync, writeFileSync, writeSync } from 'node:fs';
import { dirname, isAbsolute, join, normalize, resolve, sep } from 'node:path';
import type { Dim } from './builder.js';
import { ELEM, elemTypeFromCode, weightElemTypeFromCode, tensorByteLength, tensorBytes, typedFromBytes, type ElemType, type WeightElemType, type TensorData } from './dtype.js';
import { tempPathFor, type ExternalRef } from './external.js';
import { onnx, toNumber } from './proto.js';

export interface ValueSummary {
  name: string;
  dtype: ElemType;
  /** Absent when the value has no shape (unknown rank). */
  shape?: Dim[];
}

export interface TensorSummary {
  name: string;
  dtype: WeightElemType;
  dims: number[];
  byteLength: number;
  external?: ExternalRef;
}

export type AttrPlain = number | string | number[] | string[] | { dtype: ElemType; dims: number[]; data: TensorData };

export interface NodeSummary {
  name: string;
  opType: string;
  domain: string;
  inputs: string[];
  outputs: string[];
  attrs: Record<string, AttrPlain>;
}

/**
 * A loaded .onnx for inspection. External tensor bytes are not read at load time; they are
 * read from the data file when asked for, so opening a multi-GB model is cheap.
 */
export class OnnxModel {
  readonly path: string;
  readonly proto: onnx.ModelProto;
  private readonly byName = new Map<string, onnx.ITensorProto>();

  constructor(path: string, proto: onnx.ModelProto) {
    this.path = resolve(path);
    this.proto = proto;
    for (const t of this.graph.initializer ?? []) this.byName.set(t.name ?? '', t);
  }

  static load(path: string): OnnxModel {
    return new OnnxModel(path, onnx.ModelProto.decode(readFileSync(path)));
  }

  get graph(): onnx.IGraphProto {
    if (!this.proto.graph) throw new Error(`${this.path}: model has no graph`);
    return this.proto.graph;
  }

  get irVersion(): number {
    return toNumber(this.proto.irVersion);
  }

  opsets(): Record<string, number> {
    return Object.fromEntries((this.proto.opsetImport ?? []).map((o) => [o.domain ?? '', toNumber(o.version)]));
  }

  inputs(): ValueSummary[] {
    return (this.graph.input ?? []).map(valueSummary);
  }

  outputs(): ValueSummary[] {
    return (this.graph.output ?? []).map(valueSummary);
  }

  nodes(): NodeSummary[] {
    return (this.graph.node ?? []).map((n) => ({
      name: n.name ?? '',
      opType: n.opType ?? '',
      domain: n.domain ?? '',
      inputs: [...(n.input ?? [])],
      outputs: [...(n.output ?? [])],
      attrs: Object.fromEntries((n.attribute ?? []).map((a) => [a.name ?? '', plainAttr(a)])),
    }));
  }

  initializers(): TensorSummary[] {
    return [...this.byName.values()].map((t) => this.summary(t));
  }

  initializer(name: string): TensorSummary {
    return this.summary(this.tensor(name));
  }

  /** Raw little-endian bytes; external ones are read from the data file now. */
  initializerBytes(name: string): Uint8Array {
    const t = this.tensor(name);
    const s = this.summary(t);
    if (!s.external) return inlineBytes(t, s.dtype);
    const bytes = new Uint8Array(s.external.length);
    const fd = openSync(this.dataPath(s.external), 'r');
    try {
      if (fstatSync(fd).size < s.external.offset + s.external.length) {
        throw new Error(`${name}: data file shorter than offset+length`);
      }
      for (let got = 0; got < bytes.byteLength; ) {
        const n = readSync(fd, bytes, got, bytes.byteLength - got, s.external.offset + got);
        if (n === 0) throw new Error(`${name}: unexpected end of data file`);
        got += n;
      }
    } finally {
      closeSync(fd);
    }
    return bytes;
  }

  initializerData(name: string): TensorData {
    return typedFromBytes(this.initializerBytes(name), this.initializer(name).dtype);
  }

  /** Absolute path of an external reference, refusing locations that escape the model dir. */
  dataPath(ref: ExternalRef): string {
    const loc = normalize(ref.location);
    if (isAbsolute(loc) || loc === '..' || loc.startsWith('..' + sep)) throw new Error(`external location escapes model dir: ${ref.location}`);
    return join(dirname(this.path), loc);
  }

  private tensor(name: string): onnx.ITensorProto {
    const t = this.byName.get(name);
    if (!t) throw new Error(`${this.path}: no initializer '${name}'`);
    return t;
  }

  private summary(t: onnx.ITensorProto): TensorSummary {
    const dtype = weightElemTypeFromCode(t.dataType ?? 0);
    const dims = (t.dims ?? []).map(toNumber);
    const byteLength = tensorByteLength(dtype, dims);
    const s: TensorSummary = { name: t.name ?? '', dtype, dims, byteLength };
    if (t.dataLocation === onnx.TensorProto.DataLocation.EXTERNAL) {
      const kv = Object.fromEntries((t.externalData ?? []).map((e) => [e.key ?? '', e.value ?? '']));
      if (!kv.location) throw new Error(`${s.name}: external tensor without location`);
      const offset = kv.offset ? Number(kv.offset) : 0;
      const length = kv.length ? Number(kv.length) : byteLength;
      if (length !== byteLength) throw new Error(`${s.name}: external length ${length} != ${byteLength} for its dims`);
      s.external = { location: kv.location, offset, length };
    }
    return s;
  }
}

export function readModel(path: string): OnnxModel {
  return OnnxModel.load(path);
}

/**
 * Replace one initializer's values in place (same dtype and element count), e.g. to perturb a
 * weight in a copy of a model. External: patched in the data file. Inline: model re-encoded
 * and renamed over the original.
 */
export function overwriteInitializer(modelPath: string, name: string, data: TensorData): void {
  const m = readModel(modelPath);
  const s = m.initializer(name);
  const bytes = tensorBytes(data, s.dims, s.dtype, `overwrite ${name}`);
  if (s.external) {
    const file = m.dataPath(s.external);
    // A reference export's weights are hard links to the checkpoint's own files: patching one in
    // place would edit the checkpoint (and every export linked to it).
    const links = statSync(file).nlink;
    if (links > 1) throw new Error(`${file}: the data of initializer ${name} is also reachable under ${links - 1} other name(s) (a hard link to a checkpoint file?): patch a copy, not this file`);
    const fd = openSync(file, 'r+');
    try {
      for (let w = 0; w < bytes.byteLength; ) w += writeSync(fd, bytes, w, bytes.byteLength - w, s.external.offset + w);
    } finally {
      closeSync(fd);
    }
    return;
  }
  const t = m.graph.initializer!.find((x) => x.name === name)!;
  t.rawData = bytes;
  t.floatData = t.int32Data = t.int64Data = t.doubleData = t.uint64Data = [];
  const tmp = tempPathFor(m.path);
  try {
    writeFileSync(tmp, onnx.ModelProto.encode(m.proto).finish());
    renameSync(tmp, m.path);
  } catch (e) {
    rmSync(tmp, { force: true });
    throw e;
  }
}

function valueSummary(v: onnx.IValueInfoProto): ValueSummary {
  const tt = v.type?.tensorType;
  if (!tt) throw new Error(`value ${v.name}: not a tensor`);
  const s: ValueSummary = { name: v.name ?? '', dtype: elemTypeFromCode(tt.elemType ?? 0) };
  if (tt.shape) s.shape = (tt.shape.dim ?? []).map((d) => (d.dimParam ? d.dimParam : toNumber(d.dimValue)));
  return s;
}

/** Inline bytes: raw_data normally; the typed fields for models written by other tools. */
function inlineBytes(t: onnx.ITensorProto, dtype: WeightElemType): Uint8Array {
  if (t.rawData && t.rawData.byteLength) return t.rawData;
  let a: TensorData;
  if (dtype === 'float32') a = Float32Array.from(t.floatData ?? []);
  else if (dtype === 'int64') a = BigInt64Array.from(t.int64Data ?? [], (v) => BigInt(v.toString()));
  else if (dtype === 'int4') throw new Error(`${t.name}: inline int4 without raw_data (forge writes int4 raw only)`);
  else a = fromInt32(t.int32Data ?? [], dtype); // int32_data carries int8..int32, bool and f16 bits
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

function fromInt32(v: number[], dtype: WeightElemType): TensorData {
  const out = new ELEM[dtype].array(new ArrayBuffer(v.length * ELEM[dtype].bytes), 0, v.length);
  for (let i = 0; i < v.length; i++) (out as Int32Array)[i] = v[i];
  return out;
}

function plainAttr(a: onnx.IAttributeProto): AttrPlain {
  const T = onnx.AttributeProto.AttributeType;
  const dec = (b: Uint8Array) => new TextDecoder().decode(b);
  switch (a.type) {
    case T.INT: return toNumber(a.i);
    case T.FLOAT: return a.f ?? 0;
    case T.STRING: return dec(a.s ?? new Uint8Array());
    case T.INTS: return (a.ints ?? []).map(toNumber);
    case T.FLOATS: return [...(a.floats ?? [])];
    case T.STRINGS: return (a.strings ?? []).map(dec);
    case T.TENSOR: {
      const dtype = elemTypeFromCode(a.t?.dataType ?? 0);
      return { dtype, dims: (a.t?.dims ?? []).map(toNumber), data: typedFromBytes(inlineBytes(a.t!, dtype), dtype) };
    }
    default: throw new Error(`attribute ${a.name}: type ${a.type} not supported by the reader`);
  }
}
