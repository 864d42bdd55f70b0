// A valid v2 manifest of the shape forge writes for a dense decoder: the seed the schema tests and
// the schema fuzz mutate.
const sha = (c: string) => c.repeat(64);
const tensor = (name: string, dtype: string, shape: number[], bind: string, extra: object = {}) => ({ name, dtype, shape, bind, ...extra });
const quant = { weights: 'fp32', activations: 'float32' };

/** One decoder layer (hidden 4, vocab 8, 4 cache slots) and a separate lm-head: the shape of a real manifest. */
export const SEED = {
  format: 'forge-bundle',
  version: 2,
  recipe: 'fuzz',
  arch: { id: 'v81', socModel: 87, dspArch: 'v81' },
  hostOp: 'decoder_generate',
  model: { family: 'qwen3', layers: 1, hidden: 4, vocab: 8 },
  contexts: [
    {
      name: 'shard0',
      files: [{ path: 'shard0.bin', sha256: sha('a'), bytes: 64 }],
      graphs: [{
        name: 'shard0.decode', component: 'shard0', role: 'decode', tokens: 1, file: 'shard0.decode.onnx', sha256: sha('b'), layers: [0, 0], quant,
        inputs: [
          tensor('h', 'float32', [1, 1, 4], 'residual'), tensor('pos', 'int32', [1], 'positions'), tensor('mask', 'float32', [1, 1, 1, 5], 'mask'),
          tensor('past_k', 'float32', [1, 1, 4, 2], 'state', { state: 'kv.0.k' }), tensor('past_v', 'float32', [1, 1, 4, 2], 'state', { state: 'kv.0.v' }),
        ],
        outputs: [
          tensor('h_out', 'float32', [1, 1, 4], 'residual'),
          tensor('new_k', 'float32', [1, 1, 1, 2], 'state-rows', { state: 'kv.0.k', axis: 2 }),
          tensor('new_v', 'float32', [1, 1, 1, 2], 'state-rows', { state: 'kv.0.v', axis: 2 }),
        ],
      }],
    },
    {
      name: 'lm_head',
      files: [],
      graphs: [{
        name: 'lm_head', component: 'lm_head', role: 'lm_head', tokens: 1, qnn: { wrapper: 'lm_head_ctx.onnx', sha256: sha('c'), binary: 'lm_head.bin' }, quant,
        inputs: [tensor('h', 'float32', [1, 1, 4], 'residual')],
        outputs: [tensor('logits', 'float32', [1, 1, 8], 'logits')],
      }],
    },
  ],
  state: ['kv.0.k', 'kv.0.v'].map((name) => ({ name, kind: 'kv-cache', dtype: 'float32', shape: [1, 1, 4, 2], positionAxis: 2 })),
  hostTables: [{ name: 'embedding', use: 'embedding', file: 'embedding.f16.bin', sha256: sha('d'), dtype: 'float16', shape: [8, 4] }],
  mask: { masked: -1e9, layout: 'past-then-new' },
  tokenizer: { file: 'tokenizer.json', sha256: sha('e'), config: 'tokenizer_config.json', bos: null, eos: [7], chatTemplate: null, chat: null },
  limits: { maxContext: 4 },
  generation: { maxNewTokens: 2, greedy: true },
};
