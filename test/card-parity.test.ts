// The model card's parity lines: each variant's N/N under teacher forcing, its ties with the bound,
// every listed mismatch with HF's margin, the rule, and the recipe's reason when it allows ties;
// and its run command (--chat where the model has a chat template).
import { describe, expect, it } from 'vitest';
import { modelCard, type CardFacts, type ParityFacts } from '../src/bundle/card.js';
import { getArch } from '../src/arch/table.js';
import { precisionRows } from '../src/bundle/precision-map.js';

const timings = { load_ms: 1, prefill_ms: 1, decode_ms_per_token: 1, host_overhead_ms_per_token: 0 };
const RULE = 'every step teacher-forced on HF\'s greedy token (…); at most 0 ties per variant';

function facts(parity: ParityFacts, emulation?: CardFacts['emulation']): CardFacts {
  const manifest = {
    hostOp: 'decoder_generate', limits: { maxContext: 128 }, generation: { maxNewTokens: 8 },
    contexts: [{ graphs: [{ quant: { weights: 'w8' } }] }], hostTables: [], tokenizer: { file: 'tokenizer.json' },
  };
  return {
    recipe: { id: 'x', family: 'qwen3', source: { kind: 'tiny', twin: 'qwen3' }, card: { title: 'X', license: 'apache-2.0', caveats: [] } as CardFacts['recipe']['card'] } as CardFacts['recipe'],
    arch: getArch('v81'), manifest: manifest as unknown as CardFacts['manifest'], compiled: [],
    oracle: { ok: true, rows: [], graphs: {}, logitError: { export: 1e-6, quantize: 0.02 }, logitChain: {} },
    parity, tools: {}, ...(emulation ? { emulation } : {}), planDropped: [],
    confidence: { margins: { count: 1, min: 1, p5: 1, p50: 1, max: 1, fp16_spacing: 2 ** -8, below_fp16_spacing: 0, below_0_1: 0, smallest: { prompt: 0, step: 0, generated_index: 0, margin: 1, token: 1, runner_up: 2, token_text: 'a', runner_up_text: 'b' } }, stepMargins: [1], prompts: 1, errors: [] },
  };
}

const clean: ParityFacts = {
  ok: true, target: 'host', matched: 128, total: 128, ties: 0, maxTies: 0, rule: RULE,
  variants: {
    export: { matched: 64, total: 64, ties: 0, mismatches: 0, tieMargin: 2e-6, timings },
    quantize: { matched: 64, total: 64, ties: 0, mismatches: 0, tieMargin: 0.04, timings },
  },
  mismatches: { count: 0, listed: [] },
};

