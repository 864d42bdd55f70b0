// The tokenizer files are checked at fetch, each problem one line naming the file (and field).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeEach, describe, expect, it } from 'vitest';
import { checkTokenizerFiles } from '../../src/hub/tokenizer-files.js';

let dir: string;
const TOKENIZER = { model: { type: 'BPE', vocab: { a: 0, b: 1, ab: 2 }, merges: ['a b'] }, added_tokens: [{ id: 3, content: '<|end|>' }] };
const write = (name: string, v: unknown) => writeFileSync(join(dir, name), typeof v === 'string' ? v : JSON.stringify(v));

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'forge-tok-'));
  write('tokenizer.json', TOKENIZER);
  write('tokenizer_config.json', { eos_token: '<|end|>', bos_token: null });
  write('generation_config.json', { eos_token_id: [3] });
});

/** The check's error, which must be a single line starting with the file's path. */
function refusal(file: string): string {
  let msg = '';
  try { checkTokenizerFiles(dir); } catch (e) { msg = (e as Error).message; }
  expect(msg.startsWith(`${join(dir, file)}: `), msg).toBe(true);
  expect(msg).not.toContain('\n');
  return msg;
}

describe('tokenizer files at fetch', () => {
  it('accepts a plausible tokenizer and says which files it checked', () => {
    expect(checkTokenizerFiles(dir)).toEqual({ vocab: 4, files: ['tokenizer.json', 'tokenizer_config.json', 'generation_config.json'] });
    rmSync(join(dir, 'tokenizer_config.json'));
    rmSync(join(dir, 'generation_config.json'));
    expect(checkTokenizerFiles(dir).files).toEqual(['tokenizer.json']);
  });

  it('refuses a missing tokenizer.json, naming it', () => {
    rmSync(join(dir, 'tokenizer.json'));
    expect(refusal('tokenizer.json')).toMatch(/: missing/);
  });

  it.each([
    ['not JSON', '{"model": {', /not valid JSON/],
    ['a JSON list', '[]', /not a JSON object/],
    ['no model', { added_tokens: [] }, /no "model" object/],
    ['no vocab', { model: { type: 'BPE', merges: [] } }, /model has no "vocab"/],
    ['an empty vocab', { model: { type: 'BPE', vocab: {}, merges: [] } }, /model\.vocab is empty/],
    ['a vocab id that is not an integer', { model: { type: 'BPE', vocab: { a: 'zero' }, merges: [] } }, /model\.vocab entry "a" has id "zero"/],
    ['BPE without merges', { model: { type: 'BPE', vocab: { a: 0 } } }, /BPE model without a "merges" list/],
    ['a broken added token', { ...TOKENIZER, added_tokens: [{ content: 'x' }] }, /added_tokens\[0\] lacks a numeric "id"/],
  ])('refuses a tokenizer.json with %s, naming it', (_what, content, pattern) => {
    write('tokenizer.json', content);
    write('tokenizer_config.json', {});
    expect(refusal('tokenizer.json')).toMatch(pattern);
  });

  it('refuses a tokenizer_config.json that does not parse, or names an eos token tokenizer.json lacks', () => {
    write('tokenizer_config.json', '{');
    expect(refusal('tokenizer_config.json')).toMatch(/not valid JSON/);
    write('tokenizer_config.json', { eos_token: { content: '</s>' } });
    expect(refusal('tokenizer_config.json')).toMatch(/eos_token "<\/s>" is not a token of tokenizer\.json/);
    write('tokenizer_config.json', { bos_token: 7 });
    expect(refusal('tokenizer_config.json')).toMatch(/bos_token is 7, neither a token nor/);
  });

  it('refuses a generation_config.json whose eos_token_id is not a token id', () => {
    write('generation_config.json', { eos_token_id: ['<|end|>'] });
    expect(refusal('generation_config.json')).toMatch(/eos_token_id is \["<\|end\|>"\]/);
  });
});
