// The card's (and the build report's) Confidence section: HF's margins along the traced
// continuations next to the largest logit error each precision showed, with the near-ties (a margin
// below twice the error) counted for each.
import { describe, expect, it } from 'vitest';
import { modelCard, type CardFacts } from '../src/bundle/card.js';
import { buildConfidence, nearTies, simulatorLogitError } from '../src/bundle/confidence.js';
import { reportHtml, reportMarkdown } from '../src/bundle/report.js';
import { getArch } from '../src/arch/table.js';
import type { MarginSummary, TraceMeta } from '../src/gates/trace.js';
import type { RunRecord } from '../src/engine/record.js';

const margins: MarginSummary = {
  count: 6, min: 0.0007, p5: 0.0007, p50: 0.31, max: 2.5, fp16_spacing: 2 ** -8, below_fp16_spacing: 1, below_0_1: 2,
  smallest: { prompt: 1, step: 9, generated_index: 3, margin: 0.0007, token: 42, runner_up: 17, token_text: ' Paris', runner_up_text: ' Lyon' },
};
const trace = {
  margins,
  prompts: [
    { text: 'a', prompt_tokens: [1, 2], generated: [3, 3, 3], runner_up: [4, 4, 4], margins: [0.31, 2.5, 0.05], steps: 4 },
    { text: 'b', prompt_tokens: [1, 2, 3, 4, 5, 6, 7], generated: [42, 42, 42], runner_up: [17, 17, 17], margins: [1.2, 0.9, 0.0007], steps: 9 },
  ],
} as unknown as TraceMeta;
const row = (variant: string, graph: string, output: string, maxAbs: number) => ({ variant, graph, layer: '-', output, what: output, minCosine: 1, maxAbs, worst: '', ok: true });
const oracle = {
  ok: true, slowNodes: [],
  rows: [row('export:fp32', 'lm_head', 'logits', 2.4e-6), row('export:fp32', 'shard0.decode', 'hidden_out', 1e-5), row('quantize:w8', 'lm_head', 'logits', 0.03), row('quantize:w8', 'shard0.decode', 'hidden_out', 0.2)],
  graphs: { 'export:fp32/lm_head': { minCosine: 1, ok: true }, 'quantize:w8/lm_head': { minCosine: 0.9999, ok: true } },
  logitError: { export: 2.4e-6, quantize: 0.03 },
  logitChain: { export: ['shard0.decode', 'lm_head'], quantize: ['shard0.decode', 'lm_head'] },
};
// emulation.json as the simulator gate writes it: per graph, per output tallies; logits on the lm-head only.
const emulation = {
  ran: true, simulator: { fp16: true },
  oracle: { graphs: { lm_head: { outputs: { logits: { maxAbs: 0.2 } } }, 'shard0.decode': { outputs: { hidden_out: { maxAbs: 3 } } } } },
};

function facts(): CardFacts {
  const manifest = {
    hostOp: 'decoder_generate', limits: { maxContext: 128 }, generation: { maxNewTokens: 3 },
    contexts: [{ graphs: [{ quant: { weights: 'w8' } }] }], hostTables: [], tokenizer: { file: 'tokenizer.json' },
  };
  return {
    recipe: { id: 'x', family: 'qwen3', source: { kind: 'tiny', twin: 'qwen3' }, card: { title: 'X', license: 'apache-2.0', caveats: [] } as unknown as CardFacts['recipe']['card'] },
    arch: getArch('v81'), manifest: manifest as unknown as CardFacts['manifest'], compiled: [],
    oracle, parity: { ok: true, target: 'host', matched: 6, total: 6, ties: 0, maxTies: 0, rule: 'r', variants: {}, mismatches: { count: 0, listed: [] } }, tools: {},
    confidence: buildConfidence(trace, oracle, emulation), planDropped: [],
  };
}