describe('model card: parity', () => {
  it('shows every variant N/N with its ties, the bound and the tie margin, and states the rule', () => {
    const card = modelCard(facts(clean), {});
    expect(card).toContain(`**Parity** (greedy on \`host\`, teacher-forced on Hugging Face's tokens): pass. Rule: ${RULE}.`);
    expect(card).toContain('| fp32 reference | 64/64 | 0 (0) | 2.00e-6 |');
    expect(card).toContain('| shipped (w8) | 64/64 | 0 (0) | 4.00e-2 |');
    expect(card).not.toMatch(/w8Why|required at|not N\/N|HF margin/);
  });

  it('lists each tie and mismatch with HF\'s margin, and the recipe\'s reason for allowing ties', () => {
    const card = modelCard(facts({
      ...clean, ok: false, ties: 1, maxTies: 2, tiesWhy: 'synthetic random weights',
      variants: { ...clean.variants, quantize: { matched: 3, total: 64, ties: 1, mismatches: 2, tieMargin: 0.04, timings } },
      mismatches: {
        count: 2,
        listed: [
          { variant: 'quantize', prompt: 0, step: 3, hf: { token: 11 }, runtime: { token: 12 }, margin: 0.01, tie: true },
          { variant: 'quantize', prompt: 1, step: 7, hf: { token: 5 }, runtime: { token: 9 }, margin: 0.5, tie: false },
        ],
      },
    }), {});
    expect(card).toContain(': FAIL. Rule:');
    expect(card).toContain('| shipped (w8) | 62/64 | 1 (2) | 4.00e-2 |');
    expect(card).toContain('| quantize | 0 | 3 | 11 | 12 | 1.00e-2 | tie |');
    expect(card).toContain('| quantize | 1 | 7 | 5 | 9 | 5.00e-1 | mismatch |');
    expect(card).toContain('This recipe allows up to 2 ties per variant: synthetic random weights.');
  });

  it('says which optional graphs the planner left out, and why', () => {
    const why = '9 graphs are over the v81 limit of 6 graphs per process (arch table: cdsp-heap)';
    const card = modelCard({ ...facts(clean), planDropped: [{ graph: 'shard0.prefill', why }, { graph: 'shard1.prefill', why }, { graph: 'shard2.prefill', why: 'another reason' }] }, {});
    expect(card).toContain(`**Planner:** left out 2 graph(s) for v81 (\`shard0.prefill\`, \`shard1.prefill\`): ${why}.`);
    expect(card).toContain('**Planner:** left out 1 graph(s) for v81 (`shard2.prefill`): another reason.');
    expect(modelCard(facts(clean), {})).not.toContain('**Planner:**');
  });

  it('says what the planner kept against the arch limits, and that nothing was left out when nothing was', () => {
    const kept = modelCard({ ...facts(clean), planDropped: [], planKept: { contexts: 3, graphs: 11 } }, {});
    expect(kept).toContain("**Planner:** 11 graphs in 3 contexts, within v81's limits of 34 graphs per process and 8 contexts (arch table); nothing left out.");
    const dropped = modelCard({ ...facts(clean), planDropped: [{ graph: 'experts.prefill', why: 'over' }], planKept: { contexts: 3, graphs: 34 } }, {});
    expect(dropped).toContain("**Planner:** 34 graphs in 3 contexts, within v81's limits of 34 graphs per process and 8 contexts (arch table).");
  });

  it('says how many mismatches were left out of the list', () => {
    const listed = Array.from({ length: 20 }, (_, k) => ({ variant: 'quantize', prompt: 0, step: k, hf: { token: 1 }, runtime: { token: 2 }, margin: 1, tie: false }));
    const card = modelCard(facts({ ...clean, mismatches: { count: 45, listed } }), {});
    expect(card).toContain('25 more mismatches are in build/parity.json\'s count, not listed.');
  });

  it('gives the simulator\'s parity under teacher forcing with its ties, bound and margin', () => {
    const emulation: CardFacts['emulation'] = {
      ok: true, simulator: 'x86 HTP simulator', graphs: {},
      parity: { matched: 64, total: 64, ties: 0, maxTies: 0, tieMargin: 0.125, mismatches: { count: 0, listed: [] } },
    };
    expect(modelCard(facts(clean, emulation), {})).toContain('parity (teacher-forced) 64/64 equal to HF, 0 ties (0 allowed; tie margin 1.25e-1, twice the larger of the simulator\'s lm-head logit error and the shipped graphs\' chained one on the CPU).');
  });
});

describe('model card: run command', () => {
  it('asks a model with a chat template through --chat, and one without in plain text', () => {
    const withChat = facts(clean);
    (withChat.manifest.tokenizer as { chat: unknown }).chat = { prefix: '<|user|>\n', suffix: '<|end|>\n<|assistant|>\n' };
    const card = modelCard(withChat, {});
    expect(card).toContain(`./qhx_generate manifest.json libQnnHtp.so libQnnSystem.so . 8 'What is the capital of France?' --chat"`);
    expect(card).toContain('`--chat` wraps the prompt in the model\'s chat template');
    const plain = modelCard(facts(clean), {});
    expect(plain).toContain(`./qhx_generate manifest.json libQnnHtp.so libQnnSystem.so . 8 'The capital of France is'"`);
    expect(plain).toContain('The model has no chat template: the prompt is plain text.');
    expect(plain).not.toContain('--chat');
  });

  it('lists the chat template\'s switches --chat-option sets, or why the runtime offers none', () => {
    const wrap = { prefix: '<|im_start|>user\n', suffix: '<|im_end|>\n<|im_start|>assistant\n' };
    const withOptions = facts(clean);
    Object.assign(withOptions.manifest.tokenizer, {
      chat: wrap,
      chatOptions: [{ options: { enable_thinking: true }, ...wrap }, { options: { enable_thinking: false }, prefix: wrap.prefix, suffix: wrap.suffix + '<think>\n\n</think>\n\n' }],
    });
    const card = modelCard(withOptions, {});
    expect(card).toContain('**Chat options:** `enable_thinking`. `--chat --chat-option enable_thinking=false` (true or false; repeatable, one per option) gives the ids transformers\' `apply_chat_template(..., enable_thinking=False)` gives');
    const over = facts(clean);
    Object.assign(over.manifest.tokenizer, { chat: wrap, chatOptionsNotApplied: 'the template reads 4 switches (a, b, c, d), over the 3 whose every combination forge renders' });
    expect(modelCard(over, {})).toContain('The chat template reads switches the runtime does not offer (the template reads 4 switches (a, b, c, d), over the 3 whose every combination forge renders)');
    const none = facts(clean);
    (none.manifest.tokenizer as { chat: unknown }).chat = wrap;
    expect(modelCard(none, {})).not.toContain('--chat-option');
  });
});

