// forge bisect on a fault the gate sees only in the logits: the tiny-qwen3 twin with its lm-head
// made W4-hostile (test/helpers/w4-hostile.ts makeLmHeadW4Hostile: untied, one outlier per W4
// block, the function unchanged) and shipped with its lm-head at w4. Every layer's outputs hold;
// bisect names the lm-head, and its one matrix at w8 is the fix --apply writes.
import { describe, it, expect, beforeAll } from 'vitest';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { forge, lastJson } from './helpers/forge-cli.js';
import { makeLmHeadW4Hostile } from './helpers/w4-hostile.js';
import { lmHeadCandidates } from '../src/bisect/fixes.js';
import { PrecisionChooser } from '../src/quant/precision.js';
import { storedBytes } from '../src/quant/bytes.js';
import type { BisectResult } from '../src/bisect/run.js';
import type { TensorSpec } from '../src/families/types.js';
import { recipeSandbox, writeRecipeVariant } from './helpers/recipe-sandbox.js';
import { twinDir } from './helpers/twin.js';

let work: string;
let recipes: string;
beforeAll(() => void ({ work, recipes } = recipeSandbox('forge-bisect-lmhead-')));

describe('forge bisect, the lm-head', () => {
  it('names the lm-head when only the logits leave tolerance, and its w8 fix restores the gate', async () => {
    const hostile = join(work, 'hostile-head');
    await makeLmHeadW4Hostile(await twinDir('qwen3'), hostile);
    const id = 'tiny-qwen3-hostile-head';
    const recipeFile = writeRecipeVariant(recipes, 'tiny-qwen3', id, (r) => {
      r.source = { kind: 'local', path: hostile };
      r.arch.default.quant = 'w4';
      r.arch.default.lmHead = { ...r.arch.default.lmHead, quant: 'w4' };
    });

    const run = await forge(['bisect', id, '--arch', 'v81', '--apply', '--json', '--out', join(work, 'bisect')], { FORGE_RECIPES: recipes });
    expect(run.code, run.stderr).toBe(0);
    const b = lastJson(run.stdout) as BisectResult;
    expect(b.fault).toMatchObject({ link: 'quantization', layer: null, output: 'logits' });
    // Every layer's outputs held at w4: it is the lm-head's own error.
    expect(b.layers.every((l) => l.shipped! >= b.thresholds.shipped)).toBe(true);
    expect(b.verdict).toBe('fixed');
    expect(b.message).toMatch(/while every layer's outputs hold: the lm-head \(w4\)/);
    expect(b.chosen).toMatchObject({ label: 'lm-head lm_head w4→w8', tensors: [{ name: 'lm_head.weight', from: 'w4', to: 'w8' }], ok: true });
    expect(b.chosen!.layer).toBeUndefined();
    console.log(`[measured] bisect on the lm-head-hostile twin: ${b.fault!.graph} ${b.fault!.output} ${b.fault!.top1 ? `top-1 ${b.fault!.top1}` : b.fault!.cosine.toFixed(5)}; ${b.trials.map((t) => `${t.label} ${t.ok ? 'ok' : 'no'} ${t.minCosine?.toFixed(5)} +${t.addedBytes} B ${t.seconds.toFixed(1)} s`).join('; ')}; ${b.seconds.toFixed(1)} s`);

    // --apply wrote it; the plain build passes the oracle gate from the trial's cached stages.
    expect(JSON.parse(readFileSync(recipeFile, 'utf8')).arch.default.overrides[0]).toEqual(b.chosen!.overrides[0]);
    const rebuilt = await forge(['build', id, '--arch', 'v81', '--until', 'oracle', '--json', '--out', join(work, 'rebuilt')], { FORGE_RECIPES: recipes });
    expect(lastJson(rebuilt.stdout).gates.oracle.ok, rebuilt.stderr).toBe(true);
  }, 900_000);

  it('makes one candidate per lm-head matrix one rung up from where the lm-head scheme and the overrides put it', () => {
    const head: TensorSpec = { name: 'lm_head.weight', shape: [1033, 64], role: 'matmul' };
    expect(lmHeadCandidates([head], 'w4', []).map((c) => [c.label, c.addedBytes])).toEqual([['lm-head lm_head w4→w8', storedBytes(head, 'w8') - storedBytes(head, 'w4')]]);
    const [c] = lmHeadCandidates([head], 'w8', []);
    expect(new PrecisionChooser(c.overrides).choose('lm_head.weight', 'w8').scheme).toBe('fp16');
    // Pinned at fp16 (or an fp16 lm-head): fp32 next; at fp32 already: nothing to promote.
    expect(lmHeadCandidates([head], 'w4', [{ match: 'lm_head\\.weight', quant: 'fp16' }]).map((c) => c.label)).toEqual(['lm-head lm_head fp16→fp32']);
    expect(lmHeadCandidates([head], 'fp16', []).map((c) => c.addedBytes)).toEqual([storedBytes(head, 'fp32') - storedBytes(head, 'fp16')]);
    expect(lmHeadCandidates([head], 'w4', [{ match: 'lm_head\\.weight', quant: 'fp32' }])).toEqual([]);
    expect(lmHeadCandidates([head], 'fp32', [])).toEqual([]);
  });
});
