// The chat wrap forge renders at bundle time (src/bundle/chat-template.ts), held to transformers'
// apply_chat_template(add_generation_prompt=True) of one user turn: the text, on every twin's
// tokenizer and on templates written here with the features real ones use; and the ids
// `qhx_generate --chat` feeds the model, against the ids apply_chat_template(tokenize=True) gives.
// A template's switches (Qwen3's enable_thinking) likewise: every combination's wrap against
// apply_chat_template(..., enable_thinking=...), and `--chat-option` picking it, refused when unknown.
// A template the runtime cannot wrap a prompt in is refused, naming tokenizer_config.json and
// chat_template. The twins' tokenizers are the ones make_twin.py saves (made by its own code,
// without training the model: test/helpers/hf_chat.py).
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { chatWrap, MAX_CHAT_SWITCHES } from '../src/bundle/chat-template.js';
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
  // Qwen3's switch as its real template spells it, after the generation prompt (on the Qwen twin's tokenizer).
  'thinking-switch':
    "{%- for message in messages %}\n    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n{%- endfor %}\n" +
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n" +
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}\n",
  // Two switches whose effects interact, one read with `not` (absent reads as false): every combination differs.
  'two-switches':
    "{%- for m in messages %}{{- '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{%- endfor %}" +
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- if concise %}{{- 'Briefly' + (', no thinking' if enable_thinking is false else '') + ': ' }}" +
    "{%- elif not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}",
};
/** The written templates' tokenizers: the Phi twin's, but where a template uses another family's tags. */
const TOKENIZER_OF: Record<string, 'phimoe' | 'qwen3'> = { 'thinking-switch': 'qwen3' };

// The switches (variables read only as booleans, set by apply_chat_template's keyword arguments) of
// the templates that have any; every other template has none.
const SWITCHES: Record<string, string[]> = {
  qwen3: ['enable_thinking'], qwen3_5: ['enable_thinking'], qwen3_vl: ['enable_thinking'],
  'thinking-switch': ['enable_thinking'], 'two-switches': ['concise', 'enable_thinking'],
};

