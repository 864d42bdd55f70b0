// A copy of a graph that also outputs internal values (the residual stream after each layer), so the
// oracle gate can say which layer left the oracle without the bundle's graphs carrying extra
// outputs. The copy lives in a scratch directory beside hard links to the weights: ORT refuses
// external data reached through a symlink that leaves the model's directory. `scratch` should be
// on the same filesystem as the model (else the weights are copied). `rewrite` edits the copy first.
import { mkdirSync, writeFileSync } from 'node:fs';
import { linkOrCopy } from '../io/files.js';
import { basename, dirname, join } from 'node:path';
import { OnnxModel } from '../onnx/reader.js';
import { onnx } from '../onnx/proto.js';

export function writeProbeModel(modelPath: string, values: string[], scratch: string, rewrite?: (model: OnnxModel) => void): string {
  const model = OnnxModel.load(modelPath);
  rewrite?.(model); // e.g. the CPU-gate form (cpu-form.ts), before the data files it references are linked
  const graph = model.graph;
  const have = new Set((graph.output ?? []).map((o) => o.name));
  for (const v of values) {
    if (have.has(v)) continue;
    graph.output!.push({ name: v, type: { tensorType: { elemType: onnx.TensorProto.DataType.FLOAT } } });
  }
  mkdirSync(scratch, { recursive: true });
  const locations = new Set<string>();
  for (const t of graph.initializer ?? []) for (const e of t.externalData ?? []) if (e.key === 'location') locations.add(e.value!);
  for (const loc of locations) {
    const link = join(scratch, loc);
    linkOrCopy(join(dirname(modelPath), loc), link);
  }
  const out = join(scratch, basename(modelPath));
  writeFileSync(out, onnx.ModelProto.encode(model.proto).finish());
  return out;
}
