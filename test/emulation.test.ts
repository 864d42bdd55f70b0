// The emulation gate on tiny-qwen3's W8 graphs: compiled for v81 one context per graph, run on the
// x86 HTP simulator in onnxruntime-qnn's libQnnHtp.so, teacher-forced (cosine vs HF) and free-running
// through qhx_generate's QNN backend (parity vs HF greedy). The stage is called directly on the
// pipeline's stage outputs, so this does not depend on where the node sits in pipelines/build.ts.
import { describe, it, expect, beforeAll } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { getArch } from '../src/arch/table.js';
import { getFamily } from '../src/families/index.js';
import { GRAPHS_JSON, type ExportManifest } from '../src/export/graphs.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import { assembleBundle } from '../src/bundle/assemble.js';
import { compileContext } from '../src/toolchain/qnn/compile.js';
import { venvPython } from '../src/toolchain/venv.js';
import { Trace } from '../src/gates/trace.js';
import type { StageContext } from '../src/engine/stage.js';
import type { NativeRecord } from '../src/gates/native-stage.js';
import {
  stage, runEmulation, simulateGraph, simulatorInfo, simulatorTarget, attachQnnContexts,
  type EmulationParams, type EmulationRan, type CompiledGraph,
} from '../src/gates/emulation.js';

const v81 = getArch('v81');
const arch = { id: v81.id, socModel: v81.socModel, dspArch: v81.dspArch, vtcmMb: v81.vtcmMb };
const params: EmulationParams = { recipe: { id: 'tiny-qwen3', family: 'qwen3' }, arch, fp16: true, minCosine: 0.999, minTop1: 1, tokens: 32, minMatch: 1, maxTies: 0 };

let dir: string;
const inputs: Record<string, string> = {};
let checkpointDir: string;
let qhxGenerate: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'forge-emulation-'));
  // Only the stages the gate reads (whatever else the pipeline holds is not run).
  for (const until of ['quantize', 'trace', 'native', 'oracle']) {
    const record = await build({ recipe: 'tiny-qwen3', arch: 'v81', out: join(dir, `build-${until}`), until, progress: silentProgress });
    if (!record.ok) throw new Error(record.error);
    for (const s of record.stages) if (s.key) inputs[s.name === 'fetch' ? 'checkpoint' : s.name] = join(cacheRoot(), s.name, s.key);
  }
  checkpointDir = readCheckpointRef(inputs.checkpoint).absDir;
  qhxGenerate = (JSON.parse(readFileSync(join(inputs.native, 'native.json'), 'utf8')) as NativeRecord).qhxGenerate;
}, 1_200_000);

