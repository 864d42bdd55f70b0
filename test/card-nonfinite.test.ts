// The model card says where the weights came from (a hub revision the recipe pins, or one given
// with --revision), and when the recipe turned fetch's NaN/Inf weight check off, and why.
import { describe, expect, it } from 'vitest';
import { modelCard, type CardFacts } from '../src/bundle/card.js';
import { getArch } from '../src/arch/table.js';

function facts(source: CardFacts['recipe']['source']): CardFacts {
  const manifest = {
    hostOp: 'decoder_generate', limits: { maxContext: 128 }, generation: { maxNewTokens: 8 },
    contexts: [{ graphs: [{ quant: { weights: 'w8' } }] }], hostTables: [], tokenizer: { file: 'tokenizer.json' },
  };
  return {
    recipe: { id: 'x', family: 'qwen3', source, card: { title: 'X', license: 'apache-2.0', caveats: [] } as CardFacts['recipe']['card'] },
    arch: getArch('v81'), manifest: manifest as unknown as CardFacts['manifest'], compiled: [],
    oracle: { ok: true, rows: [], graphs: {}, logitError: {}, logitChain: {} },
    parity: { ok: true, target: 'host', matched: 1, total: 1, ties: 0, maxTies: 0, rule: 'r', variants: {}, mismatches: { count: 0, listed: [] } },
    tools: {}, planDropped: [],
    confidence: {
      margins: { count: 1, min: 1, p5: 1, p50: 1, max: 1, fp16_spacing: 2 ** -8, below_fp16_spacing: 0, below_0_1: 0, smallest: { prompt: 0, step: 0, generated_index: 0, margin: 1, token: 1, runner_up: 2, token_text: 'a', runner_up_text: 'b' } },
      stepMargins: [1], prompts: 1, errors: [],
    },
  };
}

describe('model card', () => {
  it('names a disabled NaN/Inf weight check with the recipe\'s reason, and says nothing when the check ran', () => {
    const off = modelCard(facts({ kind: 'local', path: '/m', allowNonFinite: { reason: 'masked rows are -inf by design' } }), {});
    expect(off).toContain('**NaN/Inf weight check: not run** — the recipe allows non-finite weights: masked rows are -inf by design.');
    expect(modelCard(facts({ kind: 'local', path: '/m' }), {})).not.toContain('NaN/Inf');
  });

  it('names the hub revision built, and says when --revision gave it because the recipe pins none', () => {
    const sha = 'c'.repeat(40);
    expect(modelCard(facts({ kind: 'hub', repo: 'org/m', revision: sha }), {})).toContain(`Built by forge from [org/m](https://huggingface.co/org/m) at revision \`${sha}\`, recipe`);
    expect(modelCard(facts({ kind: 'hub', repo: 'org/m', revision: sha, unpinned: 'no hub here.' }), {}))
      .toContain(`Built by forge from [org/m](https://huggingface.co/org/m) at revision \`${sha}\`, given at build time with \`--revision\` (the recipe pins none: no hub here), recipe`);
  });
});