describe('the Confidence figures', () => {
  it('take the simulator\'s logit error as the largest over its graphs\' logits outputs, and none when it did not run or a logit was non-finite', () => {
    expect(simulatorLogitError(emulation)).toEqual({ error: 0.2, graphs: ['lm_head'] });
    expect(simulatorLogitError({ ...emulation, ran: false })).toBeUndefined();
    expect(simulatorLogitError({ ran: true, oracle: { graphs: { lm_head: { outputs: { logits: { maxAbs: null } } } } } })).toBeUndefined();
  });

  it('count a near-tie where the margin is below twice the error', () => {
    const c = buildConfidence(trace, oracle, emulation);
    expect(c.stepMargins).toEqual([0.31, 2.5, 0.05, 1.2, 0.9, 0.0007]);
    expect(nearTies(c, 2.4e-6)).toBe(0);
    expect(nearTies(c, 0.03)).toBe(2); // 0.05 and 0.0007 are below 0.06
    expect(nearTies(c, 0.155)).toBe(2); // 0.31 is not below 2 × 0.155 …
    expect(nearTies(c, 0.2)).toBe(3); // … but is below 0.4
  });
});

describe('the model card', () => {
  it('shows the margin distribution, the smallest margin\'s step and the largest logit error of each precision with its near-ties', () => {
    const card = modelCard(facts(), {});
    const section = card.slice(card.indexOf('## Confidence'), card.indexOf('## Toolchain')).trim().split('\n');
    expect(section).toEqual([
      '## Confidence',
      '',
      'Hugging Face fp32\'s top-1 − top-2 logit margin at each of the 6 greedy steps the gates trace (2 prompts): min 0.0007, p5 0.0007, median 0.31, max 2.5; '
        + '1 below 0.00391 (2⁻⁸, fp16\'s spacing between 4 and 8), 2 below 0.1. Smallest: prompt 1, step 9 (generated token 3), token 42 `" Paris"` over 17 `" Lyon"` by 0.0007.',
      '',
      '| graphs | measured in | logits of | largest logit error | near-ties (margin < 2 × error) |',
      '|---|---|---|---|---|',
      '| fp32 reference | oracle gate (ONNX Runtime CPU, each step end to end on the traced tokens and caches) | shard0.decode, lm_head | 2.40e-6 | 0/6 |',
      '| shipped (w8) | oracle gate (ONNX Runtime CPU, each step end to end on the traced tokens and caches) | shard0.decode, lm_head | 3.00e-2 | 2/6 |',
      '| shipped (w8) | emulation gate (x86 HTP simulator, fp16 activations, teacher-forced) | lm_head | 2.00e-1 | 3/6 |',
      '',
      'A step whose margin is below twice a precision\'s largest logit error is a near-tie: an error of that size on each of the two logits may flip the token there; a larger margin cannot be overturned by it. '
        + 'The oracle\'s error is one step end to end: the graphs listed run in order, each fed the previous one\'s output, with Hugging Face\'s tokens and caches, so every layer\'s error (e.g. its quantization) is in it. The simulator\'s is teacher-forced per graph: the graph producing the logits is fed Hugging Face\'s own inputs, so where that is a separate lm-head the decoder layers\' error is not in it.',
    ]);
  });

  it('leaves the simulator row out when the simulator gate did not run', () => {
    const f = facts();
    f.confidence = buildConfidence(trace, oracle);
    expect(modelCard(f, {})).not.toContain('emulation gate (x86 HTP simulator');
  });
});

describe('the build report', () => {
  it('carries the same figures in report.md and report.html', () => {
    const record = { recipe: 'x', arch: 'v81', ok: true, status: 'ok', seconds: 1, stages: [], gates: {}, summaries: {}, tools: {}, bundle: null, buildDir: null } as unknown as RunRecord;
    const input = { record, confidence: buildConfidence(trace, oracle, emulation) };
    const md = reportMarkdown(input);
    expect(md).toContain('| 6 | 0.0007 | 0.0007 | 0.31 | 2.5 | 1 | 2 | prompt 1 step 9: 42 “ Paris” over 17 “ Lyon” |');
    expect(md).toContain('| shipped (w8) | oracle gate (ONNX Runtime CPU, each step end to end on the traced tokens and caches) | shard0.decode, lm_head | 3.00e-2 | 2/6 |');
    expect(md).toContain('| shipped (w8) | emulation gate (x86 HTP simulator, fp16 activations, teacher-forced) | lm_head | 2.00e-1 | 3/6 |');
    const html = reportHtml(input);
    expect(html).toContain('<td>3.00e-2</td><td>2/6</td>');
    expect(html).toContain('<td>prompt 1 step 9: 42 “ Paris” over 17 “ Lyon”</td>');
  });
});
