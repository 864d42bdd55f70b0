// Fuzz: the TS manifest contract (ManifestSchema, which every manifest forge writes is checked
// against) with 10,000 seeded mutations of a valid manifest. forge has no TS reader of a bundle's
// manifest.json (the runtime's loader, fuzzed in native/test/test_fuzz.cpp, is the reader), so the
// property here is the schema's own: it answers every input (never throws, never hangs), each
// refusal carries a field path and a message, and what it accepts survives a JSON round trip.
import { describe, expect, it } from 'vitest';
import { ManifestSchema } from '../../src/bundle/manifest.js';
import { FUZZ_CASES, FUZZ_SEED, mutateJsonText, Rng, show } from './mutate.js';

const sha = (c: string) => c.repeat(64);
const tensor = (name: string, dtype: string, shape: number[], bind: string, extra: object = {}) => ({ name, dtype, shape, bind, ...extra });
const quant = { weights: 'fp32', activations: 'float32' };

/** One decoder layer (hidden 4, vocab 8, 4 cache slots) and a separate lm-head: the shape of a real manifest. */
const SEED = {
  format: 'forge-bundle',
  version: 1,
  recipe: 'fuzz',
  arch: { id: 'v81', socModel: 87, dspArch: 'v81' },
  hostOp: 'decoder_generate',
  model: { family: 'qwen3', layers: 1, hidden: 4, vocab: 8 },
  contexts: [
    {
      name: 'shard0',
      files: [{ path: 'shard0.bin', sha256: sha('a'), bytes: 64 }],
      graphs: [{
        name: 'shard0.decode', role: 'decode', tokens: 1, file: 'shard0.decode.onnx', sha256: sha('b'), layers: [0, 0], quant,
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
        name: 'lm_head', role: 'lm_head', tokens: 1, qnn: { wrapper: 'lm_head_ctx.onnx', sha256: sha('c'), binary: 'lm_head.bin' }, quant,
        inputs: [tensor('h', 'float32', [1, 1, 4], 'residual')],
        outputs: [tensor('logits', 'float32', [1, 1, 8], 'logits')],
      }],
    },
  ],
  state: ['kv.0.k', 'kv.0.v'].map((name) => ({ name, kind: 'kv-cache', dtype: 'float32', shape: [1, 1, 4, 2], positionAxis: 2 })),
  hostTables: [{ name: 'embedding', file: 'embedding.f16.bin', sha256: sha('d'), dtype: 'float16', shape: [8, 4] }],
  mask: { masked: -1e9, layout: 'past-then-new' },
  tokenizer: { file: 'tokenizer.json', sha256: sha('e'), config: 'tokenizer_config.json', bos: null, eos: [7], chatTemplate: null },
  limits: { maxContext: 4 },
  generation: { maxNewTokens: 2, greedy: true },
};

describe('fuzz: manifest schema (TS)', () => {
  it('accepts the seed manifest', () => {
    expect(ManifestSchema.safeParse(SEED).success).toBe(true);
  });

  it(`answers every mutated manifest without throwing; refusals name a field, acceptances round-trip (${FUZZ_CASES} cases)`, () => {
    const rng = new Rng(FUZZ_SEED);
    let refused = 0;
    for (let i = 0; i < FUZZ_CASES; i++) {
      const text = mutateJsonText(rng, SEED).toString('utf8');
      let doc: unknown;
      try {
        doc = JSON.parse(text);
      } catch {
        continue; // damaged text: JSON.parse's business, before any schema
      }
      const where = () => `seed ${FUZZ_SEED}, case ${i}: ${show(text)}`;
      let r: ReturnType<typeof ManifestSchema.safeParse>;
      try {
        r = ManifestSchema.safeParse(doc);
      } catch (err) {
        expect.fail(`${where()}: the schema threw ${(err as Error).stack}`);
      }
      if (r.success) {
        expect(JSON.parse(JSON.stringify(r.data)), where()).toEqual(r.data);
      } else {
        refused++;
        const issue = r.error.issues[0];
        // zod's own message may quote an odd key verbatim; what a caller reports by is the path.
        expect(Array.isArray(issue.path) && issue.message.length > 0, `${where()}: ${JSON.stringify(issue)}`).toBe(true);
      }
    }
    console.log(`fuzz manifest schema: ${FUZZ_CASES} cases, ${refused} refused, seed ${FUZZ_SEED}`);
    expect(refused).toBeGreaterThan(FUZZ_CASES / 2);
  });
});
