// Every stage's predicted peak memory, in one place: a floor (the process and its runtime: node,
// Python with torch, ORT) plus a multiple of the bytes the stage processes (the checkpoint, a
// context's weights from plan.json, the exported graphs' weights). Each constant names the
// measurement it comes from; `measured` ones were fitted to runs, `provisional` ones describe a stage
// that is being rewritten (its figure is today's, and will move). The run record puts each stage's
// prediction beside its measured peak and warns past 25% over: recalibrate here from those records
// (bench/build.ts prints them at real size).
//
// private = anonymous memory; mapped = file pages the stage keeps touching (see MemoryPrediction).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { MemoryPrediction, StageMemory } from '../src/engine/stage.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import type { ShardPlan } from '../src/plan/shards.js';
import { GRAPHS_JSON, type ExportManifest } from '../src/families/export-stage.js';

const MB = 1e6;
const GB = 1e9;
const gb = (b: number) => `${(b / GB).toFixed(2)} GB`;

/** floor + perByte × bytes, as private (and optionally mapped) bytes, saying how. */
interface Linear {
  /** Private bytes with nothing to process. */
  floor: number;
  /** Private bytes per byte processed. */
  perByte: number;
  /** Mapped working set: floor, and per byte processed. */
  mappedFloor?: number;
  mappedPerByte?: number;
}

function linear(m: Linear, bytes: number, what: string): MemoryPrediction {
  const privateBytes = Math.round(m.floor + m.perByte * bytes);
  const mappedBytes = Math.round((m.mappedFloor ?? 0) + (m.mappedPerByte ?? 0) * bytes);
  const mapped = m.mappedFloor !== undefined || m.mappedPerByte ? `; mapped ${gb(m.mappedFloor ?? 0)} + ${m.mappedPerByte ?? 0} × that` : '';
  return { privateBytes, mappedBytes, how: `${gb(m.floor)} + ${m.perByte} × ${gb(bytes)} (${what})${mapped}` };
}

const fixed = (privateBytes: number, mappedBytes: number, source: string): StageMemory => ({
  from: [], predict: () => ({ privateBytes, mappedBytes, how: `a fixed ${gb(privateBytes)} private, ${gb(mappedBytes)} mapped (${source})` }),
});

/** The checkpoint's weight bytes, from the fetch stage's record of its files. */
export function checkpointBytes(fetchDir: string): number {
  const ref = readCheckpointRef(fetchDir);
  return Object.entries(ref.files).filter(([f]) => f.endsWith('.safetensors')).reduce((a, [, n]) => a + n, 0);
}

function readPlan(planDir: string): ShardPlan {
  return JSON.parse(readFileSync(join(planDir, 'plan.json'), 'utf8')) as ShardPlan;
}

/** The contexts a plan compiles, by name and weight bytes (the compile runs them one after another). */
export function planContexts(plan: ShardPlan): Array<{ name: string; bytes: number }> {
  const out = plan.shards.map((s) => ({ name: `shard${s.index}`, bytes: s.weightBytes }));
  if (plan.lmHead.placement === 'separate') out.push({ name: 'lm_head', bytes: plan.lmHead.bytes });
  return out;
}

