import { describe, it, expect } from 'vitest';
import { PrecisionChooser } from '../../src/quant/precision.js';
import { ArchSettingsPatchSchema, ArchSettingsSchema, GateSettingsSchema, shippedMinCosine } from '../../src/recipe/schema.js';
import { makePlan, PlanError } from '../../src/plan/shards.js';
import { qwen3, parseQwen3Config } from '../../src/families/qwen3.js';
import { getArch } from '../../src/arch/table.js';
import { archSettings, loadRecipe } from '../../src/recipe/load.js';

const { recipe } = loadRecipe('qwen3-4b');
const config = parseQwen3Config(recipe.config, 'qwen3-4b');
const settings = (over: object = {}) => ArchSettingsSchema.parse({ ...archSettings(recipe, 'v81').settings, ...over });

describe('per-matrix precision (recipe overrides, the auto map)', () => {
  it('takes the first override whose pattern matches the whole tensor name, then the auto map, then the scheme', () => {
    const c = new PrecisionChooser(
      [{ match: 'model\\.layers\\.3\\..*', quant: 'w8', why: 'outliers' }, { match: 'model\\.layers\\.\\d+\\.mlp\\.down_proj\\.weight', quant: 'fp16' }],
      { 'model.layers.5.mlp.up_proj.weight': { scheme: 'w8', why: 'auto: promoted' } },
    );
    expect(c.choose('model.layers.3.mlp.down_proj.weight', 'w4')).toEqual({ scheme: 'w8', why: 'recipe override "model\\\\.layers\\\\.3\\\\..*": outliers' });
    expect(c.choose('model.layers.4.mlp.down_proj.weight', 'w4').scheme).toBe('fp16');
    expect(c.choose('model.layers.5.mlp.up_proj.weight', 'w4')).toEqual({ scheme: 'w8', why: 'auto: promoted' });
    expect(c.choose('model.layers.5.mlp.gate_proj.weight', 'w4')).toEqual({ scheme: 'w4' });
    // Whole-name match: a prefix of the name is not a match.
    expect(new PrecisionChooser([{ match: 'model\\.layers\\.3', quant: 'w8' }]).choose('model.layers.3.mlp.up_proj.weight', 'w4')).toEqual({ scheme: 'w4' });
  });

  it('gives a pinned matrix the override\'s precision and why whatever the scheme (its form, e.g. a padding, is the store\'s)', () => {
    const c = new PrecisionChooser([{ match: '.*o_proj.*', quant: 'w4' }]);
    expect(c.choose('model.layers.0.self_attn.o_proj.weight', 'w8')).toEqual({ scheme: 'w4', why: 'recipe override ".*o_proj.*"' });
    expect(c.choose('model.layers.0.self_attn.q_proj.weight', 'w8')).toEqual({ scheme: 'w8' });
  });

  it('names the overrides that matched nothing', () => {
    const c = new PrecisionChooser([{ match: 'model\\.layers\\.0\\..*', quant: 'w8' }, { match: 'model\\.layer\\.0\\..*', quant: 'w8' }]);
    c.choose('model.layers.0.mlp.up_proj.weight', 'w4');
    expect(c.unused().map((o) => o.match)).toEqual(['model\\.layer\\.0\\..*']);
  });
});

describe('recipe: quant auto and overrides', () => {
  it("accepts 'auto' for the layers and for the lm-head, and names the field of a scheme it does not know", () => {
    expect(ArchSettingsPatchSchema.parse({ quant: 'auto' }).quant).toBe('auto');
    expect(ArchSettingsPatchSchema.parse({ lmHead: { placement: 'separate', quant: 'auto' } }).lmHead!.quant).toBe('auto');
    const r = ArchSettingsPatchSchema.safeParse({ lmHead: { placement: 'separate', quant: 'w3' } });
    expect(r.success).toBe(false);
    expect(r.error!.issues[0].path).toEqual(['lmHead', 'quant']);
  });

  it('refuses an override pattern that is not a regular expression, naming the field', () => {
    const r = ArchSettingsPatchSchema.safeParse({ overrides: [{ match: 'model.layers.(3', quant: 'w8' }] });
    expect(r.success).toBe(false);
    expect(r.error!.issues[0].path).toEqual(['overrides', 0, 'match']);
    expect(r.error!.issues[0].message).toMatch(/not a regular expression/);
    expect(ArchSettingsPatchSchema.safeParse({ overrides: [{ match: '.*', quant: 'w2' }] }).success).toBe(false);
  });

  it('holds auto graphs to the w4 bound at the oracle gate, and each layer alone to autoMinCosine (default 0.97)', () => {
    const g = GateSettingsSchema.parse({ prompts: ['x'] });
    expect(g.oracle.autoMinCosine).toBe(0.97);
    expect(shippedMinCosine(g.oracle, 'auto')).toBe(g.oracle.w4MinCosine);
  });
});

describe('plan with overrides and a precision map', () => {
  it('counts each matrix in its own precision: a layer pinned to w8 weighs more than its w4 neighbours', async () => {
    const v81 = getArch('v81');
    const w4 = await makePlan(qwen3, config, v81, settings({ quant: 'w4', shards: [[0, 0], [1, 17], [18, 35]] }));
    const pinned = await makePlan(qwen3, config, v81, settings({ quant: 'w4', shards: [[0, 0], [1, 17], [18, 35]], overrides: [{ match: 'model\\.layers\\.0\\..*', quant: 'w8' }] }));
    expect(pinned.shards[1].weightBytes).toBe(w4.shards[1].weightBytes);
    expect(pinned.shards[0].weightBytes / w4.shards[0].weightBytes).toBeGreaterThan(1.6);
    const auto = await makePlan(qwen3, config, v81, settings({ quant: 'auto', shards: [[0, 0], [1, 17], [18, 35]] }), undefined, {
      'model.layers.0.mlp.down_proj.weight': { scheme: 'w8', why: 'auto' },
    });
    expect(auto.shards[0].weightBytes).toBeGreaterThan(w4.shards[0].weightBytes);
    expect(auto.shards[0].weightBytes).toBeLessThan(pinned.shards[0].weightBytes);
  });

  it('refuses an override that matches no matmul weight of the model (a typo pins nothing)', async () => {
    const p = makePlan(qwen3, config, getArch('v81'), settings({ overrides: [{ match: 'model\\.layer\\.3\\..*', quant: 'w8' }] }));
    await expect(p).rejects.toThrow(PlanError);
    await expect(p).rejects.toThrow(/overrides "model\\\\.layer\\\\.3\\\\..\*" match no matmul weight/);
  });
});
