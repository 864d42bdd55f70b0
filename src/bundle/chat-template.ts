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
import { Template } from '@huggingface/jinja';
import { CheckpointError } from '../io/errors.js';

/** What the runtime wraps a plain-text prompt in: prefix + text + suffix, tokenized as one text. */
export interface ChatWrap {
  prefix: string;
  suffix: string;
}

/** A template's wrap, or why the runtime cannot apply it. */
export type ChatWrapResult = { wrap: ChatWrap } | { notApplied: string };

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
function renderParsed(t: Template, tokens: TemplateTokens, content: string): string {
  return t.render({ ...tokens, messages: [{ role: 'user', content }], tools: null, documents: null, add_generation_prompt: true });
}

/** Whether the parsed template names the variable anywhere (a walk over its syntax tree). */
function names(node: unknown, variable: string): boolean {
  if (Array.isArray(node)) return node.some((n) => names(n, variable));
  if (typeof node !== 'object' || node === null) return false;
  const n = node as { type?: unknown; value?: unknown };
  if (n.type === 'Identifier' && n.value === variable) return true;
  return Object.values(node).some((v) => names(v, variable));
}

function occurrences(text: string, part: string): number {
  let n = 0;
  for (let i = text.indexOf(part); i !== -1; i = text.indexOf(part, i + part.length)) n++;
  return n;
}

/**
 * The prefix and suffix around one user turn, or why the runtime cannot apply the template (it does
 * not render the content once, verbatim, or reads the date); a CheckpointError naming `file` and
 * the field chat_template when the template fails to render a user turn at all.
 */
export function chatWrap(template: string, tokens: TemplateTokens, file: string): ChatWrapResult {
  const oneLine = (why: string) => why.replace(/[\r\n]+/g, ' ');
  let parsed: Template;
  const render = (content: string) => {
    try {
      parsed ??= new Template(template);
      return renderParsed(parsed, tokens, content);
    } catch (e) {
      throw CheckpointError.at(file, undefined, oneLine(`field chat_template: does not render one user turn with a generation prompt: ${String((e as Error).message).slice(0, 400)}`), e);
    }
  };
  const rendered = render(SENTINEL);
  if (names(parsed!.parsed, 'strftime_now')) return { notApplied: 'the template reads the date (strftime_now): a prefix fixed when the bundle is made cannot follow it' };
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
