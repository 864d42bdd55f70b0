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
import { fixedMemory, workingSet, type MemoryPrediction, type StageMemory } from '../src/engine/stage.js';
import { machineFor } from '../src/engine/scheduler.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import type { Family } from '../src/families/types.js';
import type { ShardPlan } from '../src/plan/shards.js';
import { GRAPHS_JSON, type ExportManifest } from '../src/export/graphs.js';
import { formatBytes as gb } from '../src/units.js';

const GB = 1e9;

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
  const mapped = m.mappedPerByte ? `${gb(m.mappedFloor ?? 0)} + ${m.mappedPerByte} × that` : gb(m.mappedFloor ?? 0);
  return { privateBytes, mappedBytes, how: `${gb(m.floor)} + ${m.perByte} × ${gb(bytes)} (${what}) private, ${mapped} mapped` };
}

const fixed = (privateBytes: number, mappedBytes: number, source: string): StageMemory =>
  fixedMemory(privateBytes, `a fixed ${gb(privateBytes)} private, ${gb(mappedBytes)} mapped (${source})`, mappedBytes);

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

function exportContext(dir: string): ExportManifest {
  return JSON.parse(readFileSync(join(dir, GRAPHS_JSON), 'utf8')) as ExportManifest;
}

function exportedTotal(dir: string): number {
  return exportContext(dir).contexts.reduce((a, c) => a + c.dataBytes, 0);
}

// ---- the constants ----------------------------------------------------------------------------
// Floors: tiny-qwen3 v81 on this machine (2 cores, 24 GB), FORGE_CACHE empty, each stage's measured
// peak private / mapped: fetch 558 / 514 MB (the twin is made with torch), plan 54 / 45, trace
// 471 / 499, export 66 / 46, quantize 75 / 46, oracle 79 / 74, compile 148 / 147, parity 73 / 75,
// emulation 211 / 147, bundle 62 / 45 (native: 44 / 45, its C++ build was cached). Reproduce:
// FORGE_CACHE=$(mktemp -d) ./forge build tiny-qwen3 --arch v81 --json (stages[].peakPrivateBytes …).

/**
 * compile (onnxruntime-qnn), per context; contexts compile one after another, so the stage's peak is
 * its largest context's. measured, in the plan's weight bytes of the context:
 * - tiny-qwen3 shard0 (0.2 MB): 148 MB private, 147 MB mapped (the floor);
 * - synthetic Qwen3-4B shard0 under --shard-ceiling 0.65 (615 MB, 6 layers; binary 639 MB):
 *   6.69 GB private at the spike as the binary is written (steady ~3.7 GB while the decode graph
 *   prepares), 0.70 GB mapped (the binary read back at the end), 424 s
 *   (bench/compile-memory.ts, under heavy.sh -x);
 * - synthetic Qwen3-4B default plan (1.85 GB shards, 1.91 GB binaries): 20.2 GB peak RSS (issue 12;
 *   not split into private and mapped).
 * 0.15 GB + 10.7 × bytes gives 6.73 GB (+0.6%) and 19.9 GB (-1.5% of the RSS) for the two.
 */
export const COMPILE: Linear = { floor: 0.15 * GB, perByte: 10.7, mappedFloor: 0.16 * GB, mappedPerByte: 0.9 };

/**
 * trace (oracles/trace.py streams the weights: the checkpoint stays memory-mapped in its dtype, each
 * module gets its fp32 upcast only for its own forward): private = the Python/torch floor + the
 * largest unit in fp32 (the lm_head, vocab × hidden, or one decoder layer) + the recorded tensors;
 * mapped = the checkpoint, re-read every step. measured (bench/trace.ts, 1 prompt, 6 steps):
 * synthetic Qwen3-4B 2.00 GB private (lm_head 1.56 GB fp32) / 8.40 GB mapped; the Qwen3-8B shape
 * 2.94 GB (lm_head 2.49 GB) / 15.4 GB; tiny twins 0.43 GB. The recorded tensors of 144 steps add
 * ~0.2 GB at 4B (written once at the end): `recorded` below.
 */
export const TRACE = { floor: 0.45 * GB, recorded: 0.4 * GB, mappedFloor: 0.45 * GB };

/** The largest unit the streamed trace upcasts at once, in fp32 bytes, from the text config and the checkpoint's size. */
export function traceUnitBytes(config: Record<string, unknown>, weightBytes: number): { bytes: number; what: string } {
  const num = (k: string) => (typeof config[k] === 'number' ? (config[k] as number) : 0);
  const head = 4 * num('vocab_size') * num('hidden_size');
  const layers = num('num_hidden_layers');
  // bf16/f16 weights double in fp32; a layer is at most its share of the checkpoint.
  const layer = layers > 0 ? (2 * weightBytes) / layers : 0;
  return head >= layer ? { bytes: head, what: 'the fp32 lm_head (vocab × hidden × 4)' } : { bytes: layer, what: 'one decoder layer in fp32' };
}

