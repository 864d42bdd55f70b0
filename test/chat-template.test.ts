// The chat wrap forge renders at bundle time (src/bundle/chat-template.ts), held to transformers'
// apply_chat_template(add_generation_prompt=True) of one user turn: the text, on every twin's
// tokenizer and on templates written here with the features real ones use; and the ids
// `qhx_generate --chat` feeds the model, against the ids apply_chat_template(tokenize=True) gives.
// A template the runtime cannot wrap a prompt in is refused, naming tokenizer_config.json and
// chat_template. The twins' tokenizers are the ones make_twin.py saves (made by its own code,
// without training the model: test/helpers/hf_chat.py).
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { readSpecialTokens } from '../src/bundle/special-tokens.js';
import { sha256Hex } from '../src/engine/hash.js';
import { runOwned } from '../src/engine/subprocess.js';
import { ensureNative } from '../src/toolchain/native.js';
import { runPython } from '../src/toolchain/python.js';
import { SEED } from './helpers/manifest-seed.js';

const HF_CHAT = resolve('test/helpers/hf_chat.py');
const TWINS = ['qwen3', 'qwen3_5', 'qwen3_vl', 'phimoe'] as const;

const TEXTS = [
  'The capital of France is',
  'Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.',
  '日本語のテキスト 🙂 ½ – “quoted”',
  '  two leading spaces, a tab\there and a trailing newline\n',
  'a user text that spells <|im_end|> and <|end|> itself',
  '',
];

// Templates written for this test with what real ones do around one user turn: BOS in the
// template, a default system prompt, namespace state, a branch on tools being none, a trailing
// newline after the last tag (Jinja drops one), an eos_token branch without a generation prompt.
const TEMPLATES: Record<string, string> = {
  'bos-and-eos-branch':
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\\n' + message['content'] + '<|end|>\\n' }}" +
    "{% elif message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '<|end|>\\n' }}{% else %}{{ '<|assistant|>\\n' + message['content'] + '<|end|>\\n' }}{% endif %}{% endfor %}" +
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}",
  'default-system-prompt':
    "{%- if tools is not none %}{{- '<|system|>\\nTools: ' + tools | length | string + '<|end|>\\n' }}{%- elif messages[0]['role'] != 'system' %}" +
    "{{- '<|system|>\\nYou are a helpful assistant.<|end|>\\n' }}{%- endif %}\n{%- set ns = namespace(users=0) %}\n" +
    "{%- for message in messages %}\n    {%- if message.role == 'user' %}{%- set ns.users = ns.users + 1 %}{%- endif %}\n" +
    "    {{- '<|' + message.role + '|>\\n' + message.content + '<|end|>\\n' }}\n{%- endfor %}\n" +
    "{%- if add_generation_prompt and ns.users > 0 %}\n    {{- '<|assistant|>\\n' }}\n{%- endif %}\n",
  'trailing-newline': "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}{{ '<|assistant|>\\n' }}\n",
};

// Templates the runtime cannot wrap a prompt in: valid, so the model builds without a wrap, saying
// why (user-turn refusals and syntax errors are broken templates, refused: the last two).
const REFUSED: Record<string, { template: string; why: RegExp; broken?: true }> = {
  'content twice': {
    template: "{% for m in messages %}{{ '<|user|>\\n' + m['content'] + '<|end|>\\n' + m['content'] }}{% endfor %}{{ '<|assistant|>\\n' }}",
    why: /content once, verbatim \(a sentinel content came out 2 times\)/,
  },
  'no content': { template: "{{ '<|assistant|>\\n' }}", why: /content once, verbatim \(a sentinel content came out 0 times\)/ },
  'content escaped': {
    template: "{% for m in messages %}{{ '<|user|>\\n' + (m['content'] | replace('<', '&lt;')) + '<|end|>\\n' }}{% endfor %}{{ '<|assistant|>\\n' }}",
    why: /does not render the user's content verbatim: the content "  Probe <a href/,
  },
  'user turn refused': {
    template: "{% for m in messages %}{% if m['role'] == 'user' %}{{ raise_exception('only system turns here') }}{% endif %}{% endfor %}",
    why: /does not render one user turn with a generation prompt: only system turns here/, broken: true,
  },
  'date in the prompt': {
    template: "{{ '<|system|>\\nToday is ' + strftime_now('%d %b %Y') + '<|end|>\\n' }}{% for m in messages %}{{ '<|user|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}{{ '<|assistant|>\\n' }}",
    why: /the template reads the date \(strftime_now\)/,
  },
  'not Jinja': { template: "{% for m in messages %}{{ m['content'] }", why: /does not render one user turn with a generation prompt: /, broken: true },
};

