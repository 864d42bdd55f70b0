// forge bisect's runtime and device links (issue 17): after the ONNX chain, the native runtime with
// its own KV cache (the parity gate on this CPU), and with --target adb the runtime on a phone. The
// decision (which link is named) on verdicts; a healthy tiny-qwen3 host bisect that reads the real
// parity.json; a FAKE-DEVICE case (test/fixtures/fake-adb-forced.sh stands in for adb: no phone exists
// here) whose "device" leaves HF at a planted step; and the runtime link's fix search wired to a
// parity verdict, on a planted parity.json.
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { forge, lastJson } from './helpers/forge-cli.js';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { readTraceMeta } from '../src/gates/trace.js';
import { loadRecipe, archSettings } from '../src/recipe/load.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import type { RunRecord } from '../src/engine/record.js';
import type { Mismatch, VariantResult } from '../src/gates/parity.js';
import type { BisectResult } from '../src/bisect/run.js';
import { firstBrokenLink, firstDivergence, parityHolds, paritySnapshot, tiesOnly, verdictAt, type ParityJson } from '../src/bisect/runtime.js';
import { runtimeHealthy, runtimeLink } from '../src/bisect/runtime-link.js';
import { noFaultWarnings } from '../src/bisect/warnings.js';

const mismatch = (prompt: number, step: number, tie: boolean, token = 5): Mismatch => ({ prompt, step, hf: { token: 9, logit: 3 }, runtime: { token, hfLogit: 1 }, margin: 2, tie });
const variant = (m: Mismatch[], over: Partial<VariantResult> = {}): VariantResult => ({
  matched: 0, total: 64, perPrompt: [{ matched: 0, total: 32, mismatches: m.filter((x) => x.prompt === 0).length }, { matched: 0, total: 32, mismatches: m.filter((x) => x.prompt === 1).length }],
  firstDivergence: null, ties: m.filter((x) => x.tie).length, mismatchCount: m.length, mismatches: m, logitError: 0.1, tieMargin: 0.2,
  timings: { load_ms: 1, prefill_ms: 1, decode_ms_per_token: 1, host_overhead_ms_per_token: 0 }, ...over,
});
const parity = (detail: Record<string, VariantResult>, ok: Record<string, boolean>) => ({
  ok: Object.values(ok).every(Boolean), target: 'host', matched: 0, total: 0, ties: 0,
  variants: Object.fromEntries(Object.entries(ok).map(([k, v]) => [k, { ok: v }])), mismatches: { count: 0, listed: [] }, detail,
}) as unknown as ParityJson;

