// The oracle's trace, checked by a script that imports nothing from the tracer
// (oracles/check_trace.py): format, hidden states and logits against a full-sequence forward, greedy
// tokens against model.generate, K/V rows by hand (Qwen3), and Qwen3.5's recurrent states against
// HF's chunked prefill — a second code path for the same state.
import { describe, it, expect, beforeAll } from 'vitest';
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import { venvPython } from '../src/toolchain/venv.js';

const SCRIPT = new URL('../oracles/check_trace.py', import.meta.url).pathname;
const traces: Record<string, { model: string; trace: string }> = {};

beforeAll(async () => {
  for (const recipe of ['tiny-qwen3', 'tiny-qwen3.5']) {
    const r = await build({ recipe, arch: 'v81', until: 'trace', out: mkdtempSync(join(tmpdir(), 'forge-trace-check-')), progress: silentProgress });
    if (!r.ok) throw new Error(r.error);
    const entry = (id: string) => join(cacheRoot(), id, r.stages.find((s) => s.name === id)!.key!);
    traces[recipe] = { model: readCheckpointRef(entry('fetch')).absDir, trace: entry('trace') };
  }
}, 600_000);

async function check(model: string, trace: string, tol: string) {
  const r = await $({ quiet: true, nothrow: true })`${venvPython()} ${SCRIPT} --model ${model} --trace ${trace} --tol ${tol}`;
  return { code: r.exitCode, report: JSON.parse(r.stdout.trim().split('\n').pop()!) };
}

describe('the trace, checked independently', () => {
  it('tiny-qwen3: hidden states, logits and greedy tokens are HF\'s; K/V rows match a float64 recomputation', async () => {
    const { code, report } = await check(traces['tiny-qwen3'].model, traces['tiny-qwen3'].trace, '1e-5');
    expect(report.problems).toEqual([]);
    expect(code).toBe(0);
    expect(Object.keys(report.errors)).toEqual(expect.arrayContaining(['h', 'logits', 'k_by_hand', 'v_by_hand']));
  }, 120_000);

  // The full-sequence forward runs HF's chunked delta rule, the trace its one-token recurrent form:
  // fp32 sums in another order, measured ~1e-5 relative over 64 steps; a wrong state is off by O(1).
  it('tiny-qwen3.5: conv and recurrent states and K/V rows equal those of HF\'s chunked prefill over the same tokens', async () => {
    const { code, report } = await check(traces['tiny-qwen3.5'].model, traces['tiny-qwen3.5'].trace, '5e-5');
    expect(report.problems).toEqual([]);
    expect(code).toBe(0);
    expect(report.errors.rec_vs_prefill.rel).toBeLessThan(5e-5);
    expect(report.errors.conv_vs_prefill.rel).toBeLessThan(5e-5);
  }, 120_000);

  it('fails, naming the step, on a trace whose recorded margin or runner-up is not its logits\' top-1 − top-2', async () => {
    const { model, trace } = traces['tiny-qwen3'];
    const bad = mkdtempSync(join(tmpdir(), 'forge-bad-margins-'));
    cpSync(trace, bad, { recursive: true });
    const meta = JSON.parse(readFileSync(join(bad, 'trace.json'), 'utf8'));
    const last = meta.prompts[1];
    last.margins[3] += 1e-6; // generated token 3 of prompt 1
    meta.prompts[0].runner_up[0] = meta.prompts[0].generated[0]; // the runner-up is not the top token
    writeFileSync(join(bad, 'trace.json'), JSON.stringify(meta));
    const { code, report } = await check(model, bad, '1e-5');
    expect(code).toBe(1);
    const step = (p: number, j: number) => `p${p}/s${meta.prompts[p].prompt_tokens.length - 1 + j}/`;
    expect(report.problems).toEqual(expect.arrayContaining([
      `${step(0, 0)}: runner_up ${meta.prompts[0].generated[0]} is not the second-highest logit`,
      expect.stringMatching(new RegExp(`^${step(1, 3)}: margin .* != logits\\[${last.generated[3]}\\] - logits\\[${last.runner_up[3]}\\]$`)),
    ]));
  }, 120_000);

  it('fails, naming it, on a trace whose recurrent state at the last step is off by 1%', async () => {
    const { model, trace } = traces['tiny-qwen3.5'];
    const bad = mkdtempSync(join(tmpdir(), 'forge-bad-trace-'));
    cpSync(trace, bad, { recursive: true });
    const edit = `
import json, sys
from safetensors.torch import load_file, save_file
d = sys.argv[1]; meta = json.load(open(d + "/trace.json"))
t = load_file(d + "/" + meta["tensors"]); last = meta["prompts"][0]["steps"] - 1
t[f"p0/s{last}/rec.0"] = t[f"p0/s{last}/rec.0"] * 1.01
save_file(t, d + "/" + meta["tensors"])`;
    await $({ quiet: true })`${venvPython()} -c ${edit} ${bad}`;
    const { code, report } = await check(model, bad, '5e-5');
    expect(code).toBe(1);
    expect(report.problems.join(' ')).toMatch(/rec_vs_prefill: relative error/);
  }, 120_000);
});
