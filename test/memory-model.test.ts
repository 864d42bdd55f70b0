// The build's memory model (pipelines/memory.ts): what each stage is predicted to need, from what it
// processes, and what a user whose machine cannot compile a plan is told.
import { describe, it, expect } from 'vitest';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { COMPILE, ORACLE, PARITY, TRACE, compileOptions, compilePrediction, kvCacheBytes, stageMemory, traceMemory, traceUnitBytes } from '../pipelines/memory.js';
import { getFamily } from '../src/families/index.js';
import type { Family } from '../src/families/types.js';
import { buildPipeline } from '../pipelines/build.js';
import { defaultMemoryBudget, machineFor } from '../src/engine/scheduler.js';
import { archSettings, loadRecipe } from '../src/recipe/load.js';
import type { ShardPlan } from '../src/plan/shards.js';

const GB = 1e9;

/** A plan of `shards` shards of `layers` layers each at `shardBytes`, and a separate lm-head. */
function plan(shards: number, shardBytes: number, headBytes: number, layers = 6): ShardPlan {
  return {
    arch: 'v81', socModel: 87, ceilingBytes: 2 * GB, quant: 'w8', layers: shards * layers,
    shards: Array.from({ length: shards }, (_, i) => ({ index: i, first: i * layers, last: i * layers + layers - 1, weightBytes: shardBytes, graphs: ['prefill', 'decode'] })),
    lmHead: { placement: 'separate', quant: 'fp16', bytes: headBytes, tied: true },
    hostTables: [], contexts: shards + 1, graphs: 2 * shards + 1, dropped: [], totalContextBytes: shards * shardBytes + headBytes,
  };
}

describe('compile memory', () => {
  it('is its largest context\'s prediction (contexts compile one after another), naming the context', () => {
    const p = compilePrediction(plan(2, 1.91 * GB, 0.78 * GB));
    expect(p.privateBytes).toBe(Math.round(COMPILE.floor + COMPILE.perByte * 1.91 * GB));
    expect(p.how).toMatch(/^compile of shard0: .* × 1\.91 GB \(context shard0's weights in plan\.json, the largest of 3\)/);
    // A separate lm-head larger than every shard is the one that counts.
    expect(compilePrediction(plan(6, 0.6 * GB, 0.78 * GB)).how).toMatch(/^compile of lm_head:/);
  });

  it('grows with the context: a plan cut under a smaller ceiling is predicted to need less', () => {
    expect(compilePrediction(plan(7, 0.6 * GB, 0.3 * GB)).privateBytes).toBeLessThan(compilePrediction(plan(2, 1.91 * GB, 0.78 * GB)).privateBytes);
  });

  it('names a shard ceiling that would fit the limit, when the layers and the lm-head allow one', () => {
    const pl = plan(2, 1.91 * GB, 0.5 * GB);
    const p = compilePrediction(pl);
    const text = compileOptions(pl, p, 12 * GB);
    const ceiling = Number(/--shard-ceiling ([\d.]+)/.exec(text)![1]) * GB;
    expect(text).toMatch(/^options: a smaller shard ceiling for this build \(--shard-ceiling [\d.]+ or less: more, smaller contexts than the device-optimal plan\), or a machine with at least \d+ GB of memory/);
    // The ceiling it names is predicted to fit the limit by the same model.
    const at = compilePrediction(plan(6, ceiling, 0.5 * GB));
    expect(at.privateBytes + at.mappedBytes).toBeLessThanOrEqual(12 * GB);
    expect(ceiling).toBeGreaterThan(0.3 * GB); // a layer (0.32 GB) fits under it
  });

  it('names only a bigger machine when no shard ceiling can help (the lm-head context alone is over)', () => {
    const pl = plan(2, 1.91 * GB, 0.78 * GB);
    expect(compileOptions(pl, compilePrediction(pl), 5 * GB)).toMatch(/^options: a machine with at least \d+ GB of memory \(no shard ceiling fits: the lm-head context alone is 780\.0 MB\)$/);
  });
});

describe('the options a refused compile names', () => {
  it('says when not even an empty context fits: only a bigger machine helps', () => {
    const pl = plan(1, 0.2e6, 0.1e6);
    expect(compileOptions(pl, compilePrediction(pl), 0.3 * GB)).toMatch(/^options: a machine with at least \d+ GB of memory \(no shard ceiling fits: the compiler needs 310\.0 MB before any weights\)$/);
  });
});

describe('the build pipeline\'s predictions', () => {
  it('every stage has one, computed from earlier stages only; the compile\'s from the plan', () => {
    const { recipe } = loadRecipe('tiny-qwen3');
    const { arch, settings } = archSettings(recipe, 'v81');
    const p = buildPipeline(recipe, arch, settings, { toolchain: { kind: 'onnxruntime-qnn' } });
    const seen = new Set<string>();
    for (const n of p.nodes) {
      for (const f of n.memory.from) expect(seen.has(f), `${n.id} predicts from ${f}`).toBe(true);
      seen.add(n.id);
    }
    expect(p.nodes.find((n) => n.id === 'compile')!.memory.from).toEqual(['plan']);
  });

  it('predicts the streamed trace from the largest unit it upcasts (here the lm_head) and maps the checkpoint', () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-memory-model-'));
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ vocab_size: 151936, hidden_size: 2560, num_hidden_layers: 36 }));
    writeFileSync(join(dir, 'checkpoint.json'), JSON.stringify({ dir, source: { kind: 'local', path: dir }, files: { 'model-1.safetensors': 5 * GB, 'model-2.safetensors': 3 * GB, 'tokenizer.json': 1e7 } }));
    const p = stageMemory.trace.predict({ fetch: dir });
    const head = 4 * 151936 * 2560; // 1.56 GB: measured 2.00 GB private for the synthetic Qwen3-4B
    expect(p.privateBytes).toBe(Math.round(TRACE.floor + head + TRACE.recorded));
    expect(p.privateBytes / GB).toBeGreaterThan(2.0);
    expect(p.privateBytes / GB).toBeLessThan(2.5);
    expect(p.mappedBytes).toBe(Math.round(TRACE.mappedFloor + 8 * GB));
    expect(p.how).toMatch(/lm_head/);
  });

  it('adds what HF\'s loader copies privately for a family: Phi-tiny-MoE\'s experts stacked per layer, within 25% of the 6.64 GB measured', () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-memory-model-'));
    const config = JSON.parse(readFileSync('recipes/phi-tiny-moe/recipe.json', 'utf8')).config;
    writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
    writeFileSync(join(dir, 'checkpoint.json'), JSON.stringify({ dir, source: { kind: 'local', path: dir }, files: { 'model-1.safetensors': 4 * GB, 'model-2.safetensors': 3.6 * GB } }));
    const p = traceMemory(getFamily('phimoe') as Family<unknown>).predict({ fetch: dir });
    const stacked = 32 * 16 * 3 * 448 * 4096 * 2; // 5.64 GB of bf16
    expect(p.privateBytes).toBe(Math.round(TRACE.floor + 4 * 32064 * 4096 + TRACE.recorded + stacked));
    expect(p.how).toContain("(each layer's 16 experts stacked by HF's loader, bf16)");
    // bench/trace.ts on the synthetic Phi-tiny-MoE, one prompt: 6.64 GB private.
    expect(p.privateBytes / (6.64 * GB)).toBeGreaterThanOrEqual(1);
    expect(p.privateBytes / (6.64 * GB)).toBeLessThan(1.25);
    // A family whose weights all stay mapped adds nothing.
    expect(traceMemory(getFamily('qwen3') as Family<unknown>).predict({ fetch: dir }).privateBytes).toBeLessThan(p.privateBytes - stacked + 1);
  });

  it('predicts a layer-heavy model from one decoder layer in fp32', () => {
    const unit = traceUnitBytes({ vocab_size: 1000, hidden_size: 64, num_hidden_layers: 2 }, 1 * GB);
    expect(unit).toEqual({ bytes: 1 * GB, what: 'one decoder layer in fp32' });
  });
});

