// The trace streams its weights (oracles/trace.py: the checkpoint stays memory-mapped and each
// module gets its fp32 weights only for its own forward). Same module code and same fp32 values as
// HF's plain fp32 load (--whole-model) must give the same trace, byte for byte, on every family.
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { runPython } from '../src/toolchain/python.js';
import { FAMILY_IDS } from '../src/recipe/schema.js';
import { openSafetensors } from '../src/io/safetensors.js';
import { twinDir } from './helpers/twin.js';

const TRACE = resolve('oracles/trace.py');
const dir = mkdtempSync(join(tmpdir(), 'forge-trace-streamed-'));
const prompts = join(dir, 'prompts.json');

beforeAll(() => writeFileSync(prompts, JSON.stringify(['The capital of France is', 'Hello'])));

async function trace(model: string, out: string, extra: string[] = []) {
  const r = await runPython(TRACE, ['--model', model, '--out', out, '--prompts', prompts, '--new-tokens', '6', '--max-context', '64', ...extra]);
  return JSON.parse(r.stdout.trim().split('\n').pop()!);
}

/** fp32 bytes of the text model's weights: in all, and of its largest unit (a decoder layer, or
 *  one module outside the layers, e.g. lm_head with its bias). Vision and audio towers never run in
 *  a text trace. */
async function unitBytes(file: string) {
  const st = await openSafetensors(file);
  const groups = new Map<string, number>();
  let total = 0;
  for (const t of st.tensors.values()) {
    if (/vision|audio|visual/.test(t.name)) continue;
    const bytes = t.shape.reduce((a, b) => a * b, 1) * 4;
    const unit = /^(.*\.layers\.\d+)\./.exec(t.name)?.[1] ?? t.name.slice(0, t.name.lastIndexOf('.')); // a layer, or a module
    groups.set(unit, (groups.get(unit) ?? 0) + bytes);
    total += bytes;
  }
  await st.close();
  return { total, largest: Math.max(...groups.values()) };
}

describe('the streamed trace', () => {
  it.each(FAMILY_IDS)('writes the same trace.safetensors and trace.json bytes as the whole-model fp32 load (%s twin)', async (family) => {
    const model = await twinDir(family);
    const streamed = await trace(model, join(dir, `${family}-streamed`));
    const whole = await trace(model, join(dir, `${family}-whole`), ['--whole-model']);
    expect(streamed.weights).toBe('streamed');
    expect(whole.weights).toBe('whole-model');
    expect(streamed.steps).toBeGreaterThan(10);
    for (const f of ['trace.safetensors', 'trace.json']) {
      const a = readFileSync(join(dir, `${family}-streamed`, f));
      const b = readFileSync(join(dir, `${family}-whole`, f));
      expect(a.length, f).toBe(b.length);
      expect(a.equals(b), `${family}: ${f} differs`).toBe(true);
    }
    // It streamed: never more fp32 weights at once than the largest unit (one decoder layer, or one
    // module outside the layers such as the lm_head), and well under the model's fp32 size.
    const units = await unitBytes(join(model, 'model.safetensors'));
    expect(streamed.weights_fp32_peak_bytes).toBeGreaterThan(0);
    expect(streamed.weights_fp32_peak_bytes).toBeLessThanOrEqual(units.largest);
    expect(streamed.weights_fp32_peak_bytes).toBeLessThan(units.total / 2);
    expect(whole.weights_fp32_peak_bytes).toBeNull();
  }, 600_000); // a trained twin is 10–25 s on an idle 2-core machine; this suite runs beside others (180 s was hit under load)
});
