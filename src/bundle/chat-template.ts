// The chat template, applied at bundle time so the runtime needs no Jinja engine: forge renders
// the checkpoint's template (tokenizer_config.json's chat_template) for one user turn with a
// generation prompt, as transformers' apply_chat_template does, around a sentinel content, and
// keeps the text before and after it. The runtime's `--chat` then feeds prefix + text + suffix to
// its tokenizer. That is exact only when the template puts the content in once and verbatim, for
// any content: the render is checked with probe texts. A template that transforms the content
// (trim, escaping), drops it, repeats it, depends on it otherwise or reads the clock (the prefix
// would freeze the bundle's build date) is a valid template the runtime cannot apply: the bundle
// ships without a wrap and says why (the model still builds; its users feed ids rendered by
// transformers). One that fails to render a user turn at all is broken and refused.
// A template's switches (chat-switches.ts: variables it reads only as booleans, which
// apply_chat_template's keyword arguments set, e.g. Qwen3's enable_thinking) get a wrap for every
// combination, each checked the same way, for `qhx_generate --chat-option NAME=true|false`.
import { Template } from '@huggingface/jinja';
import { CheckpointError } from '../io/errors.js';
import { templateSwitches } from './chat-switches.js';

/** What the runtime wraps a plain-text prompt in: prefix + text + suffix, tokenized as one text. */
export interface ChatWrap {
  prefix: string;
  suffix: string;
}

/** The wrap when the caller passes these switches (those not named are not passed at all). */
export interface ChatOptionWrap extends ChatWrap {
  options: Record<string, boolean>;
}

/**
 * A template's wrap (no switch passed) with, when it has switches (chat-switches.ts), the wrap for
 * every other combination of them, each given true or false or not given; or why the runtime
 * cannot apply it. optionsNotApplied: why the switches have no wraps (options is then absent).
 */
export type ChatWrapResult = { wrap: ChatWrap; options?: ChatOptionWrap[]; optionsNotApplied?: string } | { notApplied: string };

/** At most this many switches: every combination is rendered, 3^n - 1 wraps beside the default. */
export const MAX_CHAT_SWITCHES = 3;

/** The special tokens transformers passes to the template (its special_tokens_map), by their text. */
export type TemplateTokens = Partial<Record<'bos_token' | 'eos_token' | 'unk_token' | 'pad_token' | 'sep_token' | 'cls_token' | 'mask_token', string>>;
export const TEMPLATE_TOKEN_NAMES = ['bos_token', 'eos_token', 'unk_token', 'pad_token', 'sep_token', 'cls_token', 'mask_token'] as const;

// The content the split is taken around: letters and digits only, so no filter that leaves text
// alone would change it, and no template would contain it by chance.
const SENTINEL = 'FORGExCHATxCONTENTx7f3a91';
// Contents the split must reproduce exactly: surrounding and inner whitespace (a `trim`), markup
// characters (an `escape`), mixed case (`lower`), non-ASCII.
const PROBES = ['  Probe <a href="x">&amp;</a> \'q\' "d" {{ x }}\n\n', 'Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich. 日本語 🙂'];

/**
 * transformers' render of one user turn (utils/chat_template_utils.py render_jinja_template):
 * the special tokens, messages, tools and documents as None, add_generation_prompt. Jinja options
 * match: @huggingface/jinja lexes with trim_blocks and lstrip_blocks, as transformers compiles.
 */
function renderParsed(t: Template, tokens: TemplateTokens, content: string, options: Record<string, boolean> = {}): string {
  return t.render({ ...options, ...tokens, messages: [{ role: 'user', content }], tools: null, documents: null, add_generation_prompt: true });
}

/** Whether the parsed template names the variable anywhere (a walk over its syntax tree). */
function names(node: unknown, variable: string): boolean {
  if (Array.isArray(node)) return node.some((n) => names(n, variable));
  if (node instanceof Map) return [...node].some((kv) => names(kv, variable)); // a dict literal's entries
  if (typeof node !== 'object' || node === null) return false;
  const n = node as { type?: unknown; value?: unknown };
  if (n.type === 'Identifier' && n.value === variable) return true;
  return Object.values(node).some((v) => names(v, variable));
}