describe('model card: bytes per decode token', () => {
  it('tabulates what a decode step moves at each position, weights and caches apart, and says it is counted, not measured', () => {
    const rows = [{ position: 128, bytesPerToken: 5_677_700_000, weights: 4_468_800_000, kvRead: 1_208_000_000, other: 900_000 }];
    const card = modelCard({ ...facts(clean), decodeBytes: rows }, {});
    expect(card).toContain('**Bytes per decode token** (counted from the plan and the graphs, not measured on a device');
    expect(card).toContain('| position | per token | weights | KV caches read | other |\n|---|---|---|---|---|\n| 128 | 5.68 GB | 4.47 GB | 1.21 GB | 900.0 kB |');
    expect(modelCard(facts(clean), {})).not.toContain('Bytes per decode token');
  });
});

describe('model card: precision', () => {
  it('lists every matrix that is not in the W4 scheme with why, and the lm-head\'s own scheme', () => {
    const why = 'in-features 48 are not a multiple of the W4 block 32';
    const rows = precisionRows([
      { tensor: 'model.layers.0.self_attn.q_proj.weight', shape: [48, 64], scheme: 'w4' },
      { tensor: 'model.layers.0.self_attn.o_proj.weight', shape: [64, 48], scheme: 'w8', why },
      { tensor: 'model.layers.1.self_attn.q_proj.weight', shape: [48, 64], scheme: 'w4' },
      { tensor: 'model.embed_tokens.weight', shape: [1000, 64], scheme: 'fp16' },
    ]);
    const card = modelCard({ ...facts(clean), precision: { scheme: 'w4', lmHeadScheme: 'fp16', fallbacks: [{ tensor: 'model.layers.0.self_attn.o_proj.weight', scheme: 'w8', why }], rows } }, {});
    expect(card).toContain('**Precision:** layer weights w4 (int4 blocks of 32, MatMulNBits); the lm-head fp16 (recipe lmHead.quant); 1 matrix otherwise:');
    expect(card).toContain('- `model.layers.0.self_attn.o_proj.weight`: w8, in-features 48 are not a multiple of the W4 block 32');
    // The per-layer map: layer 0 mixed with why, layer 1 uniform, the lm-head last.
    expect(card).toContain(`| 0 | w4 ×1, w8 ×1 | ${why} |\n| 1 | w4 ×1 | - |\n| lm-head | fp16 ×1 | - |`);
    expect(modelCard({ ...facts(clean), precision: { scheme: 'w4', lmHeadScheme: 'w4', fallbacks: [], rows: [] } }, {})).toContain('layer weights w4 (int4 blocks of 32, MatMulNBits), the lm-head too; every matrix w4.');
    // Padded in-features are named as such, in a W8 build too.
    const padded = modelCard({ ...facts(clean), precision: { scheme: 'w8', lmHeadScheme: 'fp16', fallbacks: [{ tensor: 'model.layers.0.mlp.down_proj.weight', scheme: 'w8', why: 'in-features 150 zero-padded to 160 (MatMulNBits blocks of 16 or more)', paddedTo: 160 }], rows: [] } }, {});
    expect(padded).toContain('**Precision:** layer weights w8; the lm-head fp16 (recipe lmHead.quant); 1 matrix zero-padded:');
    expect(padded).toContain('- `model.layers.0.mlp.down_proj.weight`: w8, in-features 150 zero-padded to 160');
    // The QAIRT path's form, and that only a stand-in SDK has checked it.
    expect(modelCard({ ...facts(clean), precision: { scheme: 'w4', lmHeadScheme: 'w4', fallbacks: [], rows: [], form: 'qdq' } }, {})).toContain('layer weights w4 (int4 blocks of 32, blocked DequantizeLinear for the QAIRT converter, checked against a stand-in SDK only, not a real one), the lm-head too');
    // A W8 build without fallbacks says nothing new.
    expect(modelCard({ ...facts(clean), precision: { scheme: 'w8', lmHeadScheme: 'fp16', fallbacks: [], rows: precisionRows([{ tensor: 'model.layers.0.mlp.up_proj.weight', shape: [2, 2], scheme: 'w8' }]) } }, {})).not.toContain('**Precision:**');
  });

  it('says the lm-head\'s precision was chosen by the gates under lmHead.quant auto, with what it kept at w4 and why it moved', () => {
    const rows = precisionRows([{ tensor: 'model.layers.0.mlp.up_proj.weight', shape: [2, 2], scheme: 'w8' }, { tensor: 'lm_head.weight', shape: [1000, 64], scheme: 'w4' }], { layers: [], lmHead: { scheme: 'w4', w4Cosine: 0.99412, cosine: 0.99412, w4Top1: { agree: 270, rows: 270 }, top1: { agree: 270, rows: 270 }, bytes: 40_000, w4Bytes: 40_000, w8Bytes: 72_000 } });
    expect(rows.find((r) => r.layer === '-')).toMatchObject({ w4Cosine: 0.99412, cosine: 0.99412 });
    const kept = modelCard({ ...facts(clean), precision: { scheme: 'w8', lmHeadScheme: 'w4', fallbacks: [], rows, lmHeadAuto: { w4Cosine: 0.99412, w4Top1: '270/270', bytes: 40_000, w4Bytes: 40_000 } } }, {});
    // Layers in a fixed w8, the lm-head left at w4 by the gates: the card says so even though no matrix was moved.
    expect(kept).toContain("**Precision:** layer weights w8; the lm-head w4, chosen by the gates (lmHead.quant auto: alone at w4 it picks Hugging Face's token at 270/270 traced steps, logits cosine 0.99412, and host parity holds; 40.0 kB, 1.00× its w4 size); every layer matrix w8.");
    const why = 'auto: the lm-head alone at w4 keeps HF\'s token at 265/270 steps < gates.oracle.minTop1 1';
    const moved = modelCard({ ...facts(clean), precision: { scheme: 'w8', lmHeadScheme: 'w8', fallbacks: [], rows, lmHeadAuto: { w4Cosine: 0.98, w4Top1: '265/270', bytes: 72_000, w4Bytes: 40_000, why } } }, {});
    expect(moved).toContain("the lm-head w8, chosen by the gates (lmHead.quant auto: alone at w4 it picks Hugging Face's token at 265/270 traced steps, logits cosine 0.98000; the lm-head alone at w4 keeps HF's token at 265/270 steps < gates.oracle.minTop1 1; 72.0 kB, 1.80× its w4 size)");
  });
});