/** Every assignment of the switches, each true, false or not given, but none given (the default wrap). */
function combinations(switches: string[]): Record<string, boolean>[] {
  let all: Record<string, boolean>[] = [{}];
  for (const s of switches) all = all.flatMap((c) => [c, { ...c, [s]: false }, { ...c, [s]: true }]);
  return all.filter((c) => Object.keys(c).length > 0);
}
const optionKey = (name: string, options: Record<string, boolean>) => `${name} ${JSON.stringify(Object.entries(options).sort())}`;
const optionArgs = (options: Record<string, boolean>) => Object.entries(options).flatMap(([k, v]) => ['--chat-option', `${k}=${v}`]);

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
      const base = dirs[TOKENIZER_OF[name] ?? 'phimoe'];
      copyFileSync(join(base, 'tokenizer.json'), join(d, 'tokenizer.json'));
      const cfg = JSON.parse(readFileSync(join(base, 'tokenizer_config.json'), 'utf8'));
      writeFileSync(join(d, 'tokenizer_config.json'), JSON.stringify({ ...cfg, chat_template: template }));
      dirs[name] = d;
    }
    // transformers' renders: every template as is, and each switched one with every combination of its switches.
    const cases = [
      ...Object.keys(dirs).map((n) => ({ key: n, dir: dirs[n], kwargs: {} })),
      ...Object.entries(SWITCHES).flatMap(([n, s]) => combinations(s).map((kwargs) => ({ key: optionKey(n, kwargs), dir: dirs[n], kwargs }))),
    ];
    const request = join(root, 'request.json');
    writeFileSync(request, JSON.stringify(cases.map((c) => ({ dir: c.dir, texts: TEXTS, kwargs: c.kwargs }))));
    const rows = JSON.parse((await runPython(HF_CHAT, ['apply', request])).stdout) as HfRow[][];
    hf = Object.fromEntries(cases.map((c, i) => [c.key, rows[i]]));
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

  it.each(Object.keys(SWITCHES))('%s: a wrap for every combination of its switches, each the text transformers renders with them as keyword arguments', (name) => {
    const { chat, chatOptions, chatOptionsNotApplied } = readSpecialTokens(dirs[name]);
    expect(chatOptionsNotApplied).toBeUndefined();
    expect(chatOptions!.map((v) => optionKey(name, v.options)).sort()).toEqual(combinations(SWITCHES[name]).map((o) => optionKey(name, o)).sort());
    for (const v of chatOptions!) {
      TEXTS.forEach((text, i) => expect(v.prefix + text + v.suffix, `${JSON.stringify(v.options)} ${JSON.stringify(text)}`).toBe(hf[optionKey(name, v.options)][i].text));
    }
    // The switches do something: Qwen3's enable_thinking=false closes an empty think block after the generation prompt.
    const wrapOf = (options: object) => chatOptions!.find((v) => JSON.stringify(v.options) === JSON.stringify(options))!;
    if (name === 'two-switches') expect(wrapOf({ concise: true, enable_thinking: false }).suffix).toBe('<|end|>\n<|assistant|>\nBriefly, no thinking: ');
    else expect(wrapOf({ enable_thinking: false }).suffix).toBe(chat!.suffix + '<think>\n\n</think>\n\n');
  });

  it('finds no switch in the templates that read none, nor in variables read for their value, only tested for being defined, or set by the template', () => {
    for (const name of ['phimoe', 'gemma4', ...Object.keys(TEMPLATES).filter((n) => !SWITCHES[n])]) {
      const special = readSpecialTokens(dirs[name]);
      expect(special.chatOptions, name).toBeUndefined();
      expect(special.chatOptionsNotApplied, name).toBeUndefined();
    }
    const turn = "{% for m in messages %}{{ '<|user|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}";
    const notSwitches = turn + "{% if persona %}{{ persona }}{% endif %}{% if mode is defined %}x{% endif %}{% set flag = true %}{% if flag %}y{% endif %}" +
      "{% if (style or 'plain') == 'plain' %}z{% endif %}{% if add_generation_prompt and bos_token %}{{ '<|assistant|>\\n' }}{% endif %}";
    expect(chatWrap(notSwitches, { bos_token: '<s>' }, 'tokenizer_config.json')).toEqual({ wrap: { prefix: '<|user|>\n', suffix: '<|end|>\nyz<|assistant|>\n' } });
  });

  it(`keeps the default wrap but renders no options, saying why in one line, for more than ${MAX_CHAT_SWITCHES} switches or a combination it cannot wrap`, () => {
    const turn = "{% for m in messages %}{{ '<|user|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}{{ '<|assistant|>\\n' }}";
    const wrap = { prefix: '<|user|>\n', suffix: '<|end|>\n<|assistant|>\n' };
    const four = turn + '{% if a %}A{% endif %}{% if b %}B{% endif %}{% if c %}C{% endif %}{% if d %}D{% endif %}';
    expect(chatWrap(four, {}, 'f')).toEqual({ wrap, optionsNotApplied: `the template reads 4 switches (a, b, c, d), over the ${MAX_CHAT_SWITCHES} whose every combination forge renders` });
    const refuses = turn + "{% if tools_off is false %}{{ raise_exception('tools_off must be true or absent') }}{% endif %}";
    expect(chatWrap(refuses, {}, 'f')).toEqual({ wrap, optionsNotApplied: 'the template does not render one user turn with tools_off=false: tools_off must be true or absent' });
    const drops = "{% for m in messages %}{{ '<|user|>\\n' + ('' if redact else m['content']) + '<|end|>\\n' }}{% endfor %}";
    expect(chatWrap(drops, {}, 'f')).toMatchObject({ optionsNotApplied: expect.stringMatching(/^with redact=true, the template does not render the user's content once, verbatim \(a sentinel content came out 0 times\)/) });
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

  it('qhx_generate --chat --chat-option name=value feeds the ids apply_chat_template(tokenize=True, name=value) gives, for every combination', async () => {
    const { qhxGenerate } = await ensureNative();
    let compared = 0;
    for (const [name, switches] of Object.entries(SWITCHES)) {
      const bundle = join(root, 'bundles', name);
      const manifest = idsOnlyBundle(bundle, dirs[name]);
      for (const options of combinations(switches)) {
        for (const [i, text] of TEXTS.entries()) {
          const r = await runOwned(qhxGenerate, [manifest, 'cpu', '-', bundle, '1', text, '--chat', ...optionArgs(options), '--print-prompt-ids', '--json']);
          expect(r.exitCode, r.stderr).toBe(0);
          expect(JSON.parse(r.stdout).prompt_ids, `${optionKey(name, options)} ${JSON.stringify(text)}`).toEqual(hf[optionKey(name, options)][i].ids);
          compared++;
        }
      }
    }
    expect(compared).toBe(Object.values(SWITCHES).reduce((n, s) => n + (3 ** s.length - 1), 0) * TEXTS.length);
    // enable_thinking=false feeds more ids than the default: the empty think block.
    expect(hf[optionKey('qwen3', { enable_thinking: false })][0].ids!.length).toBeGreaterThan(hf.qwen3[0].ids!.length);
  }, 900_000);

  it('qhx_generate refuses a chat option the bundle has not (naming those it has), a value not true or false, and one without --chat', async () => {
    const { qhxGenerate } = await ensureNative();
    const bundle = join(root, 'bundles', 'thinking-switch-refusals');
    const manifest = idsOnlyBundle(bundle, dirs['thinking-switch']);
    const run = async (args: string[], file = manifest) => {
      const r = await runOwned(qhxGenerate, [file, 'cpu', '-', bundle, '1', 'hello', '--print-prompt-ids', ...args]);
      return { code: r.exitCode, err: r.stderr.trim() };
    };
    expect(await run(['--chat', '--chat-option', 'enable_thinkin=false'])).toEqual({ code: 1, err: "qhx_generate: --chat-option enable_thinkin: manifest.json's chat template has no such option; its options: enable_thinking (true|false)" });
    expect(await run(['--chat', '--chat-option', 'enable_thinking=no'])).toEqual({ code: 1, err: "qhx_generate: --chat-option enable_thinking: the value 'no' is not true or false" });
    expect(await run(['--chat', '--chat-option', 'enable_thinking'])).toEqual({ code: 1, err: "qhx_generate: --chat-option 'enable_thinking': expected name=true or name=false (a switch of the chat template, e.g. enable_thinking=false)" });
    expect(await run(['--chat', '--chat-option', 'enable_thinking=false', '--chat-option', 'enable_thinking=true'])).toEqual({ code: 1, err: 'qhx_generate: --chat-option enable_thinking given twice' });
    expect(await run(['--chat-option', 'enable_thinking=false'])).toEqual({ code: 1, err: 'qhx_generate: --chat-option sets a switch of the chat template: it needs --chat' });
    expect((await run(['--chat', '--chat-option'])).err).toBe('qhx_generate: --chat-option needs a value: a switch of the chat template, like enable_thinking=false');
    // A bundle whose template reads no switch, and one whose switches forge could not render.
    const edited = (file: string, edit: (t: any) => void) => {
      const m = JSON.parse(readFileSync(manifest, 'utf8'));
      edit(m.tokenizer);
      writeFileSync(join(bundle, file), JSON.stringify(m));
      return join(bundle, file);
    };
    const plain = edited('plain.json', (t) => delete t.chatOptions);
    expect(await run(['--chat', '--chat-option', 'enable_thinking=false'], plain)).toEqual({ code: 1, err: "qhx_generate: --chat-option enable_thinking=false: plain.json's chat template has no options (it reads no switch such as enable_thinking); use --chat alone" });
    const over = edited('over.json', (t) => ((t.chatOptionsNotApplied = 'the template reads 4 switches (a, b, c, d)'), delete t.chatOptions));
    expect(await run(['--chat', '--chat-option', 'a=true'], over)).toEqual({
      code: 1,
      err: "qhx_generate: --chat-option a=true: over.json's chat template's switches cannot be applied by the runtime (the template reads 4 switches (a, b, c, d)); give the ids transformers' apply_chat_template renders with --prompt-ids",
    });
    expect((await run(['--chat'], over)).code).toBe(0); // the default wrap stands
    // The runtime's loader holds the manifest to the schema's rules for chatOptions.
    const loaderRefusal = async (file: string, edit: (t: any) => void) => (await run(['--chat'], edited(file, edit))).err;
    expect(await loaderRefusal('no-chat.json', (t) => (t.chat = null))).toBe('qhx_generate: no-chat.json: tokenizer.chatOptions: given without a chat wrap (tokenizer.chat): switches only change a wrap');
    expect(await loaderRefusal('twice.json', (t) => t.chatOptions.push(t.chatOptions[0]))).toBe('qhx_generate: twice.json: tokenizer.chatOptions[2].options: this combination of options is given twice');
    expect(await loaderRefusal('string.json', (t) => (t.chatOptions[0].options.enable_thinking = 'false'))).toBe('qhx_generate: string.json: tokenizer.chatOptions[0].options.enable_thinking: expected true or false');
    expect(await loaderRefusal('empty.json', (t) => (t.chatOptions[0].options = {}))).toBe('qhx_generate: empty.json: tokenizer.chatOptions[0].options: expected an object naming at least one switch');
    expect(await loaderRefusal('both.json', (t) => (t.chatOptionsNotApplied = 'why'))).toBe('qhx_generate: both.json: tokenizer.chatOptionsNotApplied: given with chatOptions: it says why there are none');
  }, 900_000);
});