/** The largest context of an export (weights as that export stored them). */
function largestExported(dir: string): { name: string; bytes: number } {
  const m = JSON.parse(readFileSync(join(dir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  return m.contexts.map((c) => ({ name: c.name, bytes: c.dataBytes })).reduce((a, b) => (b.bytes > a.bytes ? b : a));
}

function exportedTotal(dir: string): number {
  const m = JSON.parse(readFileSync(join(dir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  return m.contexts.reduce((a, c) => a + c.dataBytes, 0);
}

// ---- the constants ----------------------------------------------------------------------------

/**
 * compile (onnxruntime-qnn, oracles/qnn_compile.py), per context, contexts one after another, so the
 * stage's peak is its largest context's. measured: Qwen3-4B synthetic, 1.91 GB W8 context → 20.2 GB
 * (issue 12); tiny-qwen3 v81 contexts (see COMPILE_FLOOR). The QNN prepare holds ~10× the context's
 * weights while it writes the binary.
 */
export const COMPILE: Linear = { floor: 0.9 * GB, perByte: 10, mappedFloor: 0.35 * GB };

/** trace: provisional (engineer A is bounding it). today: the whole model in fp32, 21.4 GB for the 8.04 GB bf16 Qwen3-4B (issue 12) ≈ 2.6 × its bytes. */
export const TRACE: Linear = { floor: 0.6 * GB, perByte: 2.6, mappedFloor: 0.4 * GB };

/** oracle: provisional (engineer C). today: 8.5 GB at 4B with a 7.3 GB fp32 largest context (issue 12) ≈ 1.1 × it; one session at a time. */
export const ORACLE: Linear = { floor: 0.4 * GB, perByte: 1.1, mappedFloor: 0.1 * GB };

/** parity: provisional (engineer D). today: every graph its own session and copy of its shard (prefill + decode): > 22 GB at 4B, killed (issue 12) — 2 × the fp32 weights is the lower bound taken. */
export const PARITY: Linear = { floor: 0.4 * GB, perByte: 2, mappedFloor: 0.1 * GB };

/** emulation (x86 HTP simulator, tiny twins only): provisional, 3 × the W8 weights it runs. */
export const EMULATION: Linear = { floor: 1.0 * GB, perByte: 3, mappedFloor: 0.4 * GB };

export const stageMemory = {
  /** fetch: streams the checkpoint through sha256 and the NaN scan in chunks; measured 0.15 GB (twin). */
  fetch: fixed(0.5 * GB, 0.2 * GB, 'streams the checkpoint; measured on tiny-qwen3'),
  plan: fixed(0.2 * GB, 0.1 * GB, 'reads config.json; measured on tiny-qwen3'),
  /** export and quantize stream tensor by tensor: measured 0.15 / 0.18 GB at 4B (issue 12), independent of size. */
  export: fixed(0.4 * GB, 0.1 * GB, 'streams tensor by tensor: 0.15 GB measured at 4B (issue 12)'),
  quantize: fixed(0.4 * GB, 0.1 * GB, 'streams tensor by tensor: 0.18 GB measured at 4B (issue 12)'),
  native: fixed(1.5 * GB, 0.2 * GB, 'the C++ build: measured on this machine'),
  bundle: fixed(0.5 * GB, 0.2 * GB, 'copies files'),
  trace: { from: ['fetch'], predict: (d) => linear(TRACE, checkpointBytes(d.fetch), 'checkpoint bytes; provisional') } satisfies StageMemory,
  oracle: {
    from: ['export'],
    predict: (d) => { const c = largestExported(d.export); return linear(ORACLE, c.bytes, `largest fp32 context ${c.name}; provisional`); },
  } satisfies StageMemory,
  parity: { from: ['export'], predict: (d) => linear(PARITY, exportedTotal(d.export), 'all fp32 graph weights; provisional') } satisfies StageMemory,
  emulation: { from: ['quantize'], predict: (d) => linear(EMULATION, exportedTotal(d.quantize), 'all W8 graph weights; provisional') } satisfies StageMemory,
  /** Predicted from plan.json, right after the plan stage: a compile that cannot fit is refused before the trace. */
  compile: {
    from: ['plan'],
    predict: (d) => compilePrediction(readPlan(d.plan)),
    remedy: (d, p, limit) => compileOptions(readPlan(d.plan), p, limit),
  } satisfies StageMemory,
};

/**
 * What a user whose machine cannot compile this plan can do. forge never changes the plan by itself
 * to suit the build machine: the plan is cut for the device, and a smaller ceiling means more,
 * smaller contexts on the phone too.
 */
export function compileOptions(plan: ShardPlan, p: MemoryPrediction, limitBytes: number): string {
  const machine = `a machine with at least ${Math.ceil(workingSetOf(p) / 0.75 / GB)} GB of memory (the default budget is 75% of it)`;
  // The largest context that would fit under the limit, by the same model.
  const fits = (limitBytes - COMPILE.floor - p.mappedBytes) / COMPILE.perByte;
  const layer = Math.max(...plan.shards.map((s) => s.weightBytes / (s.last - s.first + 1)));
  const head = plan.lmHead.placement === 'separate' ? plan.lmHead.bytes : 0;
  // A smaller shard ceiling helps only when a layer and the separate lm-head fit under it.
  if (fits < layer || head > fits) return `options: ${machine} (no shard ceiling fits: ${head > fits ? `the lm-head context alone is ${gb(head)}` : `one layer stores ${gb(layer)}`})`;
  const ceiling = Math.floor((fits / GB) * 100) / 100;
  return `options: a smaller shard ceiling for this build (--shard-ceiling ${ceiling.toFixed(2)} or less: more, smaller contexts than the device-optimal plan), or ${machine}`;
}

const workingSetOf = (p: MemoryPrediction) => p.privateBytes + p.mappedBytes;

/** The compile's peak: its largest context's (they compile one after another). */
export function compilePrediction(plan: ShardPlan): MemoryPrediction {
  const largest = planContexts(plan).reduce((a, b) => (b.bytes > a.bytes ? b : a));
  const p = linear(COMPILE, largest.bytes, `context ${largest.name}'s weights in plan.json, the largest of ${plan.contexts}`);
  return { ...p, how: `compile of ${largest.name}: ${p.how}` };
}

export { MB };
