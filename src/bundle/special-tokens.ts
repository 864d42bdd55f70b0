// The ids of the BOS/EOS tokens a checkpoint names, and its chat template with the prefix and
// suffix it puts around one user turn (chat-template.ts), for the manifest: read from
// tokenizer.json, tokenizer_config.json and generation_config.json. These are outside input,
// so each is checked for the shape read here, and any problem is one CheckpointError line naming the
// file and field, never a TypeError from deep inside the bundle stage.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { CheckpointError } from '../io/errors.js';
import { chatWrap, TEMPLATE_TOKEN_NAMES, type ChatOptionWrap, type ChatWrap, type TemplateTokens } from './chat-template.js';

export interface SpecialTokens {
  bos: number | null;
  eos: number[];
  chatTemplate: string | null;
  /** What the runtime's --chat wraps a prompt in; null without a template. */
  chat: ChatWrap | null;
  /** Why the runtime cannot apply the checkpoint's chat template (chat is then null); absent otherwise. */
  chatNotApplied?: string;
  /** The wraps for the template's switches (e.g. enable_thinking), every combination but none given; absent without switches. */
  chatOptions?: ChatOptionWrap[];
  /** Why the template's switches have no wraps (chatOptions is then absent). */
  chatOptionsNotApplied?: string;
}

const tokenId = z.number().int().nonnegative();

const TokenizerJsonSchema = z.object({
  added_tokens: z.array(z.object({ id: tokenId, content: z.string() }).passthrough()).optional(),
  model: z.object({ vocab: z.record(z.string(), tokenId) }).passthrough(),
  post_processor: z.unknown().optional(),
}).passthrough();

/**
 * The special token a TemplateProcessing post-processor puts before a single sequence (how a
 * tokenizers-backed tokenizer adds its BOS when tokenizer_config.json does not say), or null.
 */
function leadingSpecial(post: unknown): string | null {
  if (!post || typeof post !== 'object') return null;
  const p = post as { type?: unknown; single?: unknown; processors?: unknown };
  if (p.type === 'Sequence' && Array.isArray(p.processors)) {
    for (const x of p.processors) {
      const found = leadingSpecial(x);
      if (found) return found;
    }
    return null;
  }
  if (p.type !== 'TemplateProcessing' || !Array.isArray(p.single)) return null;
  const id = (p.single[0] as { SpecialToken?: { id?: unknown } } | null | undefined)?.SpecialToken?.id;
  return typeof id === 'string' ? id : null;
}

// A token is named by its text, or by an AddedToken object {content, ...}.
const namedToken = z.union([z.string(), z.object({ content: z.string() }).passthrough()]).nullable().optional();

const TokenizerConfigSchema = z.object({
  add_bos_token: z.boolean().nullable().optional(),
  ...Object.fromEntries(TEMPLATE_TOKEN_NAMES.map((k) => [k, namedToken])) as Record<(typeof TEMPLATE_TOKEN_NAMES)[number], typeof namedToken>,
  // One template, or (older files) a list of named ones of which transformers uses 'default'.
  chat_template: z.union([z.string(), z.array(z.object({ name: z.string(), template: z.string() }).passthrough())]).nullable().optional(),
}).passthrough();

const GenerationConfigSchema = z.object({
  eos_token_id: z.union([tokenId, z.array(tokenId)]).nullable().optional(),
}).passthrough();

/** One file's text (undefined: the file is absent, which only tokenizer.json may not be). */
export interface SpecialTokenSources {
  tokenizer: { file: string; text: string };
  tokenizerConfig?: { file: string; text: string };
  generationConfig?: { file: string; text: string };
}

