import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { checkParity, variantOk } from '../src/gates/parity.js';
import { hostTarget } from '../src/targets/host.js';
import type { NativeRecord } from '../src/gates/native-stage.js';
import type { OracleResult } from '../src/gates/oracle.js';
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
  it('runs the native runtime teacher-forced and matches HF greedy N/N for the fp32 and the W8 graphs, with no tie', () => {
    expect(record.ok).toBe(true);
    const g = record.gates.parity as any;
    expect(g).toMatchObject({ ok: true, target: 'host', firstDivergence: null, ties: 0, maxTies: 0, mismatches: { count: 0, listed: [] } });
    expect(g.matched).toBe(g.total);
    expect(g.total).toBe(2 * 4 * 32); // fp32 and W8, four prompts (one long, one non-ASCII), 32 tokens each
    expect(g.variants.quantize).toMatchObject({ ok: true, matched: 128, total: 128, ties: 0, mismatches: 0 });
    // The tie margin is twice the largest logit error the oracle gate measured for each variant with
    // its one-token graphs chained end to end (never less than the separate lm-head's own error).
    const oracle = record.gates.oracle as any;
    const rows = (JSON.parse(readFileSync(join(entry('oracle'), 'oracle.json'), 'utf8')) as OracleResult).rows;
    for (const v of ['export', 'quantize']) {
      const lmHead = rows.find((r) => r.variant.startsWith(`${v}:`) && r.graph === 'lm_head' && r.output === 'logits')!;
      expect(oracle.logitChain[v], v).toEqual(['shard0.decode', 'lm_head']);
      expect(oracle.logitError[v], v).toBeGreaterThan(0);
      expect(g.variants[v].tieMargin, v).toBe(2 * oracle.logitError[v]);
      if (v === 'quantize') expect(oracle.logitError[v]).toBeGreaterThan(lmHead.maxAbs); // the decoder's W8 error is in it
    }
    expect(g.variants.export.timings.host_overhead_ms_per_token).toBeGreaterThan(0);
    expect(g.variants.export.timings.load_ms).toBeGreaterThan(0);
  });

  it('names every mismatch with both tokens and what HF\'s logits gave each, and goes on past it', async () => {
    const trace = await Trace.open(entry('trace'));
    const want = trace.meta.prompts[0].generated;
    const liar: Target = {
      name: 'liar',
      async generate(req) {
        const ids = [...trace.meta.prompts.find((p) => p.prompt_tokens.join() === req.promptIds.join())!.generated.slice(0, req.maxNewTokens)];
        expect(req.forceIds).toEqual(ids); // teacher-forced on HF's tokens
        ids[5] = (ids[5] + 1) % trace.meta.vocab;
        ids[9] = (ids[9] + 1) % trace.meta.vocab;
        return { generatedIds: ids, backend: 'cpu', timings: { load_ms: 1, prefill_ms: 1, decode_ms_per_token: 1, host_overhead_ms_per_token: 0.01 } };
      },
    };
    const r = await checkParity(liar, '/nowhere', trace, 32, 0);
    const at = async (k: number) => {
      const logits = await trace.get(0, trace.meta.prompts[0].prompt_tokens.length - 1 + k, 'logits');
      const theirs = (want[k] + 1) % trace.meta.vocab;
      return { prompt: 0, step: k, hf: { token: want[k], logit: logits[want[k]] }, runtime: { token: theirs, hfLogit: logits[theirs] }, margin: logits[want[k]] - logits[theirs], tie: false };
    };
    const first = await at(5);
    const second = await at(9);
    await trace.close();
    expect(r.matched).toBe(4 * 5);
    expect(r.perPrompt).toEqual(Array(4).fill({ matched: 5, total: 32, mismatches: 2 }));
    expect(r.mismatchCount).toBe(4 * 2);
    expect(r.mismatches.slice(0, 2)).toEqual([first, second]);
    expect(first.margin).toBeGreaterThan(0); // HF's greedy token is its argmax
    const { margin: _m, tie: _t, ...divergence } = first;
    expect(r.firstDivergence).toEqual(divergence);
    expect(variantOk(r, 1, 10)).toBe(false); // no logit error: nothing is a tie
  });

  it('on the real runtime, the teacher-forced run\'s matched prefix is the free-running one, and its later choices follow the forced tokens', async () => {
    const trace = await Trace.open(entry('trace'));
    const target = hostTarget((JSON.parse(readFileSync(join(entry('native'), 'native.json'), 'utf8')) as NativeRecord).qhxGenerate);
    const { recipe } = loadRecipe('tiny-qwen3');
    const { arch } = archSettings(recipe, 'v81');
    const bundle = join(mkdtempSync(join(tmpdir(), 'forge-forced-')), 'fp32');
    await assembleBundle({ recipe, arch, graphsDir: entry('export'), embeddingDir: entry('quantize'), checkpointDir: readCheckpointRef(entry('fetch')).absDir, maxNewTokens: 32 }, bundle);
    // A stand-in "HF" whose step 5 took HF's runner-up: forced decoding feeds it, a free run does not.
    const prompts = await Promise.all(trace.meta.prompts.map(async (p, i) => {
      const logits = await trace.get(i, p.prompt_tokens.length - 1 + 5, 'logits');
      const runnerUp = [...logits.keys()].filter((t) => t !== p.generated[5]).reduce((a, b) => (logits[b] > logits[a] ? b : a));
      return { ...p, generated: [...p.generated.slice(0, 5), runnerUp, ...p.generated.slice(6)] };
    }));
    const other = { meta: { ...trace.meta, prompts }, get: trace.get.bind(trace) } as unknown as Trace;
    const r = await checkParity(target, bundle, other, 32, 0);
    for (const [i, p] of prompts.entries()) {
      const free = await target.generate({ bundleDir: bundle, promptIds: p.prompt_tokens, maxNewTokens: 32 });
      let prefix = 0;
      while (prefix < 32 && free.generatedIds[prefix] === p.generated[prefix]) prefix++;
      expect(r.perPrompt[i].matched, `prompt ${i}`).toBe(prefix);
      expect(prefix).toBe(5);
      // Fed the runner-up at step 6, the runtime continues from it: the same as a free run of that longer prompt.
      const forced = await target.generate({ bundleDir: bundle, promptIds: p.prompt_tokens, maxNewTokens: 32, forceIds: p.generated });
      const fromRunnerUp = await target.generate({ bundleDir: bundle, promptIds: [...p.prompt_tokens, ...p.generated.slice(0, 6)], maxNewTokens: 1 });
      expect(forced.generatedIds[6]).toBe(fromRunnerUp.generatedIds[0]);
    }
    // At step 5 the runtime chose HF's real argmax, which the stand-in's logits (HF's) rank above the
    // stand-in's token: a negative margin, within any tie margin.
    expect(r.mismatches[0]).toMatchObject({ prompt: 0, step: 5, runtime: { token: trace.meta.prompts[0].generated[5] }, tie: true });
    expect(r.mismatches[0].margin).toBeLessThan(0);
    await trace.close();
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
    expect(run).not.toContain('--force-ids');
    expect(run).toContain('ADSP_LIBRARY_PATH=/data/local/tmp/forge/lib');
  });

  it('passes forced ids on to qhx_generate on the device (teacher-forced parity)', async () => {
    writeFileSync(log, '');
    await target().generate({ ...req, forceIds: [7, 8, 9] });
    const run = readFileSync(log, 'utf8').trim().split('\n').find((c) => c.includes('./qhx_generate'))!;
    expect(run).toContain(' 3 --prompt-ids 1,2,3 --force-ids 7,8,9 --json --ignore-eos');
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
    // The oracle's logit error sets the tie margin on either target.
    expect(device.inputs.oracle).toBe('oracle');
    expect(node({ kind: 'host' }).inputs.oracle).toBe('oracle');
    expect(device.params).toMatchObject({ minMatch: 1, maxTies: 0 });
    // What the stage then assembles from this build's compile output: every graph a compiled context.
    const bundle = join(dir, 'device-bundle');
    const m = await assembleBundle({ recipe, arch, graphsDir: entry('quantize'), embeddingDir: entry('quantize'), checkpointDir: readCheckpointRef(entry('fetch')).absDir, maxNewTokens: 4, compiled: readCompiled(entry('compile')) }, bundle);
    const graphs = m.contexts.flatMap((c) => c.graphs);
    expect(graphs.length).toBeGreaterThan(0);
    for (const g of graphs) expect(g.qnn, g.name).toBeDefined();
    expect(readdirSync(bundle).filter((f) => f.endsWith('.onnx') && !f.endsWith('_ctx.onnx'))).toEqual([]);
  });
});
