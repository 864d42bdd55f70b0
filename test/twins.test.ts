import { describe, it, expect } from 'vitest';
import { mkdtempSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { runPython } from '../src/toolchain/python.js';
import { FAMILY_IDS } from '../src/recipe/schema.js';

const FACTORY = resolve('oracles/make_twin.py');
const make = async (family: string, out: string) => JSON.parse((await runPython(FACTORY, ['--family', family, '--out', out])).stdout.trim().split('\n').pop()!);

describe('tiny twins', () => {
  const dir = mkdtempSync(join(tmpdir(), 'forge-twins-'));

  it.each(FAMILY_IDS)('makes a %s twin that reloads and generates, with a tokenizer', async (family) => {
    const out = join(dir, family);
    const r = await make(family, out);
    expect(r.family).toBe(family);
    expect(Object.keys(r.files)).toEqual(expect.arrayContaining(['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']));
    const config = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'));
    const vocab = config.vocab_size ?? config.text_config?.vocab_size;
    const tok = JSON.parse(readFileSync(join(out, 'tokenizer.json'), 'utf8'));
    expect(Object.keys(tok.model.vocab).length + tok.added_tokens.filter((t: any) => !(t.content in tok.model.vocab)).length).toBe(vocab);
    expect(r.params).toBeLessThan(2_000_000);
  });

  it('is byte-identical when made twice', async () => {
    const a = await make('qwen3', join(dir, 'again-a'));
    const b = await make('qwen3', join(dir, 'again-b'));
    expect(a.files).toEqual(b.files);
  });

  it('refuses to write into a non-empty directory and leaves nothing half-written', async () => {
    const taken = join(dir, 'taken');
    mkdirSync(taken);
    writeFileSync(join(taken, 'keep.txt'), 'mine');
    await expect(make('qwen3', taken)).rejects.toThrow(/exists and is not an empty directory/);
    expect(readdirSync(taken)).toEqual(['keep.txt']);
    expect(readdirSync(dir).filter((n) => n.startsWith('.') || n.includes('tmp'))).toEqual([]);
  });
});