describe("the card's exact rewrites", () => {
  it('lists each rescale and equalize line of the recipe with why, and nothing when there are none', () => {
    const rewrites = {
      rescale: [{ match: 'layers\\.1/self_attn\\.v_proj', scale: 2 ** -4, why: "forge bisect: layers.1's V reaches 9.470e+4 on the CPU > 65504, beyond fp16 on the HTP" }],
      equalize: [{ match: 'layers\\.2\\.experts\\.1', why: 'forge bisect: layer 2 expert 1 channels equalized restores the oracle gate' }],
    };
    const card = modelCard({ ...facts(clean), rewrites }, {});
    expect(card).toContain('**Exact rewrites** (the same function as the checkpoint, in numbers the hardware holds; recipe `rescale` and `equalize`):\n'
      + "- ops under `layers\\.1/self_attn\\.v_proj` rescaled by 2^-4: layers.1's V reaches 9.470e+4 on the CPU > 65504, beyond fp16 on the HTP\n"
      + '- experts `layers\\.2\\.experts\\.1`: channels equalized before quantization: layer 2 expert 1 channels equalized restores the oracle gate\n');
    expect(modelCard({ ...facts(clean), rewrites: { rescale: [], equalize: [] } }, {})).not.toContain('Exact rewrites');
  });
});
