// The tokenizer files a build needs, checked at fetch: otherwise a missing or broken tokenizer.json
// passes fetch and surfaces minutes later as a Python traceback inside the trace, or as a bundle
// without an end-of-sequence token. The trace (transformers), the bundle (special token ids) and
// the native runtime (the shipped tokenizer.json) all read these files.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

export const TOKENIZER_JSON = 'tokenizer.json';
export const TOKENIZER_CONFIG = 'tokenizer_config.json';
export const GENERATION_CONFIG = 'generation_config.json';

type Obj = Record<string, unknown>;
const isObject = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);

export class TokenizerFileError extends Error {
  constructor(readonly file: string, detail: string) {
    super(`${file}: ${detail}`);
    this.name = 'TokenizerFileError';
  }
}

/** The file parsed as a JSON object; undefined when it is absent and `optional`. */
function readJsonObject(path: string, optional: boolean): Obj | undefined {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' && optional) return undefined;
    throw new TokenizerFileError(path, code === 'ENOENT' ? 'missing (every build needs the checkpoint\'s tokenizer)' : `cannot be read (${code ?? (e as Error).message})`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new TokenizerFileError(path, `not valid JSON (${(e as Error).message})`);
  }
  if (!isObject(json)) throw new TokenizerFileError(path, 'not a JSON object');
  return json;
}

/** Token text → id, from model.vocab and added_tokens; checks both are well formed. */
function tokenIds(file: string, tok: Obj): Map<string, number> {
  const model = tok.model;
  if (!isObject(model)) throw new TokenizerFileError(file, 'has no "model" object');
  const type = model.type;
  if (type !== undefined && typeof type !== 'string') throw new TokenizerFileError(file, `model.type is ${JSON.stringify(type)}, not a string`);
  const ids = new Map<string, number>();
  const vocab = model.vocab;
  const isId = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;
  if (isObject(vocab)) {
    for (const [text, id] of Object.entries(vocab)) {
      if (!isId(id)) throw new TokenizerFileError(file, `model.vocab entry ${JSON.stringify(text)} has id ${JSON.stringify(id)}, not a non-negative integer`);
      ids.set(text, id);
    }
  } else if (Array.isArray(vocab)) {
    // Unigram: [piece, score] pairs, the id being the position.
    vocab.forEach((e, i) => {
      if (!Array.isArray(e) || typeof e[0] !== 'string') throw new TokenizerFileError(file, `model.vocab[${i}] is not a [piece, score] pair`);
      ids.set(e[0], i);
    });
  } else {
    throw new TokenizerFileError(file, 'model has no "vocab"');
  }
  if (ids.size === 0) throw new TokenizerFileError(file, 'model.vocab is empty');
  if (type === 'BPE' && !Array.isArray(model.merges)) throw new TokenizerFileError(file, 'a BPE model without a "merges" list');
  const added = tok.added_tokens ?? [];
  if (!Array.isArray(added)) throw new TokenizerFileError(file, 'added_tokens is not a list');
  added.forEach((a, i) => {
    if (!isObject(a) || !isId(a.id) || typeof a.content !== 'string') throw new TokenizerFileError(file, `added_tokens[${i}] lacks a numeric "id" and a string "content"`);
    ids.set(a.content, a.id);
  });
  return ids;
}

export interface TokenizerCheck {
  vocab: number;
  files: string[];
}

/**
 * tokenizer.json must be there and hold a model with a vocabulary; tokenizer_config.json and
 * generation_config.json are optional, but when present must parse, and the bos/eos tokens the
 * config names must be tokens of tokenizer.json (the bundle looks their ids up there).
 */
export function checkTokenizerFiles(dir: string): TokenizerCheck {
  const tokPath = join(dir, TOKENIZER_JSON);
  const ids = tokenIds(tokPath, readJsonObject(tokPath, false)!);
  const files = [TOKENIZER_JSON];
  const cfgPath = join(dir, TOKENIZER_CONFIG);
  const cfg = readJsonObject(cfgPath, true);
  if (cfg) {
    files.push(TOKENIZER_CONFIG);
    for (const field of ['bos_token', 'eos_token']) {
      const v = cfg[field];
      if (v === undefined || v === null) continue;
      const content = typeof v === 'string' ? v : isObject(v) && typeof v.content === 'string' ? v.content : undefined;
      if (content === undefined) throw new TokenizerFileError(cfgPath, `${field} is ${JSON.stringify(v).slice(0, 80)}, neither a token nor {"content": token}`);
      if (!ids.has(content)) throw new TokenizerFileError(cfgPath, `${field} ${JSON.stringify(content)} is not a token of ${TOKENIZER_JSON}`);
    }
  }
  const genPath = join(dir, GENERATION_CONFIG);
  const gen = readJsonObject(genPath, true);
  if (gen) {
    files.push(GENERATION_CONFIG);
    const eos = gen.eos_token_id;
    if (eos !== undefined && eos !== null && ![eos].flat().every((e) => Number.isSafeInteger(e) && (e as number) >= 0)) {
      throw new TokenizerFileError(genPath, `eos_token_id is ${JSON.stringify(eos).slice(0, 80)}, not a token id or a list of them`);
    }
  }
  return { vocab: ids.size, files };
}