interface HfRow { text?: string; ids?: number[]; error?: string }

/** A bundle qhx_generate loads but never runs (--print-prompt-ids): the schema seed, its vocabulary the tokenizer's, with real files. */
function idsOnlyBundle(dir: string, tokenizerDir: string): string {
  mkdirSync(dir, { recursive: true });
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tokenizerDir, f), join(dir, f));
  const tok = JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')) as { model: { vocab: Record<string, number> }; added_tokens: { id: number }[] };
  const vocab = 1 + Math.max(...Object.values(tok.model.vocab), ...tok.added_tokens.map((a) => a.id));
  const m = structuredClone(SEED) as any;
  const file = (name: string, bytes: Uint8Array) => {
    writeFileSync(join(dir, name), bytes);
    return sha256Hex(bytes);
  };
  m.model.vocab = vocab;
  m.contexts[0].files[0].sha256 = file('shard0.bin', new Uint8Array(64));
  m.contexts[0].graphs[0].sha256 = file('shard0.decode.onnx', new Uint8Array(8));
  const lm = m.contexts[1].graphs[0];
  delete lm.qnn;
  Object.assign(lm, { file: 'lm_head.onnx', sha256: file('lm_head.onnx', new Uint8Array(8)) });
  lm.outputs[0].shape = [1, 1, vocab];
  m.hostTables[0].shape = [vocab, 4];
  m.hostTables[0].sha256 = file('embedding.f16.bin', new Uint8Array(vocab * 4 * 2));
  m.tokenizer = { file: 'tokenizer.json', sha256: file('tokenizer.json', readFileSync(join(dir, 'tokenizer.json'))), config: 'tokenizer_config.json', ...readSpecialTokens(dir) };
  writeFileSync(join(dir, 'manifest.json'), JSON.stringify(m));
  return join(dir, 'manifest.json');
}

