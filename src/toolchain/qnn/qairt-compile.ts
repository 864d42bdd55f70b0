// One context through the QAIRT SDK: run the plan (qairt.ts), then check the graphs the binary holds
// against the source graphs and write each one's EPContext wrapper (ep-context.ts), so the result
// has the layout of an onnxruntime-qnn compile: `<out>/<context>.bin` + `<out>/<graph>_ctx.onnx`.
import { rm } from 'node:fs/promises';
import { basename, join } from 'node:path';
import type { GraphEntry } from '../../export/graphs.js';
import { QnnCompileError, type HtpTarget } from './compile.js';
import { checkGraphIo, describeContextBinary, writeEpContextWrapper } from './ep-context.js';
import { qairtPlan, runQairtPlan } from './qairt.js';
import type { QairtSdk } from './qairt-sdk.js';

export interface QairtContextOptions {
  sdk: QairtSdk;
  sdkVersion: string;
  /** The context's graphs (files under `srcDir`), in order. */
  graphs: GraphEntry[];
  srcDir: string;
  outDir: string;
  contextName: string;
  arch: HtpTarget;
  fp16: boolean;
  qdqWeights: boolean;
  timeoutSeconds: number;
}

export interface QairtContextResult {
  bin: string;
  bytes: number;
  wrappers: Array<{ graph: string; path: string; qnnGraph: string }>;
  target: { socModel: number | null; dspArch: string | null };
  seconds: number;
  log: string;
}

export async function compileQairtContext(o: QairtContextOptions): Promise<QairtContextResult> {
  const plan = qairtPlan({
    sdk: o.sdk, graphs: o.graphs.map((g) => join(o.srcDir, g.file)), outDir: o.outDir, contextName: o.contextName,
    arch: o.arch, fp16: o.fp16, qdqWeights: o.qdqWeights,
  });
  const r = await runQairtPlan(plan, { arch: o.arch, timeoutSeconds: o.timeoutSeconds });
  const desc = describeContextBinary(r.info, plan.infoJson);
  const bin = basename(r.bin);
  const wrappers = o.graphs.map((g, i) => {
    const qnn = desc.graphs.find((x) => x.name === plan.graphNames[i]);
    if (!qnn) {
      throw new QnnCompileError(`${r.bin} holds no graph ${plan.graphNames[i]} (for ${g.file}); it holds: ${desc.graphs.map((x) => x.name).join(', ') || 'none'}`, 'failed', r.log);
    }
    try {
      checkGraphIo({ file: g.file, inputs: g.inputs, outputs: g.outputs }, qnn, bin);
    } catch (e) {
      throw new QnnCompileError((e as Error).message, 'failed', r.log);
    }
    const path = join(o.outDir, `${g.name}_ctx.onnx`);
    writeEpContextWrapper(path, { qnnGraph: qnn.name, bin, sdkVersion: desc.buildId ?? o.sdkVersion, inputs: g.inputs, outputs: g.outputs });
    return { graph: g.name, path, qnnGraph: qnn.name };
  });
  // The converted models and their libraries hold a full copy of the weights each: only the binary ships.
  await rm(join(o.outDir, 'model'), { recursive: true, force: true });
  await rm(join(o.outDir, 'libs'), { recursive: true, force: true });
  return { bin: r.bin, bytes: r.bytes, wrappers, target: r.target, seconds: r.seconds, log: r.log };
}
