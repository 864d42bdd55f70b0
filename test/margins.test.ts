// Issue 13: how confident the reference is, and how far each precision's logits are from it. The
// trace records HF's top-1 − top-2 margin at every generated token; the oracle gate records each
// input's largest logit error. Checked here on the tiny Qwen3 twin, from the bytes the stages wrote.
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { Trace, type MarginSummary } from '../src/gates/trace.js';
import type { OracleResult } from '../src/gates/oracle.js';
import type { RunRecord } from '../src/engine/record.js';

let record: RunRecord;
const entry = (id: string) => join(cacheRoot(), id, record.stages.find((s) => s.name === id)!.key!);

beforeAll(async () => {
  record = await build({ recipe: 'tiny-qwen3', arch: 'v81', until: 'oracle', out: mkdtempSync(join(tmpdir(), 'forge-margins-')), progress: silentProgress });
  if (!record.ok) throw new Error(record.error);
}, 900_000);

/** The argmax (first of equal maxima) and the largest of the rest, in the stored float32 logits. */
function topTwo(logits: Float32Array): [number, number] {
  let a = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[a]) a = i;
  let b = a === 0 ? 1 : 0;
  for (let i = 0; i < logits.length; i++) if (i !== a && logits[i] > logits[b]) b = i;
  return [a, b];
}

describe('the trace records HF\'s margins', () => {
  it('margins[j] is top-1 − top-2 of the logits stored at the step that chose generated[j], runner_up[j] the second token', async () => {
    const trace = await Trace.open(entry('trace'));
    try {
      let checked = 0;
      for (const [p, pr] of trace.meta.prompts.entries()) {
        expect(pr.margins).toHaveLength(trace.meta.new_tokens);
        expect(pr.runner_up).toHaveLength(trace.meta.new_tokens);
        for (let j = 0; j < pr.generated.length; j++) {
          const logits = await trace.get(p, pr.prompt_tokens.length - 1 + j, 'logits');
          const [a, b] = topTwo(logits);
          expect([pr.generated[j], pr.runner_up[j]]).toEqual([a, b]);
          expect(pr.margins[j]).toBe(logits[a] - logits[b]);
          checked++;
        }
      }
      expect(checked).toBe(trace.meta.prompts.length * trace.meta.new_tokens);
      expect(trace.meta.prompts.length).toBe(4); // tiny-qwen3's prompts, one long and one non-ASCII
    } finally {
      await trace.close();
    }
  });

  it('summarises them (count, min, nearest-rank p5 and median, max, counts below 2^-8 and 0.1, the smallest step) in trace.json and the stage summary', () => {
    const meta = JSON.parse(readFileSync(join(entry('trace'), 'trace.json'), 'utf8'));
    const all: Array<{ m: number; p: number; j: number }> = meta.prompts.flatMap((pr: { margins: number[] }, p: number) => pr.margins.map((m, j) => ({ m, p, j })));
    const sorted = all.map((x) => x.m).sort((x, y) => x - y);
    const rank = (pct: number) => sorted[Math.max(0, Math.ceil((pct * sorted.length) / 100) - 1)];
    const least = all.reduce((x, y) => (y.m < x.m ? y : x));
    const pr = meta.prompts[least.p];
    const want: MarginSummary = {
      count: sorted.length, min: sorted[0], p5: rank(5), p50: rank(50), max: sorted[sorted.length - 1], fp16_spacing: 2 ** -8,
      below_fp16_spacing: sorted.filter((m) => m < 2 ** -8).length, below_0_1: sorted.filter((m) => m < 0.1).length,
      smallest: {
        prompt: least.p, step: pr.prompt_tokens.length - 1 + least.j, generated_index: least.j, margin: least.m,
        token: pr.generated[least.j], runner_up: pr.runner_up[least.j], token_text: expect.any(String) as unknown as string, runner_up_text: expect.any(String) as unknown as string,
      },
    };
    expect(meta.margins).toEqual(want);
    expect(sorted[0]).toBeGreaterThanOrEqual(0);
    expect((record.summaries.trace as { margins: unknown }).margins).toEqual(meta.margins);
  });
});

describe('the oracle gate records each input\'s largest logit error', () => {
  it('logitError[input] is measured with the input\'s one-token graphs chained end to end: W8\'s includes the decoder\'s quantization, which the separate lm-head\'s own error cannot show', () => {
    const oracle = JSON.parse(readFileSync(join(entry('oracle'), 'oracle.json'), 'utf8')) as OracleResult;
    const lmHead = (input: string) => oracle.rows.find((r) => r.variant.startsWith(`${input}:`) && r.graph === 'lm_head' && r.output === 'logits')!.maxAbs;
    expect(Object.keys(oracle.logitError).sort()).toEqual(['export', 'quantize']);
    expect(oracle.logitChain).toEqual({ export: ['shard0.decode', 'lm_head'], quantize: ['shard0.decode', 'lm_head'] });
    // fp32 stays at float rounding; W8 moves the logits far more than the lm-head alone does (fp16
    // weights, exact for a bf16 twin), and far less than the trained twin's margins.
    expect(oracle.logitError.export).toBeLessThan(1e-4);
    expect(oracle.logitError.quantize).toBeGreaterThan(10 * lmHead('quantize'));
    expect(oracle.logitError.quantize).toBeGreaterThan(oracle.logitError.export);
    const meta = JSON.parse(readFileSync(join(entry('trace'), 'trace.json'), 'utf8'));
    expect(2 * oracle.logitError.quantize).toBeLessThan(meta.margins.min);
    expect(record.gates.oracle.logitError).toEqual(oracle.logitError);
  });
});