describe('the CPU gates\' memory', () => {
  it('is the K/V caches one decode case feeds, with the checkpoint mapped: 1.21 GB of caches for Qwen3-4B at 4096', () => {
    const qwen3_4b = { num_hidden_layers: 36, num_key_value_heads: 8, head_dim: 128, hidden_size: 2560, num_attention_heads: 32 };
    expect(kvCacheBytes(qwen3_4b, 4096)).toBe(36 * 2 * 8 * 128 * 4096 * 4);
    expect(kvCacheBytes({ ...qwen3_4b, head_dim: undefined }, 4096)).toBe(36 * 2 * 8 * 80 * 4096 * 4); // hidden / heads
    const dir = mkdtempSync(join(tmpdir(), 'forge-memory-model-'));
    writeFileSync(join(dir, 'config.json'), JSON.stringify(qwen3_4b));
    writeFileSync(join(dir, 'checkpoint.json'), JSON.stringify({ dir, source: { kind: 'local', path: dir }, files: { 'model.safetensors': 8 * GB } }));
    writeFileSync(join(dir, 'graphs.json'), JSON.stringify({ maxContext: 4096, contexts: [] }));
    // Measured in forge build of the synthetic Qwen3-4B: oracle 1.74 GB, parity 2.04 GB private; 8 GB of weights mapped.
    for (const [stage, m, measured] of [['oracle', ORACLE, 1.74], ['parity', PARITY, 2.04]] as const) {
      const p = stageMemory[stage].predict({ fetch: dir, export: dir });
      expect(p.privateBytes).toBe(Math.round(m.floor + kvCacheBytes(qwen3_4b, 4096)));
      expect(p.mappedBytes).toBe(Math.round(m.mappedFloor + 8 * GB));
      expect(p.privateBytes / GB, stage).toBeGreaterThanOrEqual(measured);
      expect(p.privateBytes / GB, stage).toBeLessThan(measured * 1.25);
    }
  });
});

describe('the default memory budget', () => {
  it('keeps 10% of the machine back, at least 2 GB', () => {
    expect(defaultMemoryBudget(25 * GB)).toBe(22.5 * GB);
    expect(defaultMemoryBudget(8 * GB)).toBe(6 * GB);
  });

  it('names the smallest machine whose default budget holds a need (its inverse)', () => {
    for (const need of [1 * GB, 6 * GB, 17 * GB, 22.5 * GB, 40 * GB]) {
      expect(defaultMemoryBudget(machineFor(need))).toBeGreaterThanOrEqual(need - 1);
      expect(defaultMemoryBudget(machineFor(need) - 0.01 * GB)).toBeLessThan(need);
    }
  });
});
