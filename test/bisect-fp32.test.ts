// forge bisect's top rung, fp16 → fp32: a weight fp16 cannot hold. The tiny-qwen3 twin with layer 2
// rewritten by test/helpers/w4-hostile.ts at a scale of 2^20 (every 32nd MLP and value channel moved
// between its two matrices: the same function, exactly, in bf16 and in float32) shipped at fp16:
// down_proj and o_proj then hold entries past 65504 (Inf as fp16) and up_proj and v_proj entries under
// fp16's smallest subnormal (0 as fp16). No single matrix at fp32 restores the gate; the whole layer does.
import { describe, it, expect, beforeAll } from 'vitest';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { forge, lastJson } from './helpers/forge-cli.js';
import { makeW4Hostile } from './helpers/w4-hostile.js';
import { recipeSandbox, writeRecipeVariant } from './helpers/recipe-sandbox.js';
import { twinDir } from './helpers/twin.js';
import type { BisectResult } from '../src/bisect/run.js';

const LAYER = 2;
let work: string;
let recipes: string;
beforeAll(() => void ({ work, recipes } = recipeSandbox('forge-bisect-fp32-')));

describe('forge bisect, fp16 → fp32', () => {
  it('finds the layer whose weights fp16 cannot hold and puts it at fp32', async () => {
    const hostile = join(work, 'fp16-range-hostile');
    await makeW4Hostile(await twinDir('qwen3'), hostile, LAYER, 2 ** 20);
    const id = 'tiny-qwen3-fp16-range';
    const recipeFile = writeRecipeVariant(recipes, 'tiny-qwen3', id, (r) => {
      r.source = { kind: 'local', path: hostile };
      r.arch.default.quant = 'fp16';
    });

    const run = await forge(['bisect', id, '--arch', 'v81', '--apply', '--json', '--out', join(work, 'bisect')], { FORGE_RECIPES: recipes });
    expect(run.code, run.stderr).toBe(0);
    const b = lastJson(run.stdout) as BisectResult;
    expect(b.fault).toMatchObject({ link: 'quantization', variant: 'quantize:fp16' });
    expect(b.fault!.nonFinite).toBeDefined();
    expect(b.layers.every((l) => l.fp32! >= b.thresholds.fp32)).toBe(true);
    expect(b.layer).toBe(LAYER);
    expect(b.verdict).toBe('fixed');
    // Each single matrix at fp32 leaves another that fp16 breaks: the whole layer is the fix.
    const singles = b.trials.filter((t) => t.tensors.length === 1);
    expect(singles.length).toBeGreaterThan(0);
    expect(singles.every((t) => !t.ok && t.tensors[0].from === 'fp16' && t.tensors[0].to === 'fp32')).toBe(true);
    expect(b.chosen).toMatchObject({ label: `layer ${LAYER} whole (7 matrices)`, ok: true });
    expect(b.chosen!.tensors.every((t) => t.from === 'fp16' && t.to === 'fp32' && t.name.startsWith(`model.layers.${LAYER}.`))).toBe(true);
    console.log(`[measured] bisect on the fp16-range-hostile twin: ${b.fault!.graph} layer ${b.fault!.layer} ${b.fault!.output} ${b.fault!.nonFinite}; ${b.trials.map((t) => `${t.label} ${t.ok ? 'ok' : 'no'} ${t.minCosine?.toFixed(5)} +${t.addedBytes} B`).join('; ')}; ${b.seconds.toFixed(1)} s`);

    // --apply wrote it; the plain build passes the oracle gate.
    expect(JSON.parse(readFileSync(recipeFile, 'utf8')).arch.default.overrides[0]).toEqual(b.chosen!.overrides[0]);
    const rebuilt = await forge(['build', id, '--arch', 'v81', '--until', 'oracle', '--json', '--out', join(work, 'rebuilt')], { FORGE_RECIPES: recipes });
    expect(lastJson(rebuilt.stdout).gates.oracle.ok, rebuilt.stderr).toBe(true);
  }, 900_000);
});
