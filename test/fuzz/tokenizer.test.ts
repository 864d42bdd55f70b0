// Fuzz: the TS side's reading of tokenizer.json, tokenizer_config.json and generation_config.json
// (the special-token ids and the chat template's wrap the manifest records), 10,000 seeded mutations of the tiny Qwen3
// tokenizer and Qwen-style configs. Every case must be refused by a CheckpointError of one line
// naming the file, or give ids the manifest schema accepts. (The C++ runtime's tokenizer.json
// loader is fuzzed in native/test/test_fuzz.cpp.)
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseSpecialTokens, type SpecialTokenSources } from '../../src/bundle/special-tokens.js';
import { CheckpointError } from '../../src/io/errors.js';
import { repoRoot } from '../../src/paths.js';
import { expectClearRefusal, FUZZ_CASES, FUZZ_SEED, mutateJsonText, Rng, show } from './mutate.js';

const DIR = '/models/qwen';

/** The tiny Qwen3 tokenizer with its vocab and merges cut to 64 entries each (all else as is): the
 *  special-token reading sees the same structure, and each case costs a fraction of the full file. */
function trimmedTokenizer(): unknown {
  const tok = JSON.parse(readFileSync(join(repoRoot(), 'native/test/fixtures/tiny-qwen3.tokenizer.json'), 'utf8')) as { model: { vocab: Record<string, number>; merges: unknown[] } };
  tok.model.vocab = Object.fromEntries(Object.entries(tok.model.vocab).slice(0, 64));
  tok.model.merges = tok.model.merges.slice(0, 64);
  return tok;
}

const seeds = {
  'tokenizer.json': trimmedTokenizer(),
  'tokenizer_config.json': {
    add_bos_token: true,
    bos_token: { content: '<|endoftext|>', lstrip: false },
    eos_token: '<|im_end|>',
    chat_template: "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    model_max_length: 131072,
  },
  'generation_config.json': { bos_token_id: 1024, eos_token_id: [1025, 1024], do_sample: true },
};
type Name = keyof typeof seeds;

function sources(texts: Record<Name, string>): SpecialTokenSources {
  const at = (name: Name) => ({ file: join(DIR, name), text: texts[name] });
  return { tokenizer: at('tokenizer.json'), tokenizerConfig: at('tokenizer_config.json'), generationConfig: at('generation_config.json') };
}

const seedTexts = Object.fromEntries(Object.entries(seeds).map(([k, v]) => [k, JSON.stringify(v)])) as Record<Name, string>;

describe('fuzz: tokenizer files (special tokens)', () => {
  it('reads the seed files: BOS, every EOS named, the template and the text it puts around a user turn', () => {
    expect(parseSpecialTokens(sources(seedTexts))).toEqual({
      bos: 1024, eos: [1024, 1025, 1026], chatTemplate: seeds['tokenizer_config.json'].chat_template,
      chat: { prefix: '<|im_start|>user\n', suffix: '<|im_end|>\n<|im_start|>assistant\n' },
    });
  });

  it('takes the BOS a TemplateProcessing post-processor adds when tokenizer_config.json does not say (Gemma), and none when it says false', () => {
    const tok = trimmedTokenizer() as Record<string, unknown>;
    tok.post_processor = { type: 'Sequence', processors: [{ type: 'ByteLevel' }, { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<|endoftext|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }] }] };
    const { add_bos_token: _, ...config } = seeds['tokenizer_config.json'];
    const texts = { ...seedTexts, 'tokenizer.json': JSON.stringify(tok), 'tokenizer_config.json': JSON.stringify(config) };
    expect(parseSpecialTokens(sources(texts)).bos).toBe(1024);
    expect(parseSpecialTokens(sources({ ...texts, 'tokenizer_config.json': JSON.stringify({ ...config, add_bos_token: false }) })).bos).toBeNull();
    expect(parseSpecialTokens(sources({ ...seedTexts, 'tokenizer_config.json': JSON.stringify(config) })).bos).toBeNull(); // ByteLevel alone adds none
  });

  it(`refuses every mutated file with one CheckpointError line naming it, or gives valid ids (${FUZZ_CASES} cases)`, () => {
    const rng = new Rng(FUZZ_SEED);
    const names = Object.keys(seeds) as Name[];
    let refused = 0;
    for (let i = 0; i < FUZZ_CASES; i++) {
      const name = rng.pick(names);
      const bytes = mutateJsonText(rng, seeds[name]);
      const texts = { ...seedTexts, [name]: bytes.toString('utf8') };
      try {
        const special = parseSpecialTokens(sources(texts));
        for (const id of [...special.eos, ...(special.bos === null ? [] : [special.bos])]) {
          expect(Number.isSafeInteger(id) && id >= 0, `seed ${FUZZ_SEED}, case ${i}: id ${id} from ${name} ${show(bytes)}`).toBe(true);
        }
        if (special.chat) expect(typeof special.chat.prefix + typeof special.chat.suffix, `case ${i}: ${show(bytes)}`).toBe('stringstring');
      } catch (err) {
        refused++;
        expectClearRefusal(err, CheckpointError, join(DIR, name), () => `case ${i} (${name}): ${show(bytes)}`);
      }
    }
    console.log(`fuzz tokenizer files: ${FUZZ_CASES} cases, ${refused} refused, seed ${FUZZ_SEED}`);
    expect(refused).toBeGreaterThan(FUZZ_CASES / 10);
  });
});
