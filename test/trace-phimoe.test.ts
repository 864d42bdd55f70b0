// The trace's named MoE captures on the PhiMoE twin (oracles/trace.py LAYER_CAPTURES), checked by
// oracles/check_trace.py, which imports nothing from the tracer: per layer and step the attention
// residual, the router logits, the two experts and weights HF's sparsemixer chose, and the MoE
// block output. Also the typed trace inputs (text; token ids are traced in test/bisect-from.test.ts).
import { describe, it, expect, beforeAll } from 'vitest';
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import { venvPython } from '../src/toolchain/venv.js';
import { twinDir } from './helpers/twin.js';

const TRACE = resolve('oracles/trace.py');
const CHECK = resolve('oracles/check_trace.py');
const dir = mkdtempSync(join(tmpdir(), 'forge-trace-phimoe-'));
const model = join(dir, 'twin');
const traceDir = join(dir, 'trace');

async function trace(inputs: unknown, out: string) {
  const prompts = join(dir, `inputs-${Math.random().toString(36).slice(2)}.json`);
  writeFileSync(prompts, JSON.stringify(inputs));
  return $({ quiet: true, nothrow: true })`${venvPython()} ${TRACE} --model ${model} --out ${out} --prompts ${prompts} --new-tokens 6 --max-context 64`;
}

async function check(traceAt: string) {
  const r = await $({ quiet: true, nothrow: true })`${venvPython()} ${CHECK} --model ${model} --trace ${traceAt} --tol 1e-5`;
  return { code: r.exitCode, report: JSON.parse(r.stdout.trim().split('\n').pop()!) };
}

/** Runs Python over the trace's tensors: `edit` sees t (the tensors) and may change them. */
async function editTrace(at: string, edit: string) {
  const code = `
import json, sys
from safetensors.torch import load_file, save_file
d = sys.argv[1]; meta = json.load(open(d + "/trace.json")); t = load_file(d + "/" + meta["tensors"])
${edit}
save_file(t, d + "/" + meta["tensors"])`;
  await $({ quiet: true })`${venvPython()} -c ${code} ${at}`;
}

beforeAll(async () => {
  cpSync(await twinDir('phimoe'), model, { recursive: true });
  // A plain string and a typed text input: the same kind of input.
  const r = await trace(['The capital of France is', { type: 'text', text: 'Hello' }], traceDir);
  if (r.exitCode !== 0) throw new Error(r.stderr);
}, 600_000);

describe('the PhiMoE trace', () => {
  it('captures per layer the attention residual, the MoE input, router logits, HF\'s chosen experts and weights and the MoE output, and they check out', async () => {
    const { code, report } = await check(traceDir);
    expect(report.problems).toEqual([]);
    expect(code).toBe(0);
    // Router logits and the MoE output recomputed in float64 from the captured attention residual;
    // the weights from a float64 sparsemixer written from its description.
    for (const k of ['moe_in_by_hand', 'router_by_hand', 'weights_by_hand', 'moe_by_hand', 'k_by_hand', 'v_by_hand']) expect(report.errors[k].rel, k).toBeLessThan(1e-5);
    const meta = JSON.parse(readFileSync(join(traceDir, 'trace.json'), 'utf8'));
    expect(meta.prompts.map((p: { text: string }) => p.text)).toEqual(['The capital of France is', 'Hello']);
  }, 120_000);

  it('fails, naming the step and layer, when the recorded experts are not the ones HF\'s sparsemixer picks', async () => {
    const bad = mkdtempSync(join(tmpdir(), 'forge-bad-experts-'));
    cpSync(traceDir, bad, { recursive: true });
    await editTrace(bad, 't["p0/s2/expert_ids.1"] = t["p0/s2/expert_ids.1"].flip(0).contiguous()');
    const { code, report } = await check(bad);
    expect(code).toBe(1);
    expect(report.problems).toEqual(expect.arrayContaining([expect.stringMatching(/^p0\/s2\/: expert_ids\.1 \[\d, \d\] != HF sparsemixer \[\d, \d\]$/)]));
  }, 120_000);

  it('fails when the MoE output does not add up with the attention residual to the layer output', async () => {
    const bad = mkdtempSync(join(tmpdir(), 'forge-bad-moe-'));
    cpSync(traceDir, bad, { recursive: true });
    await editTrace(bad, 't["p1/s0/moe_out.3"] = t["p1/s0/moe_out.3"] * 1.001');
    const { code, report } = await check(bad);
    expect(code).toBe(1);
    expect(report.problems).toEqual(expect.arrayContaining(['p1/s0/: attn_res.3 + moe_out.3 != h.4', expect.stringMatching(/^moe_by_hand: relative error/)]));
  }, 120_000);

  it('refuses an input type it cannot feed yet, naming the entry', async () => {
    const r = await trace(['ok', { type: 'pixels', pixels: [0, 1] }], join(dir, 'refused'));
    expect(r.exitCode).toBe(1);
    expect(r.stderr.trim()).toMatch(/^trace: error: .*inputs-\w+\.json: \[1\]\.type is 'pixels'; supported: text, ids$/);
  }, 60_000);
});
