import { describe, it, expect, beforeAll } from 'vitest';
import { cpSync, mkdtempSync, readFileSync, writeFileSync, truncateSync, statSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { encodeHeader } from '../src/io/safetensors-writer.js';
import { twinDir } from './helpers/twin.js';

// A build over a damaged checkpoint fails with one error naming the file and tensor, and writes no bundle.
let work: string;
let twin: string;
let recipes: string;

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'forge-bad-'));
  twin = join(work, 'twin');
  cpSync(await twinDir('qwen3'), twin, { recursive: true }); // a copy: the tests damage files of it
  recipes = join(work, 'recipes');
}, 300_000);

function localRecipe(id: string, dir: string) {
  const r = JSON.parse(readFileSync('recipes/tiny-qwen3/recipe.json', 'utf8'));
  r.id = id;
  r.source = { kind: 'local', path: dir };
  mkdirSync(join(recipes, id), { recursive: true });
  writeFileSync(join(recipes, id, 'recipe.json'), JSON.stringify(r));
}

async function buildDamaged(id: string, damage: (dir: string) => void) {
  const dir = join(work, id);
  cpSync(twin, dir, { recursive: true });
  damage(dir);
  localRecipe(id, dir);
  const prev = process.env.FORGE_RECIPES;
  process.env.FORGE_RECIPES = recipes;
  try {
    const out = join(work, 'out', id);
    const record = await build({ recipe: id, arch: 'v81', out, progress: silentProgress });
    return { record, out };
  } finally {
    process.env.FORGE_RECIPES = prev;
  }
}

describe('a damaged checkpoint', () => {
  it('truncated: names the file, and no bundle is written', async () => {
    const { record, out } = await buildDamaged('truncated', (d) => truncateSync(join(d, 'model.safetensors'), statSync(join(d, 'model.safetensors')).size - 1000));
    expect(record.ok).toBe(false);
    expect(record.error).toMatch(/model\.safetensors/);
    expect(readdirSync(out)).toEqual(['build']); // nothing but the run record and its logs
    expect(JSON.parse(readFileSync(join(out, 'build', 'run.json'), 'utf8')).ok).toBe(false);
  });

  it('a tensor missing: names the tensor', async () => {
    const { record } = await buildDamaged('missing', (d) => {
      // Rewrite the header so one layer's weight is renamed away.
      const file = join(d, 'model.safetensors');
      const bytes = readFileSync(file);
      const n = Number(bytes.readBigUInt64LE(0));
      const header = JSON.parse(bytes.subarray(8, 8 + n).toString('utf8'));
      header['model.layers.1.mlp.up_proj.renamed'] = header['model.layers.1.mlp.up_proj.weight'];
      delete header['model.layers.1.mlp.up_proj.weight'];
      const h = encodeHeader(header);
      writeFileSync(file, Buffer.concat([h, bytes.subarray(8 + n)]));
    });
    expect(record.ok).toBe(false);
    expect(record.error).toMatch(/model\.layers\.1\.mlp\.up_proj\.weight/);
  });

  it('tokenizer.json missing: fetch fails naming the file (not a traceback in the trace)', async () => {
    const { record } = await buildDamaged('no-tokenizer', (d) => rmSync(join(d, 'tokenizer.json')));
    expect(record.ok).toBe(false);
    expect(record.error).toMatch(/^fetch: .*no-tokenizer\/tokenizer\.json: missing/);
    expect(record.stages.find((s) => s.name === 'trace')?.status).not.toBe('ran');
  });

  it('a tokenizer.json the bundle stage could not read its special tokens from: fetch fails, not the bundle after the compile', async () => {
    const { record } = await buildDamaged('unigram-vocab', (d) => {
      const tok = JSON.parse(readFileSync(join(d, 'tokenizer.json'), 'utf8'));
      tok.model.vocab = Object.keys(tok.model.vocab).map((piece) => [piece, 0]); // a Unigram-style list
      writeFileSync(join(d, 'tokenizer.json'), JSON.stringify(tok));
    });
    expect(record.ok).toBe(false);
    expect(record.error).toMatch(/^fetch: .*unigram-vocab\/tokenizer\.json.*model\.vocab/);
    expect(record.stages.find((s) => s.name === 'compile')?.status).not.toBe('ran');
  });

  it('a tensor whose shape disagrees with config.json: names tensor, file and both shapes', async () => {
    const { record } = await buildDamaged('shape', (d) => {
      const cfg = JSON.parse(readFileSync(join(d, 'config.json'), 'utf8'));
      cfg.intermediate_size += 8;
      writeFileSync(join(d, 'config.json'), JSON.stringify(cfg));
    });
    expect(record.ok).toBe(false);
    expect(record.error).toMatch(/tensor model\.layers\.0\.mlp\.gate_proj\.weight in file .*model\.safetensors has shape \[\d+,64\], config expects \[\d+,64\]/);
  });
});
