// Calibrates the compile's memory model (pipelines/memory.ts COMPILE): compiles ONE context of a
// quantize stage entry with onnxruntime-qnn, as the compile stage does, and samples this process
// tree's private (RssAnon) and mapped (RssFile) memory every --interval-ms, printing the peaks, the
// context's weight bytes, the binary's size and the prediction, as JSON (the timeline with --timeline).
//
//   npx tsx bench/compile-memory.ts <quantize entry dir> <context name> --out DIR [--arch v81]
//
// At real size run it under /work/prompts/heavy.sh -x (a 1.9 GB context peaks near 20 GB).
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { compileContext } from '../src/toolchain/qnn/compile.js';
import { getArch } from '../src/arch/table.js';
import { sampleTree } from '../src/engine/memory.js';
import { GRAPHS_JSON, type ExportManifest } from '../src/export/graphs.js';
import { COMPILE } from '../pipelines/memory.js';
import { benchArgs, positiveInt } from './util.js';

const { values, positionals, num } = benchArgs({
  out: { type: 'string', default: '' },
  arch: { type: 'string', default: 'v81' },
  'interval-ms': { type: 'string', default: '200' },
  timeline: { type: 'string', default: '' },
});
const [quantizeDir, name] = positionals;
if (!quantizeDir || !name || !values.out) throw new Error('usage: compile-memory.ts <quantize entry dir> <context name> --out DIR [--arch v81] [--timeline FILE]');
const manifest = JSON.parse(readFileSync(join(quantizeDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
const ctx = manifest.contexts.find((c) => c.name === name);
if (!ctx) throw new Error(`${join(quantizeDir, GRAPHS_JSON)}: no context '${name}'; it has ${manifest.contexts.map((c) => c.name).join(', ')}`);
const arch = getArch(values.arch);

const t0 = Date.now();
const timeline: Array<[number, number, number]> = [];
let peakPrivate = 0;
let peakMapped = 0;
const sample = () => {
  const s = sampleTree(process.pid);
  peakPrivate = Math.max(peakPrivate, s.privateBytes);
  peakMapped = Math.max(peakMapped, s.mappedBytes);
  timeline.push([(Date.now() - t0) / 1000, s.privateBytes, s.mappedBytes]);
};
const timer = setInterval(sample, num('interval-ms', positiveInt));
sample();
const r = await compileContext({
  graphs: ctx.graphs.map((g) => join(quantizeDir, g.file)), outDir: values.out, contextName: name,
  arch: { socModel: arch.socModel, dspArch: arch.dspArch, vtcmMb: arch.vtcmMb }, fp16: true, timeoutSeconds: 3 * 3600,
});
sample();
clearInterval(timer);
if (values.timeline) writeFileSync(values.timeline, timeline.map((t) => t.join('\t')).join('\n') + '\n');
const predictedPrivate = COMPILE.floor + COMPILE.perByte * ctx.dataBytes;
console.log(JSON.stringify({
  context: name, weightBytes: ctx.dataBytes, binaryBytes: r.bytes, compileSeconds: r.compileSeconds, wallSeconds: (Date.now() - t0) / 1000,
  peakPrivateBytes: peakPrivate, peakMappedBytes: peakMapped, pythonPeakRssBytes: r.peakRssBytes,
  predictedPrivateBytes: Math.round(predictedPrivate), measuredOverPredicted: +(peakPrivate / predictedPrivate).toFixed(3),
}));