function parseJson<T>(source: { file: string; text: string }, schema: z.ZodType<T>): T {
  let raw: unknown;
  try {
    raw = JSON.parse(source.text);
  } catch (e) {
    throw CheckpointError.at(source.file, undefined, `not valid JSON (${(e as Error).message})`.replace(/\s+/g, ' '));
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const field = issue.path.length ? issue.path.map((k) => (typeof k === 'number' ? `[${k}]` : /^[\w-]+$/.test(String(k)) ? String(k) : JSON.stringify(String(k)))).join('.') : '(root)';
    throw CheckpointError.at(source.file, undefined, `field ${field}: ${issue.message}`.replace(/\s+/g, ' '));
  }
  return parsed.data;
}

export function parseSpecialTokens(sources: SpecialTokenSources): SpecialTokens {
  const tok = parseJson(sources.tokenizer, TokenizerJsonSchema);
  const cfg = sources.tokenizerConfig ? parseJson(sources.tokenizerConfig, TokenizerConfigSchema) : {};
  const gen = sources.generationConfig ? parseJson(sources.generationConfig, GenerationConfigSchema) : {};
  const vocab = new Map(Object.entries(tok.model.vocab));
  const idOf = (t: string | { content: string } | null | undefined): number | null => {
    const content = typeof t === 'string' ? t : t?.content;
    if (!content) return null;
    return tok.added_tokens?.find((a) => a.content === content)?.id ?? vocab.get(content) ?? null;
  };
  const eos = new Set<number>([gen.eos_token_id ?? []].flat());
  const cfgEos = idOf(cfg.eos_token);
  if (cfgEos !== null) eos.add(cfgEos);
  const chatTemplate = templateOf(cfg.chat_template, sources.tokenizerConfig?.file);
  const tokens: TemplateTokens = {};
  for (const k of TEMPLATE_TOKEN_NAMES) {
    const t = cfg[k];
    if (t) tokens[k] = typeof t === 'string' ? t : t.content;
  }
  const wrapped = chatTemplate === null ? null : chatWrap(chatTemplate, tokens, sources.tokenizerConfig!.file);
  return {
    // add_bos_token when the config says; else what tokenizer.json's post-processor adds (Gemma's).
    bos: cfg.add_bos_token === true ? idOf(cfg.bos_token) : cfg.add_bos_token === false ? null : idOf(leadingSpecial(tok.post_processor)),
    eos: [...eos].sort((a, b) => a - b),
    chatTemplate,
    chat: wrapped && 'wrap' in wrapped ? wrapped.wrap : null,
    ...(wrapped && 'notApplied' in wrapped ? { chatNotApplied: wrapped.notApplied } : {}),
    ...(wrapped && 'wrap' in wrapped && wrapped.options ? { chatOptions: wrapped.options } : {}),
    ...(wrapped && 'wrap' in wrapped && wrapped.optionsNotApplied ? { chatOptionsNotApplied: wrapped.optionsNotApplied } : {}),
  };
}

/** The template transformers applies: the string, or the list's 'default' (it refuses a list without one). */
function templateOf(t: string | { name: string; template: string }[] | null | undefined, file: string | undefined): string | null {
  if (typeof t === 'string') return t;
  if (!t) return null;
  const named = t.find((x) => x.name === 'default');
  if (!named) throw CheckpointError.at(file!, undefined, `field chat_template: a list of templates (${t.map((x) => JSON.stringify(x.name)).join(', ')}) with none named "default", the one transformers applies`);
  return named.template;
}

/** Reads the three files from a checkpoint directory (the two configs are optional). */
export function readSpecialTokens(checkpointDir: string): SpecialTokens {
  const source = (name: string) => {
    const file = join(checkpointDir, name);
    return existsSync(file) ? { file, text: readFileSync(file, 'utf8') } : undefined;
  };
  const tokenizer = source('tokenizer.json');
  if (!tokenizer) throw CheckpointError.at(join(checkpointDir, 'tokenizer.json'), undefined, 'missing (the bundle ships it)');
  return parseSpecialTokens({ tokenizer, tokenizerConfig: source('tokenizer_config.json'), generationConfig: source('generation_config.json') });
}
