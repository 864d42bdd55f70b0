// bench/decode-bytes.ts counts what a decode step moves besides the weights from the families' own
// graph interfaces and bindings (bench/decode-traffic.ts). Checked here against figures worked out by
// hand from the tiny twins' configs (oracles/make_twin.py; gemma4 and phimoe as their config.json
// fixtures): KV caches (rings, shared donors), recurrent state, host rows (PLE, experts), masks, I/O.
import { describe, it, expect } from 'vitest';
import { readFileSync } from 'node:fs';
import { qwen3 } from '../src/families/qwen3.js';
import { qwen3_5 } from '../src/families/qwen3_5.js';
import { gemma4 } from '../src/families/gemma4.js';
import { phimoe } from '../src/families/phimoe.js';
import type { Family } from '../src/families/types.js';
import {
  AS_BUILT, cacheSlotsRead, decodeGraphs, embeddingTable, familyTables, kvLayerBytes, recurrentLayerBytes, stepIo, type StateForm,
} from '../src/bundle/decode-traffic.js';
import { qdqW8Bytes } from '../bench/hand-made.js';

const twinConfig = (family: string) => JSON.parse(readFileSync(`test/fixtures/twin-configs/${family}.json`, 'utf8'));
const F16_FILLED: StateForm = { bytes: 2, cacheRead: 'filled' };

// The qwen3 and qwen3.5 twins' dimensions (make_twin.py cfg_qwen3, cfg_qwen3_5), vocab 1000.
const QWEN3_TWIN = {
  model_type: 'qwen3', hidden_size: 64, intermediate_size: 128, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2,
  head_dim: 32, vocab_size: 1000, rms_norm_eps: 1e-6, max_position_embeddings: 4096, tie_word_embeddings: true,
  rope_parameters: { rope_type: 'default', rope_theta: 1e6 },
};
const QWEN35_TWIN = {
  model_type: 'qwen3_5', tie_word_embeddings: true,
  text_config: {
    hidden_size: 64, intermediate_size: 128, num_hidden_layers: 8, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 32,
    vocab_size: 1000, rms_norm_eps: 1e-6, max_position_embeddings: 4096, linear_conv_kernel_dim: 4, linear_num_key_heads: 2,
    linear_num_value_heads: 4, linear_key_head_dim: 16, linear_value_head_dim: 32,
    rope_parameters: { rope_type: 'default', rope_theta: 1e7, partial_rotary_factor: 0.25 },
  },
};

async function io<C>(family: Family<C>, raw: unknown, shards: Array<[number, number]>, maxContext: number, position: number, form: StateForm) {
  const config = family.parseConfig(raw, 'twin config.json');
  const layout = { shards: shards.map(([first, last], i) => ({ first, last, isLast: i === shards.length - 1 })), lmHeadInside: false, prefillLength: 8, maxContext };
  const graphs = await decodeGraphs(family, config, layout, 'w8');
  return { graphs, io: stepIo(graphs, familyTables(family, config, 'w8'), embeddingTable(family, config), position, form) };
}

