// EPContext wrappers for context binaries the QAIRT tools built: the thin `<graph>_ctx.onnx` the
// runtime loads (ONNX Runtime's QNN EP finds the graph in the binary by the node's name). Its
// inputs and outputs are the source graph's, in the source's order, because the manifest binds by
// those names and types; so the binary's graph, as qnn-context-binary-utility describes it, must
// have exactly those tensors. A converter that renamed a tensor or changed its type (fp16 or
// quantized I/O) gives an error naming the tensor here, not a wrapper that fails on the phone.
import { MS_DOMAIN, GraphBuilder } from '../../onnx/builder.js';
import type { ElemType } from '../../onnx/dtype.js';
import { writeModel } from '../../onnx/writer.js';
import type { TensorIO } from '../../families/types.js';

export interface QnnTensor {
  name: string;
  /** 'QNN_DATATYPE_FLOAT_32', ... as the utility prints it. */
  dataType: string;
  dims: number[];
}

export interface QnnGraph {
  name: string;
  inputs: QnnTensor[];
  outputs: QnnTensor[];
}

export interface ContextBinaryDescription {
  /** The QNN build the binary was made with, e.g. 'v2.51.0.260929181845'. */
  buildId: string | null;
  graphs: QnnGraph[];
}

const QNN_TO_ONNX: Record<string, ElemType> = {
  QNN_DATATYPE_FLOAT_32: 'float32',
  QNN_DATATYPE_FLOAT_16: 'float16',
  QNN_DATATYPE_INT_32: 'int32',
  QNN_DATATYPE_INT_64: 'int64',
  QNN_DATATYPE_INT_8: 'int8',
  QNN_DATATYPE_UINT_8: 'uint8',
  QNN_DATATYPE_BOOL_8: 'bool',
};

/**
 * The graphs a qnn-context-binary-utility JSON describes (`info.graphs[].info.graphName`,
 * `graphInputs` / `graphOutputs` of `{info: {name, dataType, dimensions}}`: the layout ONNX
 * Runtime's own gen_qnn_ctx_onnx_model.py reads). `file` names the report in errors.
 */
export function describeContextBinary(doc: unknown, file: string): ContextBinaryDescription {
  const info = (doc as { info?: { buildId?: unknown; graphs?: unknown } } | null)?.info;
  if (!info || !Array.isArray(info.graphs)) throw new Error(`${file}: no info.graphs: not a qnn-context-binary-utility report`);
  const tensors = (g: Record<string, unknown>, key: string, graph: string): QnnTensor[] => {
    const list = g[key];
    if (!Array.isArray(list)) throw new Error(`${file}: graph ${graph}: no ${key}`);
    return list.map((t: { info?: { name?: unknown; dataType?: unknown; dimensions?: unknown } }, i) => {
      const ti = t?.info;
      if (typeof ti?.name !== 'string' || typeof ti.dataType !== 'string' || !Array.isArray(ti.dimensions)) {
        throw new Error(`${file}: graph ${graph}: ${key}[${i}] lacks name, dataType or dimensions`);
      }
      return { name: ti.name, dataType: ti.dataType, dims: ti.dimensions.map(Number) };
    });
  };
  const graphs = info.graphs.map((raw: { info?: Record<string, unknown> }, i: number) => {
    const g = raw?.info;
    if (!g || typeof g.graphName !== 'string') throw new Error(`${file}: info.graphs[${i}] has no info.graphName`);
    return { name: g.graphName, inputs: tensors(g, 'graphInputs', g.graphName), outputs: tensors(g, 'graphOutputs', g.graphName) };
  });
  return { buildId: typeof info.buildId === 'string' ? info.buildId : null, graphs };
}

export interface SourceGraph {
  /** The source graph file, for messages. */
  file: string;
  inputs: TensorIO[];
  outputs: TensorIO[];
}

/** Throws, naming the tensor, unless `qnn` has exactly the source graph's inputs and outputs (names, types, shapes). */
export function checkGraphIo(source: SourceGraph, qnn: QnnGraph, binary: string): void {
  const where = `${binary}: graph ${qnn.name} (from ${source.file})`;
  for (const [kind, want, got] of [['input', source.inputs, qnn.inputs], ['output', source.outputs, qnn.outputs]] as const) {
    const byName = new Map(got.map((t) => [t.name, t]));
    for (const t of want) {
      const q = byName.get(t.name);
      if (!q) {
        throw new Error(`${where} has no ${kind} '${t.name}' (its ${kind}s: ${got.map((x) => x.name).join(', ')}); ` +
          'the converter renamed it: graph I/O names must survive conversion unchanged');
      }
      const dtype = QNN_TO_ONNX[q.dataType];
      if (dtype !== t.dtype) {
        throw new Error(`${where}: ${kind} '${t.name}' is ${q.dataType} in the binary, the graph has ${t.dtype}; ` +
          'the converter must keep I/O types (--preserve_io_datatype), or the runtime would bind the wrong bytes');
      }
      if (q.dims.length !== t.shape.length || q.dims.some((d, i) => d !== t.shape[i])) {
        throw new Error(`${where}: ${kind} '${t.name}' has shape [${q.dims.join(', ')}] in the binary, [${t.shape.join(', ')}] in the graph`);
      }
    }
    const extra = got.filter((q) => !want.some((t) => t.name === q.name));
    if (extra.length) throw new Error(`${where} has ${kind}s the graph does not: ${extra.map((q) => q.name).join(', ')}`);
  }
}

export interface WrapperOptions {
  /** The QNN graph inside the binary (the EPContext node's name and partition_name). */
  qnnGraph: string;
  /** The binary's file name, relative to the wrapper (embed mode 0). */
  bin: string;
  sdkVersion: string;
  inputs: TensorIO[];
  outputs: TensorIO[];
}

/** Writes an EPContext wrapper: one com.microsoft EPContext node between the graph's inputs and outputs, the binary beside it. */
export function writeEpContextWrapper(path: string, o: WrapperOptions): void {
  const g = new GraphBuilder(o.qnnGraph);
  const ins = o.inputs.map((t) => g.input(t.name, t.dtype, t.shape));
  g.op('EPContext', ins, {
    // The attributes ONNX Runtime's QNN EP writes for its own compiles (see compile.ts' wrappers).
    main_context: 1, embed_mode: 0, ep_cache_context: o.bin, ep_sdk_version: o.sdkVersion,
    partition_name: o.qnnGraph, source: 'QNNExecutionProvider',
  }, o.outputs.length, { domain: MS_DOMAIN, name: o.qnnGraph, outputs: o.outputs.map((t) => t.name), dtype: o.outputs.map((t) => t.dtype) });
  for (const t of o.outputs) g.output(t.name, t.name, { dtype: t.dtype, shape: t.shape });
  writeModel(g, path, { externalThreshold: Infinity });
}