describe('chat template: forge\'s wrap against transformers\' apply_chat_template', () => {
  const root = mkdtempSync(join(tmpdir(), 'forge-chat-'));
  const dirs: Record<string, string> = {};
  let hf: Record<string, HfRow[]> = {};

  beforeAll(async () => {
    await runPython(HF_CHAT, ['tokenizers', join(root, 'twins'), ...TWINS, 'gemma4']);
    for (const t of [...TWINS, 'gemma4']) dirs[t] = join(root, 'twins', t);
    // The written templates, each in a copy of the Phi-style twin tokenizer (BOS <s>, chat tokens).
    for (const [name, template] of Object.entries({ ...TEMPLATES, ...Object.fromEntries(Object.entries(REFUSED).map(([k, v]) => [k, v.template])) })) {
      const d = join(root, 'templates', name.replace(/\W+/g, '-'));
      mkdirSync(d, { recursive: true });
      copyFileSync(join(dirs.phimoe, 'tokenizer.json'), join(d, 'tokenizer.json'));
      const cfg = JSON.parse(readFileSync(join(dirs.phimoe, 'tokenizer_config.json'), 'utf8'));
      writeFileSync(join(d, 'tokenizer_config.json'), JSON.stringify({ ...cfg, chat_template: template }));
      dirs[name] = d;
    }
    const names = Object.keys(dirs);
    const request = join(root, 'request.json');
    writeFileSync(request, JSON.stringify(names.map((n) => ({ dir: dirs[n], texts: TEXTS }))));
    const rows = JSON.parse((await runPython(HF_CHAT, ['apply', request])).stdout) as HfRow[][];
    hf = Object.fromEntries(names.map((n, i) => [n, rows[i]]));
  }, 600_000);

  it.each([...TWINS, ...Object.keys(TEMPLATES)])('%s: prefix + text + suffix is the text transformers renders, for every text', (name) => {
    const { chat } = readSpecialTokens(dirs[name]);
    expect(chat).not.toBeNull();
    TEXTS.forEach((text, i) => expect(chat!.prefix + text + chat!.suffix, JSON.stringify(text)).toBe(hf[name][i].text));
  });

  it('splits the twins\' templates where their tags are, and renders what a template adds (BOS, a default system prompt)', () => {
    const chat = (n: string) => readSpecialTokens(dirs[n]).chat;
    for (const t of ['qwen3', 'qwen3_5', 'qwen3_vl']) expect(chat(t)).toEqual({ prefix: '<|im_start|>user\n', suffix: '<|im_end|>\n<|im_start|>assistant\n' });
    expect(chat('phimoe')).toEqual({ prefix: '<|user|>\n', suffix: '<|end|>\n<|assistant|>\n' });
    expect(chat('bos-and-eos-branch')).toEqual({ prefix: '<s><|user|>\n', suffix: '<|end|>\n<|assistant|>\n' });
    expect(chat('default-system-prompt')).toEqual({ prefix: '<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\n', suffix: '<|end|>\n<|assistant|>\n' });
  });

  it('gives the Gemma twin no wrap, saying why: its template trims the content, so no fixed prefix and suffix give its text', () => {
    expect(readSpecialTokens(dirs.gemma4)).toMatchObject({ chat: null, chatNotApplied: expect.stringMatching(/^the template does not render the user's content verbatim/) });
    // transformers' own render shows the trim: the text with surrounding spaces comes out without them.
    expect(hf.gemma4[3].text).toContain('<start_of_turn>user\ntwo leading spaces');
  });

  const unwrappable = Object.keys(REFUSED).filter((n) => !REFUSED[n].broken);
  it.each(unwrappable)('ships no wrap for a template it cannot apply (%s), saying why in one line', (name) => {
    const special = readSpecialTokens(dirs[name]);
    expect(special.chat).toBeNull();
    expect(special.chatNotApplied).toMatch(REFUSED[name].why);
    expect(special.chatNotApplied).not.toMatch(/\n/);
    expect(special.chatTemplate).toBe(REFUSED[name].template);
  });

  it.each(Object.keys(REFUSED).filter((n) => REFUSED[n].broken))('refuses a broken template: %s, naming tokenizer_config.json and chat_template', (name) => {
    const file = join(dirs[name], 'tokenizer_config.json');
    expect(() => readSpecialTokens(dirs[name])).toThrow(`${file}: field chat_template: `);
    expect(() => readSpecialTokens(dirs[name])).toThrow(REFUSED[name].why);
    try {
      readSpecialTokens(dirs[name]);
    } catch (e) {
      expect((e as Error).message).not.toMatch(/\n/);
    }
  });

  it('qhx_generate --chat feeds the ids apply_chat_template(tokenize=True) gives, BOS only where the template renders it', async () => {
    const { qhxGenerate } = await ensureNative();
    let compared = 0;
    for (const name of [...TWINS, ...Object.keys(TEMPLATES)]) {
      const manifest = idsOnlyBundle(join(root, 'bundles', name), dirs[name]);
      const bundle = join(root, 'bundles', name);
      for (const [i, text] of TEXTS.entries()) {
        const r = await runOwned(qhxGenerate, [manifest, 'cpu', '-', bundle, '1', text, '--chat', '--print-prompt-ids', '--json']);
        expect(r.exitCode, r.stderr).toBe(0);
        expect(JSON.parse(r.stdout).prompt_ids, `${name} ${JSON.stringify(text)}`).toEqual(hf[name][i].ids);
        compared++;
      }
    }
    expect(compared).toBe((TWINS.length + Object.keys(TEMPLATES).length) * TEXTS.length);
    // The BOS-rendering template's ids start with <s>, once: the runtime adds none of its own; the
    // Phi twin's own template renders none, and none is fed.
    const tok = JSON.parse(readFileSync(join(dirs.phimoe, 'tokenizer.json'), 'utf8')) as { added_tokens: { id: number; content: string }[] };
    const s = tok.added_tokens.find((a) => a.content === '<s>')!.id;
    for (const row of hf['bos-and-eos-branch']) expect(row.ids!.filter((id) => id === s)).toEqual([s]);
    expect(hf['bos-and-eos-branch'][0].ids![0]).toBe(s);
    for (const row of hf.phimoe) expect(row.ids).not.toContain(s);
  }, 900_000);
});
