// Name scopes beyond the Qwen3 family: gemma4's, phimoe's and qwen3_5's graphs name their ops as qwen3's do
// (`layers.3/self_attn.q_norm/Mul`, `layers.3/self_attn.q_proj/…`), which is what forge bisect's
// op probes read (probe.ts: scope and layer from the node name) and what recipe `rescale` lines
// match (rmsNorm asks the builder for its scope's rule). Graphs built from the twins' configs with a
// store that makes one node per weight read, under the scope it is read in.
import { describe, it, expect } from 'vitest';
import { readFileSync } from 'node:fs';
import { gemma4, parseGemma4Config } from '../src/families/gemma4.js';
import { parsePhimoeConfig, phimoe } from '../src/families/phimoe.js';
import { parseQwen35Config, qwen3_5 } from '../src/families/qwen3_5.js';
import { GraphBuilder } from '../src/onnx/index.js';
import { layerOf, scopeOf } from '../src/bisect/probe.js';

// The twins' config.json as oracles/make_twin.py writes them (copied from a made twin): no twin is made here.
const twinConfig = (family: string) => JSON.parse(readFileSync(`test/fixtures/twin-configs/${family}.json`, 'utf8'));

/** A store whose every read is one named node (Identity on a linear's input, a zero initializer for a small weight). */
const store = {
  linear: async (g: GraphBuilder, x: string) => g.op('Identity', [x]),
  small: async (g: GraphBuilder, name: string, shape: number[]) => g.initializer(name.replace(/\W/g, '_'), new Float32Array(shape.reduce((a, b) => a * b, 1)), shape, 'float32'),
};
const nodeNames = (g: GraphBuilder) => (g.toModelProto().graph!.node ?? []).map((n) => n.name!);

describe('op name scopes', () => {
  it('gemma4: every layer op under layers.i, the norms and projections under their module names', async () => {
    const c = parseGemma4Config(twinConfig('gemma4'), 'gemma4.json');
    const [shard] = gemma4.components(c, { shards: [{ first: 3, last: 4, isLast: false }], lmHeadInside: false, prefillLength: 0, maxContext: 32 });
    const g = new GraphBuilder('shard');
    await shard.variants[0].build(g, { store: store as any, scheme: 'fp32', lmHeadScheme: 'fp32' });
    const names = nodeNames(g);
    const scopes = new Set(names.map(scopeOf));
    for (const m of ['input_layernorm', 'self_attn.q_proj', 'self_attn.q_norm', 'self_attn.k_norm', 'self_attn.v_norm', 'self_attn.o_proj', 'post_attention_layernorm', 'mlp.down_proj', 'post_feedforward_layernorm', 'per_layer_input_gate', 'post_per_layer_input_norm']) {
      expect(scopes, m).toContain(`layers.3/${m}`);
    }
    expect(names.filter((n) => n.startsWith('layers.3/self_attn.q_norm/')).length).toBeGreaterThan(3); // the RMSNorm's own ops
    expect(layerOf(names.find((n) => n.startsWith('layers.4/mlp.up_proj/'))!)).toBe(4);
    // The layers' attention, residual adds and layer scalar too.
    expect(names.filter((n) => /^layers\.\d\/(Add|Mul)/.test(n)).length).toBeGreaterThan(0);
    // The per-layer inputs: the shard's rows of the projection, then each layer's norm and mix.
    expect(scopes).toContain('per_layer_model_projection');
    for (const i of [3, 4]) expect(scopes).toContain(`per_layer_inputs.${i}/per_layer_projection_norm`);
    // The last shard's final norm as decoder.ts names it.
    const [last] = gemma4.components(c, { shards: [{ first: 7, last: 7, isLast: true }], lmHeadInside: false, prefillLength: 0, maxContext: 32 });
    const gl = new GraphBuilder('last');
    await last.variants[0].build(gl, { store: store as any, scheme: 'fp32', lmHeadScheme: 'fp32' });
    expect(new Set(nodeNames(gl).map(scopeOf))).toContain('final_norm');
  });

  it('qwen3_5: every layer op under layers.i, linear attention (projections, conv, delta rule, gated norm) and full attention under their module names, decode and prefill', async () => {
    const c = parseQwen35Config(twinConfig('qwen3_5'), 'qwen3_5.json');
    // Layers 2 (linear attention) and 3 (full), as the twin's layer_types say.
    expect([c.layerTypes[2], c.layerTypes[3]]).toEqual(['linear_attention', 'full_attention']);
    const [shard] = qwen3_5.components(c, { shards: [{ first: 2, last: 3, isLast: true }], lmHeadInside: false, prefillLength: 4, maxContext: 32 });
    expect(shard.variants.map((v) => v.name)).toEqual(['prefill', 'decode']);
    for (const v of shard.variants) {
      const g = new GraphBuilder(v.name);
      await v.build(g, { store: store as any, scheme: 'fp32', lmHeadScheme: 'fp32' });
      const names = nodeNames(g);
      const scopes = new Set(names.map(scopeOf));
      for (const m of ['input_layernorm', 'linear_attn.in_proj_qkv', 'linear_attn.in_proj_z', 'linear_attn.in_proj_b', 'linear_attn.in_proj_a', 'linear_attn.conv1d', 'linear_attn.delta_rule', 'linear_attn.norm', 'linear_attn.out_proj', 'post_attention_layernorm', 'mlp.down_proj']) {
        expect(scopes, `${v.name} ${m}`).toContain(`layers.2/${m}`);
      }
      for (const m of ['self_attn.q_proj', 'self_attn.q_norm', 'self_attn.k_norm', 'self_attn.o_proj', 'mlp.up_proj']) expect(scopes, `${v.name} ${m}`).toContain(`layers.3/${m}`);
      expect(layerOf(names.find((n) => n.startsWith('layers.2/linear_attn.delta_rule/'))!)).toBe(2);
      expect(scopes).toContain('final_norm');
      // Outside a layer only what the shard computes once for all of them: the RoPE rows, the real-row mask.
      expect(names.filter((n) => !/^(layers\.[23]|final_norm)\//.test(n)).every((n) => !/MatMul|Conv|Softmax/.test(n))).toBe(true);
    }
  });

  it('phimoe: the attention+router graph of layer l under layers.l, its norms, projections and router under their module names', async () => {
    const c = parsePhimoeConfig(twinConfig('phimoe'), 'phimoe.json');
    const comps = phimoe.components(c, { shards: [{ first: 0, last: 1, isLast: false }], lmHeadInside: false, prefillLength: 0, maxContext: 16 });
    const layer1 = comps.flatMap((x) => x.variants).find((v) => v.entry?.first === 1)!;
    const g = new GraphBuilder('layer1');
    await layer1.build(g, { store: store as any, scheme: 'fp32', lmHeadScheme: 'fp32' });
    const names = nodeNames(g);
    const scopes = new Set(names.map(scopeOf));
    for (const m of ['input_layernorm', 'self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj', 'self_attn.o_proj', 'post_attention_layernorm', 'block_sparse_moe.gate']) expect(scopes, m).toContain(`layers.1/${m}`);
    expect(names.every((n) => n.startsWith('layers.1/')), names.filter((n) => !n.startsWith('layers.1/')).join(', ')).toBe(true);
    const head = comps.find((x) => x.kind === 'lm_head')!.variants[0];
    const gh = new GraphBuilder('lm_head');
    await head.build(gh, { store: store as any, scheme: 'fp32', lmHeadScheme: 'fp32' });
    expect(new Set(nodeNames(gh).map(scopeOf))).toContain('final_norm');
  });
});
