// The Gemma-4 audio encoder graph (src/families/gemma4-audio.ts) at a real size: built from a
// checkpoint directory in one scheme for a fixed clip, printing its interface, node count, parameter
// count (the audio tower + embed_audio tensors) and bytes (graph file + weight data), and optionally
// compiling it for an arch with onnxruntime-qnn (oracles/qnn_compile.py) for the context binary's size.
//
//   python test/helpers/gemma4_audio_reference.py /tmp/e4b --e4b          # random E4B-size checkpoint
//   node --import tsx bench/gemma4-audio-size.ts /tmp/e4b/ckpt /tmp/e4b/out [--scheme w8] [--frames 3000] [--compile v81]
//
// 3000 frames = 30 s at the feature extractor's hop of 10 ms (its maximum clip) → 750 tokens.
import { mkdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { openCheckpoint } from '../src/io/checkpoint.js';
import { ExternalDataWriter } from '../src/onnx/external.js';
import { GraphBuilder } from '../src/onnx/builder.js';
import { writeModel } from '../src/onnx/writer.js';
import { WeightStore } from '../src/quant/weights.js';
import { getArch } from '../src/arch/table.js';
import { compileContext } from '../src/toolchain/qnn/compile.js';
import { gemma4AudioEncoderGraph, parseGemma4AudioConfig } from '../src/families/gemma4-audio.js';
import type { QuantScheme } from '../src/recipe/schema.js';

const { positionals, values } = parseArgs({ allowPositionals: true, options: { scheme: { type: 'string', default: 'w8' }, frames: { type: 'string', default: '3000' }, compile: { type: 'string' } } });
const [ckptDir, out] = positionals;
if (!ckptDir || !out) throw new Error('usage: bench/gemma4-audio-size.ts CKPT_DIR OUT_DIR [--scheme w8] [--frames 3000] [--compile v81]');
const scheme = values.scheme as QuantScheme;
mkdirSync(out, { recursive: true });
const raw = JSON.parse(readFileSync(join(ckptDir, 'config.json'), 'utf8')) as { text_config: { hidden_size: number } };
const config = parseGemma4AudioConfig(raw, join(ckptDir, 'config.json'));
const ckpt = await openCheckpoint(ckptDir);
const sink = new ExternalDataWriter(join(out, 'audio.data'));
const g = new GraphBuilder('audio');
const t0 = Date.now();
const iface = await gemma4AudioEncoderGraph(g, config, raw.text_config.hidden_size, Number(values.frames), { store: new WeightStore(ckpt, sink), scheme, lmHeadScheme: scheme });
await sink.commitAsync();
const file = join(out, 'audio.onnx');
writeModel(g, file, { externalThreshold: Infinity });
const params = ckpt.names().filter((n) => n.startsWith('model.audio_tower.') || n.startsWith('model.embed_audio.')).reduce((a, n) => a + ckpt.info(n).shape.reduce((x, y) => x * y, 1), 0);
await ckpt.close();
const model = g.toModelProto();
console.log(JSON.stringify({
  scheme, frames: Number(values.frames), inputs: iface.inputs, outputs: iface.outputs, probes: Object.keys(iface.probes),
  nodes: model.graph!.node!.length, parameters: params, graphFileBytes: statSync(file).size, weightDataBytes: sink.size, buildSeconds: (Date.now() - t0) / 1000,
}, null, 1));
if (values.compile) {
  const arch = getArch(values.compile);
  const t1 = Date.now();
  const r = await compileContext({ graphs: [file], outDir: join(out, 'qnn'), contextName: 'audio', arch: { socModel: arch.socModel, dspArch: arch.dspArch, vtcmMb: arch.vtcmMb }, fp16: true, timeoutSeconds: 3600, separate: true });
  console.log(JSON.stringify({ arch: arch.id, contextBytes: r.bytes, cpuNodes: r.wrappers[0].cpuNodes, compileSeconds: (Date.now() - t1) / 1000 }));
}