describe('which link bisect names', () => {
  it('names the first link that breaks, in chain order; links not run say nothing', () => {
    expect(firstBrokenLink({ oracle: 'quantization', drift: true, runtime: false })).toBe('quantization');
    expect(firstBrokenLink({ oracle: 'export' })).toBe('export');
    expect(firstBrokenLink({ oracle: null, drift: true, runtime: false })).toBe('drift');
    expect(firstBrokenLink({ oracle: null, drift: false, runtime: false, simulator: false, device: false })).toBe('runtime');
    expect(firstBrokenLink({ oracle: null, drift: false, runtime: true, simulator: false, device: false })).toBe('compile/fp16');
    expect(firstBrokenLink({ oracle: null, drift: false, runtime: true, simulator: true, device: false })).toBe('device');
    expect(firstBrokenLink({ oracle: null, drift: false, runtime: true, simulator: true, device: true })).toBeNull();
    expect(firstBrokenLink({ oracle: null })).toBeNull();
  });

  it('a runtime holds with ties within its bound, not with a mismatch beyond the tie margin even where the gate lets it pass', () => {
    expect(parityHolds(parity({ quantize: variant([mismatch(0, 3, true)]) }, { quantize: true }))).toBe(true);
    expect(parityHolds(parity({ quantize: variant([mismatch(0, 3, false)]) }, { quantize: true }))).toBe(false); // a recipe with minMatch < 1
    expect(parityHolds(parity({ quantize: variant([]) }, { quantize: false }))).toBe(false);
  });

  it('a gate failed on ties alone is no link\'s fault: HF hesitates there, and the healthy message says how to allow them', () => {
    const ties = parity({ quantize: variant([mismatch(1, 51, true)]), export: variant([]) }, { quantize: false, export: true });
    expect(tiesOnly(ties)).toBe(true);
    expect(tiesOnly(parity({ quantize: variant([mismatch(1, 51, true), mismatch(1, 52, false)]) }, { quantize: false }))).toBe(false);
    expect(tiesOnly(parity({ quantize: variant([mismatch(1, 51, true)]) }, { quantize: true }))).toBe(false); // a passing gate needs no excuse
    const snap = { ...paritySnapshot({ ...ties, total: 128, ties: 1, mismatches: { count: 1, listed: [] } } as ParityJson) };
    const message = runtimeHealthy({ fp32: 0.99999, shipped: 0.999, quant: 'w8' } as BisectResult['thresholds'], { runtime: { parity: snap } } as BisectResult);
    expect(message).toMatch(/^no fault: .*\(parity 127\/128 equal to HF teacher-forced, 1 tie within the margin\); the parity gate fails only on 1 tie, .*gates\.parity\.maxTies and a tiesWhy/);
  });

  it('says what still deserves a look when nothing broke: a layer far weaker than the median or passing by a hair, steps HF decides by less than twice the logit error', () => {
    const layers = [0.9995, 0.9996, 0.9994, 0.9861, 0.9995].map((shipped, layer) => ({ layer, fp32: 1, shipped }));
    const w = noFaultWarnings(layers, 0.999, 0.05, [3, 0.07, 2.5, 0.2]);
    expect(w.map((x) => x.kind)).toEqual(['weak-layer', 'logit-error']);
    expect(w[0].text).toBe('layer 3 keeps 0.98610 against a median of 0.99950 over 5 layers: it passes, and it is where drift would start');
    expect(w[1].text).toBe('the shipped graphs move the logits by up to 0.0500: 1 of 4 traced steps have HF margins under twice that (smallest 0.0700) and could flip on another run or input');
    // Layers alike and margins wide: nothing to say.
    expect(noFaultWarnings(layers.map((l) => ({ ...l, shipped: 0.9995 })), 0.999, 0.05, [3, 2.5])).toEqual([]);
    // At w4 every layer is far from 1 and none stands out from the median; the one that clears the gate by a sliver is named.
    const w4 = noFaultWarnings([0.96086, 0.92405, 0.91929, 0.85795].map((shipped, layer) => ({ layer, fp32: 1, shipped })), 0.85, undefined, []);
    expect(w4.map((x) => x.text)).toEqual(['layer 3 keeps 0.85795, 0.00795 above the 0.85 gate (the other layers 0.91929 or more): it passes by a hair, and it is where drift would start']);
  });

  it('names the fp32 graphs\' step first (no precision fixes it), a step beyond the tie margin before a tie, at the traced position', () => {
    const lengths = [6, 10];
    const steps = [{ prompt: 1, step: 10 - 1 + 4, hf: { token: 9, runnerUp: 7, margin: 0.5 } }];
    const both = parity({ quantize: variant([mismatch(0, 1, false)]), export: variant([mismatch(1, 2, true), mismatch(1, 4, false)]) }, { quantize: false, export: false });
    expect(firstDivergence(both, lengths, steps)).toEqual({
      variant: 'export', prompt: 1, step: 4, position: 13, hf: { token: 9, runnerUp: 7, margin: 0.5 }, runtime: { token: 5, hfMargin: 2, tie: false, tieMargin: 0.2 },
    });
    // The fp32 graphs hold (a tie within the bound): the shipped graphs' step.
    const shipped = parity({ export: variant([mismatch(0, 0, true)]), quantize: variant([mismatch(0, 1, false)]) }, { export: true, quantize: false });
    expect(firstDivergence(shipped, lengths)).toMatchObject({ variant: 'quantize', prompt: 0, step: 1, position: 6, hf: { token: 9 } });
  });

  it('says what a run chose at a step: HF\'s token, a tie, another token, or unknown past the listed mismatches', () => {
    const v = variant([mismatch(0, 3, true), mismatch(1, 2, false, 8)], { mismatchCount: 5 });
    expect(verdictAt(v, 0, 3)).toEqual({ verdict: 'tie', token: 5, margin: 2 });
    expect(verdictAt(v, 1, 2)).toEqual({ verdict: 'other', token: 8, margin: 2 });
    expect(verdictAt(v, 0, 1)).toEqual({ verdict: 'hf' });
    expect(verdictAt(v, 1, 9).verdict).toBe('unknown'); // prompt 1 has mismatches past the listed ones
    expect(verdictAt(variant([], { perPrompt: [{ matched: 0, total: 32, nonFinite: 'NaN at step 2' }] }), 0, 4)).toEqual({ verdict: 'non-finite', message: 'NaN at step 2' });
  });
});

