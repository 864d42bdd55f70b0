// The model card says when the recipe turned fetch's NaN/Inf weight check off, and why.
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
    oracle: { ok: true, rows: [], graphs: {}, logitError: {} },
    parity: { ok: true, target: 'host', matched: 1, total: 1, ties: 0, maxTies: 0, rule: 'r', variants: {}, mismatches: { count: 0, listed: [] } },
    tools: {},
  };
}

describe('model card', () => {
  it('names a disabled NaN/Inf weight check with the recipe\'s reason, and says nothing when the check ran', () => {
    const off = modelCard(facts({ kind: 'local', path: '/m', allowNonFinite: { reason: 'masked rows are -inf by design' } }), {});
    expect(off).toContain('**NaN/Inf weight check: not run** — the recipe allows non-finite weights: masked rows are -inf by design.');
    expect(modelCard(facts({ kind: 'local', path: '/m' }), {})).not.toContain('NaN/Inf');
  });
});