/**
 * trace: the streamed trace's floor, its largest fp32 unit and the tensors it records, private; the
 * checkpoint mapped. With `family`, what HF's loader copies privately for it (Family.hfLoadCopies).
 */
export function traceMemory(family?: Family<unknown>): StageMemory {
  return {
    from: ['fetch'],
    predict: (d) => {
      const weights = checkpointBytes(d.fetch);
      const unit = traceUnitBytes(textConfig(d.fetch), weights);
      const copies = family?.hfLoadCopies?.(family.parseConfig(readConfig(d.fetch), 'config.json'));
      return {
        privateBytes: Math.round(TRACE.floor + unit.bytes + TRACE.recorded + (copies?.bytes ?? 0)),
        mappedBytes: Math.round(TRACE.mappedFloor + weights),
        how: `${gb(TRACE.floor)} + ${gb(unit.bytes)} (${unit.what}) + ${gb(TRACE.recorded)} (recorded tensors)${copies ? ` + ${gb(copies.bytes)} (${copies.what})` : ''} private, ${gb(TRACE.mappedFloor)} + ${gb(weights)} (the checkpoint, mapped)`,
      };
    },
  };
}

/** The checkpoint's config.json as it is. */
function readConfig(fetchDir: string): Record<string, unknown> {
  return JSON.parse(readFileSync(join(readCheckpointRef(fetchDir).absDir, 'config.json'), 'utf8')) as Record<string, unknown>;
}

/** The checkpoint's config.json (text_config for a multimodal one). */
function textConfig(fetchDir: string): Record<string, unknown> {
  const config = JSON.parse(readFileSync(join(readCheckpointRef(fetchDir).absDir, 'config.json'), 'utf8')) as Record<string, unknown>;
  return (config.text_config ?? config) as Record<string, unknown>;
}

/** fp32 K and V caches of every layer at maxContext: what one decode case feeds (an upper bound where some layers keep no cache). */
export function kvCacheBytes(config: Record<string, unknown>, maxContext: number): number {
  const n = (k: string) => (typeof config[k] === 'number' ? (config[k] as number) : 0);
  const headDim = n('head_dim') || n('hidden_size') / Math.max(1, n('num_attention_heads'));
  return n('num_hidden_layers') * 2 * (n('num_key_value_heads') || n('num_attention_heads')) * headDim * maxContext * 4;
}

/**
 * oracle (CPU-gate form, src/gates/cpu-form.ts: weights mapped, cast or dequantized block by block
 * per call): private = the node/ORT floor + one case's feeds (the K/V caches at maxContext) + a
 * weight's transient; mapped = the weights a graph re-reads each case (at most the checkpoint).
 * measured on the synthetic Qwen3-4B (bench/oracle.ts, load 2–7): W8 1.11 GB private / 1.76 GB
 * mapped, fp32 (an fp32 export) 1.34 GB / 6.84 GB; in `forge build` (bench/build.ts, both variants,
 * the fp32 reading the bf16 checkpoint in place) 1.74 GB / 3.71 GB. The K/V caches at 4096 are 1.21 GB of that.
 */
export const ORACLE = { floor: 0.55 * GB, mappedFloor: 0.1 * GB };

/**
 * parity (qhx_generate on the CPU: each weight file mapped once and shared by the graphs,
 * native/src/shared_weights.cpp; graphs in CPU-gate form): private = floor + the K/V caches + a
 * weight's transient; mapped = the variant's weights (the checkpoint for the reference, read in place).
 * measured: in `forge build` of the synthetic Qwen3-4B (bench/build.ts; both variants in CPU form,
 * one qhx_generate at a time) 2.04 GB private / 8.12 GB mapped, of which the K/V caches 1.21 GB;
 * before the CPU form (bench/parity-memory.ts, W8) 2.93 GB, the lm-head's whole fp32 Cast 1.56 GB of it.
 */
export const PARITY = { floor: 0.9 * GB, mappedFloor: 0.1 * GB };

/** K/V feeds + mapped weights, shared by the two CPU gates. */
function cpuGatePrediction(m: { floor: number; mappedFloor: number }, d: Record<string, string>, what: string): MemoryPrediction {
  const kv = kvCacheBytes(textConfig(d.fetch), exportContext(d.export).maxContext);
  const weights = checkpointBytes(d.fetch);
  return {
    privateBytes: Math.round(m.floor + kv),
    mappedBytes: Math.round(m.mappedFloor + weights),
    how: `${gb(m.floor)} + ${gb(kv)} (K/V caches at maxContext) private, ${gb(m.mappedFloor)} + ${gb(weights)} (the checkpoint's weights, read in place) mapped; ${what}`,
  };
}

/** emulation (x86 HTP simulator; tiny twins only): provisional 3 × the W8 weights; floor measured on tiny-qwen3. */
export const EMULATION: Linear = { floor: 0.25 * GB, perByte: 3, mappedFloor: 0.2 * GB };