describe('forge bisect on tiny-qwen3: the runtime and device links', () => {
  let work: string;
  let record: RunRecord;
  const entry = (name: string) => join(cacheRoot(), name, record.stages.find((s) => s.name === name)!.key!);
  beforeAll(async () => {
    work = mkdtempSync(join(tmpdir(), 'forge-bisect-runtime-'));
    // The build bisect reads (through parity and the simulator; cached after the first time).
    record = await build({ recipe: 'tiny-qwen3', arch: 'v81', out: join(work, 'build'), progress: silentProgress });
  }, 1_800_000);

  it('host: the ONNX chain and the native runtime with its own KV cache follow HF; bisect reads the parity gate\'s parity.json', async () => {
    const run = await forge(['bisect', 'tiny-qwen3', '--arch', 'v81', '--json', '--out', join(work, 'host')]);
    expect(run.code, run.stderr).toBe(0);
    const b = lastJson(run.stdout) as BisectResult;
    expect(b.verdict).toBe('no-fault');
    expect(b.link).toBeUndefined();
    expect(b.message).toMatch(/the native runtime on this CPU follows HF with its own KV cache and host code \(parity 256\/256 equal to HF teacher-forced\)$/);
    const real = JSON.parse(readFileSync(join(entry('parity'), 'parity.json'), 'utf8')) as ParityJson;
    expect(real.target).toBe('host');
    expect(b.runtime!.parity).toMatchObject({ ok: real.ok, holds: true, target: 'host', matched: real.matched, total: real.total, ties: real.ties, mismatches: 0 });
    expect(b.runtime!.parity.variants.quantize.tieMargin).toBe(real.variants.quantize.tieMargin);
    expect(b.runtime!.divergence).toBeUndefined();
    console.log(`healthy cached host bisect: ${b.seconds.toFixed(1)} s in bisect`);
  }, 900_000);

  it('FAKE DEVICE (a scripted adb, no phone): host and simulator hold, the device leaves HF at the planted step: link device, the simulator\'s verdict there', async () => {
    const fake = mkdtempSync(join(tmpdir(), 'forge-fake-phone-'));
    // A serial of its own: the parity stage's cache key holds the target, so this run's device result is not an earlier run's.
    const serial = `FAKE-${process.pid}-${Date.now()}`;
    const env = { ADB: resolve('test/fixtures/fake-adb-forced.sh'), FAKE_ADB_DIR: fake, FAKE_ADB_FLIP_RUN: '1', FAKE_ADB_FLIP_STEP: '7' };
    const run = await forge(['bisect', 'tiny-qwen3', '--arch', 'v81', '--target', 'adb', '--serial', serial, '--runner', '/android/qhx_generate', '--device-libs', '/android/lib', '--json', '--out', join(work, 'adb')], env);
    expect(run.code, run.stderr).toBe(0);
    const b = lastJson(run.stdout) as BisectResult;
    const hf = readTraceMeta(entry('trace')).prompts[1].generated[7];
    expect(b.target).toBe('adb');
    expect(b.link).toBe('device');
    expect(b.verdict).toBe('unfixed');
    expect(b.runtime!.parity.holds).toBe(true);
    expect(b.simulator!.parity.ok).toBe(true);
    const d = b.device!;
    expect(d.parity).toMatchObject({ target: `adb:${serial}`, holds: false, ok: false });
    expect(d.divergence).toMatchObject({ variant: 'quantize', prompt: 1, step: 7, hf: { token: hf }, runtime: { token: hf > 0 ? hf - 1 : 1 } });
    expect(d.divergence!.hf.margin).toBeGreaterThan(0);
    expect(d.simulatorAt).toEqual({ verdict: 'hf' });
    expect(d.hostAt).toEqual({ verdict: 'hf' });
    expect(d.note).toMatch(/no op-level resolution on a device/);
    expect(b.message).toMatch(/^link device: the host runtime and the x86 HTP simulator hold, .* at prompt 1 step 7: .* the x86 simulator gave HF's token/);
    // The fake phone was driven as a phone is: the compiled bundle pushed once, every prompt teacher-forced.
    const calls = readFileSync(join(fake, 'adb.log'), 'utf8').trim().split('\n');
    expect(calls.filter((c) => c.includes('push') && c.includes('/bundle')).length).toBe(1);
    expect(calls.filter((c) => c.includes('./qhx_generate') && c.includes('--force-ids')).length).toBe(readTraceMeta(entry('trace')).prompts.length);
  }, 900_000);

  it('FAKE DEVICE that follows HF: every link holds, the message says the device does too', async () => {
    const fake = mkdtempSync(join(tmpdir(), 'forge-fake-phone-'));
    const serial = `FAKE-OK-${process.pid}-${Date.now()}`;
    const run = await forge(['bisect', 'tiny-qwen3', '--arch', 'v81', '--target', 'adb', '--serial', serial, '--runner', '/android/qhx_generate', '--device-libs', '/android/lib', '--json', '--out', join(work, 'adb-ok')],
      { ADB: resolve('test/fixtures/fake-adb-forced.sh'), FAKE_ADB_DIR: fake });
    expect(run.code, run.stderr).toBe(0);
    const b = lastJson(run.stdout) as BisectResult;
    expect(b.verdict).toBe('no-fault');
    expect(b.link).toBeUndefined();
    expect(b.device!.parity).toMatchObject({ holds: true, mismatches: 0 });
    expect(b.device!.divergence).toBeUndefined();
    expect(b.message).toMatch(/the native runtime on this CPU follows HF .*; the x86 simulator and the device \(adb:FAKE-OK-[^)]*\) follow HF too: parity 128\/128$/);
  }, 900_000);

  it('--target adb without its phone is refused before anything builds', async () => {
    const run = await forge(['bisect', 'tiny-qwen3', '--arch', 'v81', '--target', 'adb', '--serial', 'X']);
    expect(run.code).not.toBe(0);
    expect(run.stderr).toContain('forge bisect --target adb needs --serial, --runner and --device-libs');
  }, 120_000);

  it('runtime link on a planted parity.json: the step, the TS chain\'s margin there, the layers weighed at it, the fix judged by the parity rebuild', async () => {
    const real = JSON.parse(readFileSync(join(entry('parity'), 'parity.json'), 'utf8')) as ParityJson;
    const meta = readTraceMeta(entry('trace'));
    const k = 5, hfToken = meta.prompts[0].generated[k], other = meta.prompts[0].runner_up[k];
    const m: Mismatch = { prompt: 0, step: k, hf: { token: hfToken, logit: 0 }, runtime: { token: other, hfLogit: 0 }, margin: meta.prompts[0].margins[k], tie: false };
    const planted = { ...real, ok: false, variants: { ...real.variants, quantize: { ...real.variants.quantize, ok: false } }, detail: { ...real.detail, quantize: { ...real.detail.quantize, mismatchCount: 1, mismatches: [m] } } };
    const { recipe } = loadRecipe('tiny-qwen3');
    const { settings } = archSettings(recipe, 'v81');
    const result = { drift: undefined, trials: [], fixes: [] } as unknown as BisectResult;
    const rebuilt: string[][] = [];
    await runtimeLink(result, planted, {
      family: recipe.family, ckpt: readCheckpointRef(entry('fetch')).absDir, traceDir: entry('trace'), quantizeDir: entry('quantize'), settings, log: () => {},
      // Stands in for the parity rebuild: its verdict, not a rescan of the TypeScript chain, judges the fix.
      rebuild: async (overrides) => (rebuilt.push(overrides.map((o) => o.match)), { oracleOk: true, quantizeDir: entry('quantize'), holds: rebuilt.length === 1 }),
    });
    const pos = meta.prompts[0].prompt_tokens.length - 1 + k;
    expect(result.runtime!.divergence).toMatchObject({ variant: 'quantize', prompt: 0, step: k, position: pos, runtime: { token: other, tie: false } });
    const layers = result.runtime!.attribution!.layers;
    expect(layers.map((l) => l.layer).sort()).toEqual([0, 1, 2, 3]);
    expect(rebuilt[0][0]).toContain(`layers\\.${result.layer}\\.`); // the whole layer named first, one rung up
    expect(result.trials[0]).toMatchObject({ ok: true });
    expect(result.trials.slice(1).every((t) => !t.ok && t.stillFails === 'the parity gate')).toBe(true);
    expect(result.verdict).toBe('fixed');
    expect(result.message).toMatch(/^link runtime: every teacher-forced graph holds .* at prompt 0 step 5: .*own KV cache carried across steps and its host code/);
  }, 900_000);
});
