import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { checkParity } from '../src/gates/parity.js';
import { Trace } from '../src/gates/trace.js';
import { adbTarget } from '../src/targets/adb.js';
import { getArch } from '../src/arch/table.js';
import type { Target } from '../src/targets/target.js';
import type { TargetSpec } from '../src/gates/parity.js';
import { buildPipeline } from '../pipelines/build.js';
import { loadRecipe, archSettings } from '../src/recipe/load.js';
import { assembleBundle, readCompiled } from '../src/bundle/assemble.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import type { RunRecord } from '../src/engine/record.js';

let record: RunRecord;
const entry = (id: string) => join(cacheRoot(), id, record.stages.find((s) => s.name === id)!.key!);

beforeAll(async () => {
  record = await build({ recipe: 'tiny-qwen3', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-parity-')), progress: silentProgress });
}, 900_000);

describe('parity gate', () => {
  it('runs the native runtime free-running and matches HF greedy N/N for the fp32 and the W8 graphs', () => {
    expect(record.ok).toBe(true);
    const g = record.gates.parity as any;
    expect(g).toMatchObject({ ok: true, target: 'host', firstDivergence: null });
    expect(g.matched).toBe(g.total);
    expect(g.total).toBe(2 * 4 * 32); // fp32 and W8, four prompts (one long, one non-ASCII), 32 tokens each
    expect(g.variants.quantize).toMatchObject({ matched: 128, total: 128 });
    expect(g.variants.export.timings.host_overhead_ms_per_token).toBeGreaterThan(0);
    expect(g.variants.export.timings.load_ms).toBeGreaterThan(0);
  });

  it('names the first divergent step with both tokens and what HF\'s logits gave each', async () => {
    const trace = await Trace.open(entry('trace'));
    const want = trace.meta.prompts[0].generated;
    const liar: Target = {
      name: 'liar',
      async generate(req) {
        const ids = [...trace.meta.prompts.find((p) => p.prompt_tokens.join() === req.promptIds.join())!.generated.slice(0, req.maxNewTokens)];
        ids[5] = (ids[5] + 1) % trace.meta.vocab;
        return { generatedIds: ids, backend: 'cpu', timings: { load_ms: 1, prefill_ms: 1, decode_ms_per_token: 1, host_overhead_ms_per_token: 0.01 } };
      },
    };
    const r = await checkParity(liar, '/nowhere', trace, 32);
    const step = trace.meta.prompts[0].prompt_tokens.length - 1 + 5;
    const logits = await trace.get(0, step, 'logits');
    await trace.close();
    expect(r.matched).toBe(4 * 5);
    expect(r.perPrompt).toEqual(Array(4).fill({ matched: 5, total: 32 }));
    expect(r.firstDivergence).toEqual({
      prompt: 0, step: 5,
      hf: { token: want[5], logit: logits[want[5]] },
      runtime: { token: (want[5] + 1) % trace.meta.vocab, hfLogit: logits[(want[5] + 1) % trace.meta.vocab] },
    });
  });
});

describe('adb target (a recorded fake adb on PATH; no real device here)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'forge-adb-'));
  const log = join(dir, 'adb.log');
  const result = join(dir, 'result.json');
  writeFileSync(result, JSON.stringify({ generated_ids: [7, 8, 9], backend: 'qnn', timings: { load_ms: 40, prefill_ms: 3, decode_ms_per_token: 2, host_overhead_ms_per_token: 0.1 } }));
  const target = (env: Record<string, string> = {}) => {
    Object.assign(process.env, { FAKE_ADB_LOG: log, FAKE_ADB_RESULT: result, FAKE_ADB_STATE: 'device', FAKE_ADB_SOC: 'SM8850', FAKE_ADB_EXIT: '0' }, env);
    return adbTarget({ serial: 'R5CT1234', arch: getArch('v81'), runner: '/build/android/qhx_generate', libDir: '/build/android/lib', adb: resolve('test/fixtures/fake-adb.sh'), timeoutSeconds: 20 });
  };
  const req = { bundleDir: '/tmp/bundle', promptIds: [1, 2, 3], maxNewTokens: 3 };

  it('pushes bundle, libraries and runner, runs qhx_generate on the NPU libraries, pulls the result', async () => {
    writeFileSync(log, '');
    const r = await target().generate(req);
    expect(r.generatedIds).toEqual([7, 8, 9]);
    const calls = readFileSync(log, 'utf8').trim().split('\n');
    expect(calls[0]).toBe('-s R5CT1234 get-state');
    expect(calls[1]).toBe('-s R5CT1234 shell getprop ro.soc.model');
    expect(calls).toContain('-s R5CT1234 push /tmp/bundle/. /data/local/tmp/forge/bundle');
    expect(calls).toContain('-s R5CT1234 push /build/android/qhx_generate /data/local/tmp/forge/qhx_generate');
    const run = calls.find((c) => c.includes('./qhx_generate'))!;
    expect(run).toContain('/data/local/tmp/forge/bundle/manifest.json /data/local/tmp/forge/lib/libQnnHtp.so /data/local/tmp/forge/lib/libQnnSystem.so /data/local/tmp/forge/bundle 3 --prompt-ids 1,2,3 --json --ignore-eos');
    expect(run).toContain('ADSP_LIBRARY_PATH=/data/local/tmp/forge/lib');
  });

  it('pushes the bundle once and runs it for each prompt', async () => {
    writeFileSync(log, '');
    const t = target();
    await t.generate(req);
    await t.generate({ ...req, promptIds: [4, 5] });
    const calls = readFileSync(log, 'utf8').trim().split('\n');
    expect(calls.filter((c) => c.includes('push /tmp/bundle/.')).length).toBe(1);
    const runs = calls.filter((c) => c.includes('./qhx_generate'));
    expect(runs.length).toBe(2);
    // The first run after the push hashes every file; the second checks sizes and small files, as a user's run does.
    expect(runs[0]).toContain(' --verify');
    expect(runs[1]).not.toContain('--verify');
  });

  it('refuses a result that did not run on the NPU (qhx_generate fell back to another backend)', async () => {
    const cpu = join(dir, 'cpu.json');
    writeFileSync(cpu, JSON.stringify({ generated_ids: [7], backend: 'cpu', timings: { load_ms: 1, prefill_ms: 1, decode_ms_per_token: 1, host_overhead_ms_per_token: 0 } }));
    await expect(target({ FAKE_ADB_RESULT: cpu }).generate(req)).rejects.toThrow(/ran on backend 'cpu', not qnn/);
  });

  it('refuses when no device answers', async () => {
    await expect(target({ FAKE_ADB_STATE: 'none' }).generate(req)).rejects.toThrow(/no device 'R5CT1234' reachable over adb/);
  });

  it('refuses a device of another SoC: context binaries are arch-pinned', async () => {
    await expect(target({ FAKE_ADB_SOC: 'SM8750' }).generate(req)).rejects.toThrow("device 'R5CT1234' is SM8750, but this bundle is for v81 (SM8850)");
  });

  it('reports the device-side error when qhx_generate fails there', async () => {
    await expect(target({ FAKE_ADB_EXIT: '1' }).generate(req)).rejects.toThrow(/exited 1: qhx_generate: QNN backend could not open the context/);
  });

  it('on a device, parity runs the shipped graphs as compiled contexts (a phone runs no ONNX graphs)', async () => {
    const { recipe } = loadRecipe('tiny-qwen3');
    const { arch, settings } = archSettings(recipe, 'v81');
    const node = (target: TargetSpec) => buildPipeline(recipe, arch, settings, { target }).nodes.find((n) => n.id === 'parity')!;
    const device = node({ kind: 'adb', serial: 'R5CT1234', runner: '/r', libDir: '/l' });
    expect(device.inputs.compile).toBe('compile');
    expect((device.params as any).variants).toEqual(['quantize']);
    expect(node({ kind: 'host' }).inputs.compile).toBeUndefined();
    // What the stage then assembles from this build's compile output: every graph a compiled context.
    const bundle = join(dir, 'device-bundle');
    const m = await assembleBundle({ recipe, arch, graphsDir: entry('quantize'), embeddingDir: entry('quantize'), checkpointDir: readCheckpointRef(entry('fetch')).absDir, maxNewTokens: 4, compiled: readCompiled(entry('compile')) }, bundle);
    const graphs = m.contexts.flatMap((c) => c.graphs);
    expect(graphs.length).toBeGreaterThan(0);
    for (const g of graphs) expect(g.qnn, g.name).toBeDefined();
    expect(readdirSync(bundle).filter((f) => f.endsWith('.onnx') && !f.endsWith('_ctx.onnx'))).toEqual([]);
  });
});