describe('emulation gate on the x86 HTP simulator', () => {
  it('compiles the W8 graphs for v81, runs them teacher-forced and free-running on the simulator, and records the figures', async () => {
    const out = join(dir, 'stage-out');
    const logs: string[] = [];
    const ctx: StageContext<EmulationParams> = {
      params, inputs, out, tools: {}, log: (m) => logs.push(m), progress: () => {}, notePeakRss: () => {},
    };
    mkdirSync(out, { recursive: true });
    const outcome = await stage.run(ctx);
    const summary = outcome!.summary as any;
    console.log('emulation summary:', JSON.stringify(summary, null, 1));
    expect(outcome!.gate).toEqual({ name: 'emulation', ok: true });
    expect(summary).toMatchObject({ ok: true, ran: true, parity: { matched: 128, total: 128, ok: true, firstDivergence: null, ties: 0, maxTies: 0, mismatches: { count: 0, listed: [] } } });
    expect(Object.keys(summary.graphs).sort()).toEqual(['lm_head', 'shard0.decode', 'shard0.prefill']);
    for (const g of Object.values(summary.graphs) as any[]) {
      expect(g.ok).toBe(true);
      expect(g.minCosine).toBeGreaterThanOrEqual(0.999);
      expect(g.minCosine).toBeLessThanOrEqual(1);
    }
    // Traced steps per prompt: its tokens but the last, then 32 generated; prompts of 7, 7, 115 (the
    // long one) and 17 (non-ASCII) tokens: 38 + 38 + 146 + 48.
    expect(summary.graphs.lm_head.top1).toBe('270/270');
    expect(summary.msPerToken).toBeGreaterThan(0);

    const full = JSON.parse(readFileSync(join(out, 'emulation.json'), 'utf8')) as EmulationRan;
    // The bundle prefills: its decode graph is checked on the calls it makes, after each prompt (31
    // generated tokens fed back per prompt); the prompts are the prefill graph's.
    expect(full.oracle.graphs['shard0.decode'].cases).toBe(4 * 31);
    expect(full.oracle.graphs['shard0.prefill'].cases).toBe(1 + 1 + 15 + 3); // 8-token chunks per prompt
    expect(Object.keys(full.oracle.graphs['shard0.decode'].outputs)).toContain('new_k_3');
    expect(full.parity.perPrompt).toEqual(Array(4).fill({ matched: 32, total: 32 }));
    // Ties on the simulator are judged as on the host: against the larger of its own teacher-forced
    // logits error (the lm-head's here) and the oracle's chained one on the CPU.
    const chained = (JSON.parse(readFileSync(join(inputs.oracle, 'oracle.json'), 'utf8')) as { logitError: Record<string, number> }).logitError.quantize;
    expect(chained).toBeGreaterThan(0);
    expect(full.parity.logitError).toBe(Math.max(full.oracle.graphs.lm_head.outputs.logits.maxAbs!, chained));
    expect(full.parity.tieMargin).toBe(2 * full.parity.logitError!);
    expect(full.parity.rule).toMatch(/teacher-forced on HF's greedy token/);
    expect(full.simulator).toMatchObject({ qairt: '2.51.0', socModel: arch.socModel });
    expect(full.compiled.map((g: CompiledGraph) => g.bin).sort()).toEqual(['lm_head.bin', 'shard0.decode.bin', 'shard0.prefill.bin']);
    expect(existsSync(join(out, '.scratch'))).toBe(false);
    expect(readdirSync(out).sort()).toEqual(['emulation.json']);
    expect(logs.some((l) => /parity on the simulator: 128\/128/.test(l))).toBe(true);
  }, 400_000);
});

describe('what the simulator cannot run is reported exactly', () => {
  // One weight-shared context for all three graphs: what the device runs, and what the simulator cannot load.
  let shared: Map<string, CompiledGraph>;
  let exp: ExportManifest;
  beforeAll(async () => {
    exp = JSON.parse(readFileSync(join(inputs.quantize, GRAPHS_JSON), 'utf8')) as ExportManifest;
    const entries = exp.contexts.flatMap((c) => c.graphs);
    const r = await compileContext({ graphs: entries.map((g) => join(inputs.quantize, g.file)), outDir: join(dir, 'shared'), contextName: 'all', arch, fp16: true, timeoutSeconds: 300 });
    expect(r.shared).toBe(true);
    shared = new Map(entries.map((g, k) => [g.name, { graph: g.name, wrapper: r.wrappers[k].path, bin: r.bin, bytes: r.bytes, qnnGraph: r.wrappers[k].qnnGraph }]));
  });

  it('teacher-forced: a simulator that dies (SIGSEGV on a weight-shared context) fails the run, naming graph, file and signal', async () => {
    const family = getFamily('qwen3');
    const config = family.parseConfig(JSON.parse(readFileSync(join(checkpointDir, 'config.json'), 'utf8')), 'config.json');
    const entry = exp.contexts[0].graphs.find((g) => g.n === 1)!;
    const trace = await Trace.open(inputs.trace);
    const e = await simulateGraph({
      family, config, entry, compiled: shared.get(entry.name)!, trace, maxContext: exp.maxContext, graphsDir: inputs.quantize, arch, fp16: true, minCosine: 0.999, minTop1: 1,
      python: venvPython(), script: 'oracles/qnn_simulate.py', work: join(dir, 'crash'), timeoutSeconds: 300,
    }).catch((x: Error) => x).finally(() => trace.close());
    expect(e).toBeInstanceOf(Error);
    expect((e as Error).message).toMatch(/^simulating shard0\.decode \(shard0\.decode_ctx\.onnx, cases 0\.\.\d+\): the simulator process died \(SIGSEGV\); last lines: \[qnn_simulate\] loading /);
  });

  it('parity: qhx_generate dying on the simulator fails with its signal', async () => {
    const bundle = join(dir, 'shared-bundle');
    await assembleBundle({ recipe: params.recipe, arch, graphsDir: inputs.quantize, embeddingDir: inputs.quantize, checkpointDir, maxNewTokens: 4 }, bundle);
    const m = await attachQnnContexts(bundle, shared);
    expect(m.contexts.flatMap((c) => c.graphs.map((g) => g.qnn!.binary))).toEqual(['qnn/all.bin', 'qnn/all.bin', 'qnn/all.bin']);
    const sim = await simulatorInfo(venvPython());
    const e = await simulatorTarget(qhxGenerate, sim, 120).generate({ bundleDir: bundle, promptIds: [1, 2, 3], maxNewTokens: 4 }).catch((x: Error) => x);
    expect((e as Error).message).toMatch(/^qhx_generate on the x86 HTP simulator failed \(SIGSEGV\)/);
  });

  it('a host without the simulator gives ran: false with the reason, and nothing else runs', async () => {
    const fake = join(dir, 'no-sim.py');
    writeFileSync(fake, `import json; print(json.dumps({"libDir": "/x", "htp": "/x/libQnnHtp.so", "system": "/x/libQnnSystem.so", "epLib": "/x/libonnxruntime_providers_qnn.so", "machine": "aarch64", "os": "Linux", "onnxruntime": "1.29.0", "onnxruntimeQnn": "2.7.0", "qairt": "2.51.0", "missing": ["libQnnHtp.so"]}))\n`);
    const r = await runEmulation({
      ...params, checkpointDir, traceDir: inputs.trace, graphsDir: inputs.quantize, qhxGenerate: '/nowhere/qhx_generate',
      work: join(dir, 'no-sim-work'), python: venvPython(), script: fake,
    });
    expect(r).toEqual({ ok: false, ran: false, reason: 'this host cannot run the x86 HTP simulator: it lacks libQnnHtp.so' });
    expect(existsSync(join(dir, 'no-sim-work'))).toBe(false);
  });
});