describe('per-layer state bytes', () => {
  it('a KV cache: whole in float32 as built, as far as filled in f16 projected; a ring stops at its window', () => {
    // qwen3 twin: 2 KV heads × head_dim 32, 256 slots; K and V.
    expect(kvLayerBytes({ kvHeads: 2, headDim: 32, slots: 256 }, 10, AS_BUILT)).toEqual({ read: 2 * 2 * 32 * 256 * 4, write: 2 * 2 * 32 * 4 });
    expect(kvLayerBytes({ kvHeads: 2, headDim: 32, slots: 256 }, 10, F16_FILLED)).toEqual({ read: 2 * 2 * 32 * 10 * 2, write: 2 * 2 * 32 * 2 });
    // gemma4 twin's sliding ring of 16 slots, past its window: 16 slots, not 100.
    expect(cacheSlotsRead(16, 100, F16_FILLED)).toBe(16);
    expect(cacheSlotsRead(16, 100, AS_BUILT)).toBe(16);
    expect(cacheSlotsRead(256, 100, AS_BUILT)).toBe(256);
  });

  it('a Qwen3.5 linear-attention layer: conv FIFO and delta-rule state, whole', () => {
    // qwen3.5 twin: conv channels 2·(2 k heads × 16) + 4 v heads × 32 = 192, kernel 4; state 4 × 16 × 32.
    const l = { convDim: 192, convKernel: 4, vHeads: 4, kDim: 16, vDim: 32 };
    expect(recurrentLayerBytes(l, AS_BUILT)).toBe((192 * 4 + 4 * 16 * 32) * 4); // 11,264
    expect(recurrentLayerBytes(l, F16_FILLED)).toBe(5632);
  });

  it('a hand-made W8 matrix: int8 codes and one float32 scale a row, a row range its rows only', () => {
    expect(qdqW8Bytes({ name: 'w', shape: [10, 64], role: 'matmul' })).toBe(640 + 40);
    expect(qdqW8Bytes({ name: 'w', shape: [10, 64], role: 'matmul', rows: [2, 5] })).toBe(3 * 64 + 3 * 4);
    expect(qdqW8Bytes({ name: 'n', shape: [64], role: 'small' })).toBe(256);
  });
});