const oneLine = (why: string) => why.replace(/[\r\n]+/g, ' ');

function occurrences(text: string, part: string): number {
  let n = 0;
  for (let i = text.indexOf(part); i !== -1; i = text.indexOf(part, i + part.length)) n++;
  return n;
}

/**
 * The prefix and suffix of one render around the sentinel, checked with the probes, or why they do
 * not wrap the content (it does not come out once, verbatim).
 */
function splitRender(render: (content: string) => string): { wrap: ChatWrap } | { notApplied: string } {
  const rendered = render(SENTINEL);
  const n = occurrences(rendered, SENTINEL);
  if (n !== 1) return { notApplied: `the template does not render the user's content once, verbatim (a sentinel content came out ${n} times): the runtime can only wrap a prompt in fixed text` };
  const at = rendered.indexOf(SENTINEL);
  const wrap = { prefix: rendered.slice(0, at), suffix: rendered.slice(at + SENTINEL.length) };
  for (const probe of PROBES) {
    if (render(probe) !== wrap.prefix + probe + wrap.suffix) {
      return { notApplied: oneLine(`the template does not render the user's content verbatim: the content ${JSON.stringify(probe)} does not come out as itself between the same prefix and suffix (a filter such as trim, or a branch on the content); the runtime can only wrap a prompt in fixed text`) };
    }
  }
  return { wrap };
}

/** Every combination of the switches, each true, false or not given, but the all-not-given one (the default wrap). */
function combinations(switches: string[]): Record<string, boolean>[] {
  let all: Record<string, boolean>[] = [{}];
  for (const s of switches) all = all.flatMap((c) => [c, { ...c, [s]: true }, { ...c, [s]: false }]);
  return all.slice(1);
}

const describeOptions = (o: Record<string, boolean>) => Object.entries(o).map(([k, v]) => `${k}=${v}`).join(' ');

/**
 * The prefix and suffix around one user turn, or why the runtime cannot apply the template (it does
 * not render the content once, verbatim, or reads the date); a CheckpointError naming `file` and
 * the field chat_template when the template fails to render a user turn at all. With the wrap, the
 * wraps for the template's switches (`options`), or why it has none (`optionsNotApplied`): more
 * switches than MAX_CHAT_SWITCHES, or a combination the template refuses or does not wrap the
 * content in; the default wrap stands either way.
 */
export function chatWrap(template: string, tokens: TemplateTokens, file: string): ChatWrapResult {
  let parsed: Template;
  const render = (content: string) => {
    try {
      parsed ??= new Template(template);
      return renderParsed(parsed, tokens, content);
    } catch (e) {
      throw CheckpointError.at(file, undefined, oneLine(`field chat_template: does not render one user turn with a generation prompt: ${String((e as Error).message).slice(0, 400)}`), e);
    }
  };
  render(SENTINEL); // parses, or refuses a broken template before anything else is said of it
  if (names(parsed!.parsed, 'strftime_now')) return { notApplied: 'the template reads the date (strftime_now): a prefix fixed when the bundle is made cannot follow it' };
  const base = splitRender(render);
  if ('notApplied' in base) return base;
  const switches = templateSwitches(parsed!.parsed);
  if (switches.length === 0) return base;
  if (switches.length > MAX_CHAT_SWITCHES) {
    return { ...base, optionsNotApplied: `the template reads ${switches.length} switches (${switches.join(', ')}), over the ${MAX_CHAT_SWITCHES} whose every combination forge renders` };
  }
  const options: ChatOptionWrap[] = [];
  for (const combination of combinations(switches)) {
    let variant: ReturnType<typeof splitRender>;
    try {
      variant = splitRender((content) => renderParsed(parsed, tokens, content, combination));
    } catch (e) {
      return { ...base, optionsNotApplied: oneLine(`the template does not render one user turn with ${describeOptions(combination)}: ${String((e as Error).message).slice(0, 400)}`) };
    }
    if ('notApplied' in variant) return { ...base, optionsNotApplied: `with ${describeOptions(combination)}, ${variant.notApplied}` };
    options.push({ options: combination, ...variant.wrap });
  }
  return { ...base, options };
}