export const stageMemory = {
  /** fetch: streams the checkpoint through sha256 and the NaN scan; a twin is made with torch (measured 558 / 514 MB). */
  fetch: fixed(0.65 * GB, 0.6 * GB, 'measured on tiny-qwen3, whose twin is made with torch; a local checkpoint is streamed'),
  plan: fixed(0.1 * GB, 0.1 * GB, 'reads config.json; measured on tiny-qwen3'),
  // Graph protobufs only (weights are external and hard-linked): as the plan stage, not measured apart.
  handoff: fixed(0.1 * GB, 0.1 * GB, "rewrites the graphs' protobufs without their weights; provisional, as the plan stage"),
  /** export and quantize stream tensor by tensor; the synthetic 4B in forge build (bench/build.ts): export 99 / 46 MB, quantize 129 / 46 MB. */
  export: fixed(0.2 * GB, 0.1 * GB, 'writes graphs, the weights read in place: 99 MB private, 46 MB mapped at 4B'),
  quantize: fixed(0.2 * GB, 0.1 * GB, 'streams tensor by tensor: 129 MB private, 46 MB mapped at 4B'),
  /** native: the C++ build (g++ on 2 cores); not measured (it was cached in every run here): provisional. */
  native: fixed(1.0 * GB, 0.1 * GB, 'the C++ build; provisional, not measured'),
  bundle: fixed(0.1 * GB, 0.1 * GB, 'copies files; measured on tiny-qwen3'),
  trace: traceMemory(),
  oracle: { from: ['fetch', 'export'], predict: (d) => cpuGatePrediction(ORACLE, d, 'one graph at a time') } satisfies StageMemory,
  /**
   * precision (quant 'auto'): one-layer exports streamed as quantize does, then the oracle's CPU gate
   * and host parity on them, one after the other: the larger of the two models (parity's floor), not
   * measured apart at real size (tiny-qwen3.5: 242 MB private, 104 MB mapped).
   */
  precision: (maxContext: number) => ({
    from: ['fetch'],
    predict: (d) => {
      const kv = kvCacheBytes(textConfig(d.fetch), maxContext);
      const weights = checkpointBytes(d.fetch);
      const floor = Math.max(ORACLE.floor, PARITY.floor);
      return { privateBytes: Math.round(floor + kv), mappedBytes: Math.round(ORACLE.mappedFloor + weights), how: `the oracle's and parity's: ${gb(floor)} + ${gb(kv)} (K/V caches at maxContext) private, ${gb(ORACLE.mappedFloor)} + ${gb(weights)} (the checkpoint's weights) mapped; not measured apart` };
    },
  }) satisfies StageMemory,
  parity: { from: ['fetch', 'export'], predict: (d) => cpuGatePrediction(PARITY, d, 'one variant at a time') } satisfies StageMemory,
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
  const machine = `a machine with at least ${Math.ceil(machineFor(workingSet(p)) / GB)} GB of memory`;
  // The largest context that would fit under the limit, by the same model (private and mapped).
  const fits = (limitBytes - COMPILE.floor - (COMPILE.mappedFloor ?? 0)) / (COMPILE.perByte + (COMPILE.mappedPerByte ?? 0));
  const layer = Math.max(...plan.shards.map((s) => s.weightBytes / (s.last - s.first + 1)));
  const head = plan.lmHead.placement === 'separate' ? plan.lmHead.bytes : 0;
  // A smaller shard ceiling helps only when a layer and the separate lm-head fit under it.
  if (fits <= 0) return `options: ${machine} (no shard ceiling fits: the compiler needs ${gb(COMPILE.floor + (COMPILE.mappedFloor ?? 0))} before any weights)`;
  if (fits < layer || head > fits) return `options: ${machine} (no shard ceiling fits: ${head > fits ? `the lm-head context alone is ${gb(head)}` : `one layer stores ${gb(layer)}`})`;
  // Three significant digits, rounded down (a tiny twin's contexts are kilobytes).
  const digits = Math.max(0, 2 - Math.floor(Math.log10(fits / GB)));
  const ceiling = Math.floor((fits / GB) * 10 ** digits) / 10 ** digits;
  return `options: a smaller shard ceiling for this build (--shard-ceiling ${ceiling} or less: more, smaller contexts than the device-optimal plan), or ${machine}`;
}


/** The compile's peak: its largest context's (they compile one after another). */
export function compilePrediction(plan: ShardPlan): MemoryPrediction {
  const largest = planContexts(plan).reduce((a, b) => (b.bytes > a.bytes ? b : a));
  const p = linear(COMPILE, largest.bytes, `context ${largest.name}'s weights in plan.json, the largest of ${plan.contexts}`);
  return { ...p, how: `compile of ${largest.name}: ${p.how}` };
}