describe('a decode step, from the graphs and bindings of the twins', () => {
  it('qwen3: every layer reads its whole float32 cache and writes one row', async () => {
    const { io: r } = await io(qwen3, QWEN3_TWIN, [[0, 1], [2, 3]], 256, 10, AS_BUILT);
    expect(r).toEqual({
      kvRead: 4 * 2 * (2 * 256 * 32 * 4), kvWrite: 4 * 2 * (2 * 32 * 4),
      stateRead: 0, stateWrite: 0,
      hostRows: 64 * 2, hostRowsByTable: { embedding: 128 }, // the token's f16 embedding row
      masks: 2 * 257 * 4, // one [1,1,1,256+1] mask a shard
      graphIn: 2 * (64 * 4 + 4) + 64 * 4, // hidden_in and position a shard, the lm-head's hidden
      graphOut: 2 * 64 * 4 + 1000 * 4, // hidden_out a shard, logits
    });
    const { io: p } = await io(qwen3, QWEN3_TWIN, [[0, 1], [2, 3]], 256, 10, F16_FILLED);
    expect([p.kvRead, p.kvWrite, p.masks]).toEqual([4 * 2 * (2 * 10 * 32 * 2), 4 * 2 * (2 * 32 * 2), 2 * 11 * 4]);
  });

  it('qwen3.5: full layers read caches, linear layers read and write their conv and delta-rule states', async () => {
    const { io: r } = await io(qwen3_5, QWEN35_TWIN, [[0, 2], [3, 7]], 256, 10, AS_BUILT);
    expect(r).toEqual({
      kvRead: 2 * 2 * (2 * 256 * 32 * 4), kvWrite: 2 * 2 * (2 * 32 * 4), // full layers 3 and 7
      stateRead: 6 * 11264, stateWrite: 6 * 11264, // linear layers 0-2, 4-6
      hostRows: 128, hostRowsByTable: { embedding: 128 },
      masks: 257 * 4, // shard 0 holds no full layer: no mask, no position
      graphIn: 2 * 64 * 4 + 4 + 64 * 4,
      graphOut: 2 * 64 * 4 + 1000 * 4,
    });
    const { io: p } = await io(qwen3_5, QWEN35_TWIN, [[0, 2], [3, 7]], 256, 10, F16_FILLED);
    expect([p.kvRead, p.stateRead, p.stateWrite]).toEqual([2 * 2 * (2 * 10 * 32 * 2), 6 * 5632, 6 * 5632]);
  });

  it('gemma4: sliding rings of the window, a shared donor re-read by the shard without it, PLE rows once a step', async () => {
    // Layers S S F S S F S F; 5 (F) and 7 (F) share layer 2's K/V, 6 (S) layer 4's. Shard 0 = 0-2,
    // shard 1 = 3-7 (the tiny-gemma4 recipe): shard 1 reads its own 3, 4 and donor 2's cache.
    // One sliding cache: 2 heads × 23 slots × 32 (a ring of the 16-token window plus 8 - 1 for the
    // layout's 8-token prefill: a prefill call never overwrites a position its rows still see).
    const ring = 2 * 23 * 32 * 4;
    const full = 2 * 256 * 64 * 4; // one full cache: 2 heads × 256 slots × 64
    const { io: r } = await io(gemma4, twinConfig('gemma4'), [[0, 2], [3, 7]], 256, 10, AS_BUILT);
    expect(r).toEqual({
      kvRead: (2 * (2 * ring) + 2 * full) + (2 * (2 * ring) + 2 * full),
      kvWrite: 4 * 2 * (2 * 32 * 4) + 2 * (2 * 64 * 4), // layers 0, 1, 3, 4 and 2 compute K/V
      stateRead: 0, stateWrite: 0,
      hostRows: 64 * 2 + 8 * 16 * 2, hostRowsByTable: { embedding: 128, per_layer_embedding: 256 },
      masks: 2 * (257 * 4 + 24 * 4), // the full mask and the ring's, a shard
      // hidden_in, position and the float32 copies of the embedding and PLE rows a shard; the lm-head's hidden.
      graphIn: (64 * 4 + 4 + 64 * 4 + 3 * 16 * 4) + (64 * 4 + 4 + 64 * 4 + 5 * 16 * 4) + 64 * 4,
      graphOut: 2 * 64 * 4 + 1024 * 4,
    });
    // Projected at position 100: a ring reads its 23 slots, a full cache 100.
    const { io: p } = await io(gemma4, twinConfig('gemma4'), [[0, 2], [3, 7]], 256, 100, F16_FILLED);
    const ringF16 = 2 * 23 * 32 * 2;
    const fullF16 = 2 * 100 * 64 * 2;
    expect(p.kvRead).toBe(2 * (4 * ringF16 + 2 * fullF16));
    expect(p.masks).toBe(2 * (101 * 4 + 24 * 4));
  });

  it('phimoe: the experts graph runs once a layer, fed the two selected experts\' int8 rows and scales', async () => {
    const { graphs, io: r } = await io(phimoe, twinConfig('phimoe'), [[0, 3]], 256, 10, AS_BUILT);
    expect(graphs.map((g) => [g.name, g.runs])).toEqual([['shard0.layer0', 1], ['shard0.layer1', 1], ['shard0.layer2', 1], ['shard0.layer3', 1], ['experts', 4], ['lm_head', 1]]);
    // Per layer and slot: gate/up rows 2·32 × 64 int8 and their 64 float32 scales, down rows 64 × 32 and 64 scales.
    const slot = { gateUp: 2 * 32 * 64, gateUpScale: 64 * 4, down: 64 * 32, downScale: 64 * 4 };
    expect(r).toEqual({
      kvRead: 4 * 2 * (2 * 256 * 32 * 4), kvWrite: 4 * 2 * (2 * 32 * 4),
      stateRead: 0, stateWrite: 0,
      hostRows: 128 + 4 * 2 * (slot.gateUp + slot.gateUpScale + slot.down + slot.downScale),
      hostRowsByTable: {
        embedding: 128,
        'experts.gate_up': 4 * 2 * slot.gateUp, 'experts.gate_up.scale': 4 * 2 * slot.gateUpScale,
        'experts.down': 4 * 2 * slot.down, 'experts.down.scale': 4 * 2 * slot.downScale,
      },
      masks: 4 * 257 * 4,
      // per layer: hidden_in and position in; attn_res, moe_in and routing weights into the experts; the lm-head's hidden.
      graphIn: 4 * (64 * 4 + 4) + 4 * (64 * 4 + 64 * 4 + 2 * 4) + 64 * 4,
      // per layer: attn_res, moe_in and 4 router logits out, then the experts' hidden_out; logits.
      graphOut: 4 * (64 * 4 + 64 * 4 + 4 * 4) + 4 * 64 * 4 + 1029 * 4,
    });
  });
});
