// Stage `handoff`: the shipped graphs with the residual hand-off dtype the oracle gate chose
// (recipe `handoff: auto | f16`). For float16 every residual one context gives another (shard →
// shard → lm-head) is f16 at both ends — a Cast to f16 before the giving graph's output, a Cast to
// float after the taking graph's input, so the numbers inside are the gate's — and graphs.json says
// so, which is what the manifest's residual bindings (and the runtime's buffers) follow. The first
// graph's input comes from the host's float32 rows and stays float32. For float32 it is the quantize
// output as it was. Everything not rewritten is hard-linked: the output costs a few KB per graph.
import { mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import { META } from '../engine/cache.js';
import { GRAPHS_JSON, type ExportManifest, type GraphEntry } from '../export/graphs.js';
import { OnnxModel } from '../onnx/reader.js';
import { onnx } from '../onnx/proto.js';
import { linkOrCopy } from '../io/files.js';
import type { OracleResult } from '../gates/oracle.js';

export interface HandoffParams {
  /** The export input whose choice applies (the oracle's `handoff` key): 'quantize'. */
  variant: string;
}

const FLOAT = onnx.TensorProto.DataType.FLOAT;
const FLOAT16 = onnx.TensorProto.DataType.FLOAT16;

/** Renames every use of value `from` as a node input (and its value_info) to `to`. */
function renameUses(graph: onnx.IGraphProto, from: string, to: string): void {
  for (const n of graph.node ?? []) n.input = (n.input ?? []).map((x) => (x === from ? to : x));
  for (const v of graph.valueInfo ?? []) if (v.name === from) v.name = to;
}

function elemTypeOf(list: onnx.IValueInfoProto[] | null | undefined, name: string, file: string): onnx.TypeProto.ITensor {
  const v = (list ?? []).find((x) => x.name === name);
  const t = v?.type?.tensorType;
  if (!t) throw new Error(`${file}: no tensor ${name} among the graph's inputs/outputs (graphs.json names it as the residual)`);
  if (t.elemType !== FLOAT) throw new Error(`${file}: ${name} is element type ${t.elemType}, not float32: only a float32 residual is handed over as f16`);
  return t;
}

/**
 * The residual tensors a graph takes from or gives to another context. The first graph's input is
 * the host's own rows (a float32 residual, or gemma4's scaled embedding row): not a hand-off.
 */
function handedOver(entry: Pick<GraphEntry, 'stream'>): { input?: string; output?: string } {
  const s = entry.stream!;
  return { ...(s.from !== null ? { input: s.input } : {}), ...(s.output ? { output: s.output } : {}) };
}

/** The graph's residual hand-offs (handedOver) as f16 at its boundary, float32 inside. */
export function halfResidual(model: OnnxModel, entry: Pick<GraphEntry, 'stream' | 'file'>): void {
  const g = model.graph;
  const { input, output } = handedOver(entry);
  const head: onnx.INodeProto[] = [];
  const tail: onnx.INodeProto[] = [];
  if (input) {
    elemTypeOf(g.input, input, entry.file).elemType = FLOAT16;
    renameUses(g, input, `${input}_f32`);
    head.push({ name: `handoff/${input}`, opType: 'Cast', input: [input], output: [`${input}_f32`], attribute: [{ name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: FLOAT }] });
  }
  if (output) {
    elemTypeOf(g.output, output, entry.file).elemType = FLOAT16;
    renameUses(g, output, `${output}_f32`);
    for (const n of g.node ?? []) n.output = (n.output ?? []).map((x) => (x === output ? `${output}_f32` : x));
    tail.push({ name: `handoff/${output}`, opType: 'Cast', input: [`${output}_f32`], output: [output], attribute: [{ name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: FLOAT16 }] });
  }
  g.node = [...head, ...(g.node ?? []), ...tail];
}

/** The graphs.json entry with its residual tensors typed as the rewritten graph has them. */
function halfEntry(entry: GraphEntry): GraphEntry {
  const { input, output } = handedOver(entry);
  const half = (names: Array<string | undefined>) => (t: GraphEntry['inputs'][number]) => (names.includes(t.name) ? { ...t, dtype: 'float16' as const } : t);
  return { ...entry, inputs: entry.inputs.map(half([input])), outputs: entry.outputs.map(half([output])) };
}

/** Hard-links `from` into `to`, file by file (the quantize output is flat but for a few folders). */
function linkTree(from: string, to: string, skip: Set<string>): void {
  mkdirSync(to, { recursive: true });
  for (const name of readdirSync(from)) {
    if (skip.has(name)) continue;
    const src = join(from, name);
    if (statSync(src).isDirectory()) linkTree(src, join(to, name), new Set());
    else linkOrCopy(src, join(to, name));
  }
}

export function writeHandoffExport(graphsDir: string, outDir: string, dtype: 'float16' | 'float32'): { rewritten: string[] } {
  const manifest = JSON.parse(readFileSync(join(graphsDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  const rewrite = dtype === 'float16' ? manifest.contexts.flatMap((c) => c.graphs.filter((g) => g.stream)) : [];
  // Never the upstream entry's meta.json: the cache writes this entry's own into the same path, and
  // through a hard link that would rewrite the quantize entry's record.
  linkTree(graphsDir, outDir, new Set([GRAPHS_JSON, META, ...rewrite.map((g) => g.file)]));
  for (const entry of rewrite) {
    const model = OnnxModel.load(join(graphsDir, entry.file));
    halfResidual(model, entry);
    writeFileSync(join(outDir, entry.file), onnx.ModelProto.encode(model.proto).finish());
  }
  const names = new Set(rewrite.map((g) => g.name));
  const out: ExportManifest = { ...manifest, contexts: manifest.contexts.map((c) => ({ ...c, graphs: c.graphs.map((g) => (names.has(g.name) ? halfEntry(g) : g)) })) };
  writeFileSync(join(outDir, GRAPHS_JSON), JSON.stringify(out, null, 2));
  return { rewritten: rewrite.map((g) => g.name) };
}

export const stage: StageModule<HandoffParams> = {
  name: 'handoff',
  version: '1',
  async run(ctx) {
    const oracle = JSON.parse(readFileSync(join(ctx.inputs.oracle, 'oracle.json'), 'utf8')) as OracleResult;
    const choice = oracle.handoff?.[ctx.params.variant];
    if (!choice) throw new Error(`${join(ctx.inputs.oracle, 'oracle.json')}: no hand-off choice for '${ctx.params.variant}' (the oracle gate ran without the recipe's handoff setting)`);
    const { rewritten } = writeHandoffExport(ctx.inputs.quantize, ctx.out, choice.dtype);
    ctx.log(`residual hand-off ${choice.dtype}: ${choice.why}${rewritten.length ? `; ${rewritten.length} graphs take and give it as f16` : ''}`);
    return { summary: { dtype: choice.dtype, why: choice.why, graphs: rewritten } };
  },
};
