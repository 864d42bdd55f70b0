import { copyFile, mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { INDEX_FILE_NAME, SINGLE_FILE_NAME, openCheckpoint } from '../../src/io/checkpoint.js';
import { CheckpointError } from '../../src/io/errors.js';
import { f32ToBf16Array, f32ToF16Array } from '../../src/io/dtype.js';
import { writeSafetensors, type TensorWithData } from '../../src/io/safetensors-writer.js';
import { expectCheckpointError, tempDir } from './helpers.js';

// A 5×4 embedding with row r, column c = r + c/4: every value exact in bf16/f16.
const EMBEDDING = Float32Array.from({ length: 20 }, (_, i) => Math.floor(i / 4) + (i % 4) / 4);

function tensor(name: string, dtype: 'F32' | 'BF16' | 'F16', shape: number[], values: Float32Array): TensorWithData {
  const data = dtype === 'F32' ? values : dtype === 'BF16' ? f32ToBf16Array(values) : f32ToF16Array(values);
  return { name, dtype, shape, data };
}

async function writeIndex(dir: string, weightMap: Record<string, string>): Promise<void> {
  await writeFile(join(dir, INDEX_FILE_NAME), JSON.stringify({ metadata: { total_size: 1234 }, weight_map: weightMap }));
}

/** Two shards: embed + norm in shard 1, lm_head in shard 2. */
async function shardedCheckpoint(): Promise<string> {
  const dir = await tempDir();
  await writeSafetensors(join(dir, 'model-00001-of-00002.safetensors'), [
    tensor('model.embed_tokens.weight', 'BF16', [5, 4], EMBEDDING),
    tensor('model.norm.weight', 'F32', [4], Float32Array.of(1, 2, 3, 4)),
  ]);
  await writeSafetensors(join(dir, 'model-00002-of-00002.safetensors'), [tensor('lm_head.weight', 'F16', [5, 4], EMBEDDING)]);
  await writeIndex(dir, {
    'lm_head.weight': 'model-00002-of-00002.safetensors',
    'model.embed_tokens.weight': 'model-00001-of-00002.safetensors',
    'model.norm.weight': 'model-00001-of-00002.safetensors',
  });
  return dir;
}

describe('a single-file checkpoint', () => {
  it('lists tensors, reports info, and reads any dtype as f32, f16 bits or raw bytes', async () => {
    const dir = await tempDir();
    await writeSafetensors(join(dir, SINGLE_FILE_NAME), [
      tensor('w.bf16', 'BF16', [5, 4], EMBEDDING),
      tensor('w.f16', 'F16', [20], EMBEDDING),
      tensor('w.f32', 'F32', [2, 10], EMBEDDING),
    ]);
    const ckpt = await openCheckpoint(dir);
    try {
      expect(ckpt.names()).toEqual(['w.bf16', 'w.f16', 'w.f32']);
      expect(ckpt.files).toEqual([join(dir, SINGLE_FILE_NAME)]);
      expect(ckpt.info('w.bf16')).toMatchObject({ dtype: 'BF16', shape: [5, 4], byteLength: 40, file: join(dir, SINGLE_FILE_NAME) });
      for (const name of ckpt.names()) {
        expect(await ckpt.readF32(name)).toEqual(EMBEDDING);
        expect(await ckpt.readF16(name)).toEqual(f32ToF16Array(EMBEDDING));
      }
      expect(new Uint16Array((await ckpt.readRaw('w.bf16')).buffer, 0, 20)).toEqual(f32ToBf16Array(EMBEDDING));
    } finally {
      await ckpt.close();
    }
    // A path to the .safetensors file itself works too.
    const direct = await openCheckpoint(join(dir, SINGLE_FILE_NAME));
    expect(direct.names()).toHaveLength(3);
    await direct.close();
  });

  it('converts through a small scratch buffer with the same result (chunk boundaries mid-row)', async () => {
    const dir = await tempDir();
    await writeSafetensors(join(dir, SINGLE_FILE_NAME), [tensor('w', 'BF16', [5, 4], EMBEDDING)]);
    const ckpt = await openCheckpoint(dir, { scratchBytes: 6 });
    expect(await ckpt.readF32('w')).toEqual(EMBEDDING);
    expect(await ckpt.readF16('w')).toEqual(f32ToF16Array(EMBEDDING));
    expect(await ckpt.readRows('w', 1, 3)).toEqual(EMBEDDING.subarray(4, 16));
    await ckpt.close();
  });

  it('names the file and tensor when a tensor is missing', async () => {
    const dir = await tempDir();
    const file = join(dir, SINGLE_FILE_NAME);
    await writeSafetensors(file, [tensor('w', 'F32', [1], Float32Array.of(1))]);
    const ckpt = await openCheckpoint(dir);
    await expectCheckpointError(ckpt.readF32('model.layers.0.mlp.up_proj.weight'), {
      file,
      tensor: 'model.layers.0.mlp.up_proj.weight',
      pattern: /no such tensor/,
    });
    await ckpt.close();
  });

  it('refuses a directory with neither model.safetensors nor an index', async () => {
    const dir = await tempDir();
    await expectCheckpointError(openCheckpoint(dir), { file: dir, pattern: /not a checkpoint/ });
  });
});

describe('expectShape', () => {
  it('passes on a match and otherwise says which tensor, which file, what it is and what config wants', async () => {
    const dir = await shardedCheckpoint();
    const ckpt = await openCheckpoint(dir);
    expect(ckpt.expectShape('model.embed_tokens.weight', [5, 4]).dtype).toBe('BF16');
    const file = join(dir, 'model-00001-of-00002.safetensors');
    const err = await expectCheckpointError(() => ckpt.expectShape('model.embed_tokens.weight', [4, 5]), {
      file,
      tensor: 'model.embed_tokens.weight',
    });
    expect(err.message).toBe(`tensor model.embed_tokens.weight in file ${file} has shape [5,4], config expects [4,5]`);
    expect(() => ckpt.expectShape('model.norm.weight', [4, 1])).toThrow('has shape [4], config expects [4,1]');
    await ckpt.close();
  });
});

describe('reading rows', () => {
  it('reads any run of rows of a multi-row tensor, in every output format', async () => {
    const ckpt = await openCheckpoint(await shardedCheckpoint());
    const name = 'model.embed_tokens.weight';
    expect(ckpt.rowCount(name)).toBe(5);
    expect(await ckpt.readRows(name, 1, 2)).toEqual(Float32Array.of(1, 1.25, 1.5, 1.75, 2, 2.25, 2.5, 2.75));
    expect(await ckpt.readRows(name, 4, 1)).toEqual(EMBEDDING.subarray(16));
    expect(await ckpt.readRows(name, 5, 0)).toEqual(new Float32Array(0));
    expect(await ckpt.readRowsF16('lm_head.weight', 2, 2)).toEqual(f32ToF16Array(EMBEDDING.subarray(8, 16)));
    const raw = await ckpt.readRowsRaw(name, 3, 1);
    expect(new Uint16Array(raw.buffer, raw.byteOffset, 4)).toEqual(f32ToBf16Array(EMBEDDING.subarray(12, 16)));
    expect(await ckpt.readRows('model.norm.weight', 1, 2)).toEqual(Float32Array.of(2, 3)); // 1-D: a row is an element
    await ckpt.close();
  });

  it('fills a caller-owned buffer with whole rows, and refuses a partial row', async () => {
    const dir = await shardedCheckpoint();
    const ckpt = await openCheckpoint(dir);
    const dst = new Float32Array(8);
    expect(await ckpt.readRowsInto('model.embed_tokens.weight', 3, dst)).toBe(dst);
    expect(dst).toEqual(EMBEDDING.subarray(12, 20));
    await expectCheckpointError(ckpt.readRowsInto('model.embed_tokens.weight', 0, new Float32Array(6)), {
      file: join(dir, 'model-00001-of-00002.safetensors'),
      tensor: 'model.embed_tokens.weight',
      pattern: /not a whole number of 4-value rows/,
    });
    const raw = new Uint8Array(16);
    expect(await ckpt.readRowsRawInto('model.embed_tokens.weight', 2, raw)).toBe(raw);
    expect(new Uint16Array(raw.buffer)).toEqual(f32ToBf16Array(EMBEDDING.subarray(8, 16)));
    await expectCheckpointError(ckpt.readRowsRawInto('model.embed_tokens.weight', 0, new Uint8Array(6)), {
      file: join(dir, 'model-00001-of-00002.safetensors'),
      tensor: 'model.embed_tokens.weight',
      pattern: /not a whole number of 8-byte rows/,
    });
    await expectCheckpointError(ckpt.readRowsRawInto('model.embed_tokens.weight', 4, new Uint8Array(16)), {
      file: join(dir, 'model-00001-of-00002.safetensors'),
      tensor: 'model.embed_tokens.weight',
      pattern: /outside shape/,
    });
    await ckpt.close();
  });

  it('iterates a tensor in row chunks that cover it exactly once', async () => {
    const ckpt = await openCheckpoint(await shardedCheckpoint());
    const chunks: { rowStart: number; rowCount: number }[] = [];
    const seen: number[] = [];
    for await (const chunk of ckpt.iterRows('model.embed_tokens.weight', { rowsPerChunk: 2 })) {
      chunks.push({ rowStart: chunk.rowStart, rowCount: chunk.rowCount });
      seen.push(...chunk.data);
    }
    expect(chunks).toEqual([
      { rowStart: 0, rowCount: 2 },
      { rowStart: 2, rowCount: 2 },
      { rowStart: 4, rowCount: 1 },
    ]);
    expect(Float32Array.from(seen)).toEqual(EMBEDDING);
    // A byte budget smaller than one row still makes progress, one row at a time.
    let count = 0;
    for await (const chunk of ckpt.iterRows('model.embed_tokens.weight', { maxChunkBytes: 1 })) count += chunk.rowCount;
    expect(count).toBe(5);
    await ckpt.close();
  });

  it('refuses rows outside the tensor, naming file and tensor', async () => {
    const dir = await shardedCheckpoint();
    const ckpt = await openCheckpoint(dir);
    await expectCheckpointError(ckpt.readRows('model.embed_tokens.weight', 4, 2), {
      file: join(dir, 'model-00001-of-00002.safetensors'),
      tensor: 'model.embed_tokens.weight',
      pattern: /rows \[4,6\) are outside shape \[5,4\]/,
    });
    await ckpt.close();
  });
});

describe('a sharded checkpoint', () => {
  it('routes each tensor to its shard, in index order, and exposes the index metadata', async () => {
    const dir = await shardedCheckpoint();
    const ckpt = await openCheckpoint(dir);
    expect(ckpt.names()).toEqual(['lm_head.weight', 'model.embed_tokens.weight', 'model.norm.weight']);
    expect(ckpt.info('lm_head.weight').file).toBe(join(dir, 'model-00002-of-00002.safetensors'));
    expect(ckpt.indexMetadata).toEqual({ total_size: 1234 });
    expect(await ckpt.readF32('lm_head.weight')).toEqual(EMBEDDING);
    expect(await ckpt.readF32('model.norm.weight')).toEqual(Float32Array.of(1, 2, 3, 4));
    expect(ckpt.has('model.norm.weight') && !ckpt.has('nope')).toBe(true);
    await ckpt.close();
  });

  it('prefers model.safetensors when both it and an index exist (as transformers does)', async () => {
    const dir = await shardedCheckpoint();
    await writeSafetensors(join(dir, SINGLE_FILE_NAME), [tensor('only', 'F32', [1], Float32Array.of(9))]);
    const ckpt = await openCheckpoint(dir);
    expect(ckpt.names()).toEqual(['only']);
    await ckpt.close();
  });

  it('a shard file named by the index is missing', async () => {
    const dir = await shardedCheckpoint();
    await writeIndex(dir, { 'model.norm.weight': 'model-00001-of-00002.safetensors', 'extra.weight': 'model-00003-of-00003.safetensors' });
    await expectCheckpointError(openCheckpoint(dir), {
      file: join(dir, 'model-00003-of-00003.safetensors'),
      tensor: 'extra.weight',
      pattern: /shard file is missing/,
    });
  });

  it('a tensor listed in the index is absent from its shard', async () => {
    const dir = await shardedCheckpoint();
    await writeIndex(dir, {
      'lm_head.weight': 'model-00001-of-00002.safetensors', // really in shard 2
      'model.embed_tokens.weight': 'model-00001-of-00002.safetensors',
      'model.norm.weight': 'model-00002-of-00002.safetensors', // really in shard 1
    });
    const err = await expectCheckpointError(openCheckpoint(dir), {
      file: join(dir, 'model-00001-of-00002.safetensors'),
      tensor: 'lm_head.weight',
      pattern: /shard has no such tensor/,
    });
    expect(err.message).toContain('model-00002-of-00002.safetensors'); // says where it actually is
  });

  it('a tensor listed twice in the index weight_map is named as such (JSON would keep the last silently)', async () => {
    const dir = await shardedCheckpoint();
    const index = join(dir, INDEX_FILE_NAME);
    await writeFile(index, `{"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors", "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "model.norm.weight": "model-00001-of-00002.safetensors", "lm_head.weight": "model-00001-of-00002.safetensors"}}`);
    await expectCheckpointError(openCheckpoint(dir), { file: index, tensor: 'lm_head.weight', pattern: /weight_map lists this tensor twice/ });
  });

  it('a tensor present in two shards', async () => {
    const dir = await shardedCheckpoint();
    await writeSafetensors(join(dir, 'model-00002-of-00002.safetensors'), [
      tensor('lm_head.weight', 'F16', [5, 4], EMBEDDING),
      tensor('model.norm.weight', 'F32', [4], Float32Array.of(1, 2, 3, 4)),
    ]);
    const err = await expectCheckpointError(openCheckpoint(dir), {
      file: join(dir, 'model-00002-of-00002.safetensors'),
      tensor: 'model.norm.weight',
      pattern: /also in shard/,
    });
    expect(err.message).toContain(join(dir, 'model-00001-of-00002.safetensors'));
  });

  it('a shard tensor the index does not list', async () => {
    const dir = await shardedCheckpoint();
    await writeSafetensors(join(dir, 'model-00002-of-00002.safetensors'), [
      tensor('lm_head.weight', 'F16', [5, 4], EMBEDDING),
      tensor('lm_head.bias', 'F32', [5], new Float32Array(5)),
    ]);
    await expectCheckpointError(openCheckpoint(dir), {
      file: join(dir, 'model-00002-of-00002.safetensors'),
      tensor: 'lm_head.bias',
      pattern: /not listed in index/,
    });
  });

  it('a corrupt shard fails with the shard’s own error', async () => {
    const dir = await shardedCheckpoint();
    await writeFile(join(dir, 'model-00002-of-00002.safetensors'), Buffer.from('nonsense'));
    const err = await openCheckpoint(dir).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as CheckpointError).file).toBe(join(dir, 'model-00002-of-00002.safetensors'));
  });

  it.each([
    ['not JSON', '{"weight_map": ', /not readable JSON/, undefined],
    ['no weight_map', '{"metadata": {}}', /no "weight_map" object/, undefined],
    ['a non-string shard', '{"weight_map": {"w": 3}}', /not a file name/, 'w'],
    ['a shard outside the directory', '{"weight_map": {"w": "../elsewhere.safetensors"}}', /outside the checkpoint directory/, 'w'],
  ])('an index with %s', async (_label, text, pattern, tensorName) => {
    const dir = await tempDir();
    await writeFile(join(dir, INDEX_FILE_NAME), text);
    await expectCheckpointError(openCheckpoint(dir), { file: join(dir, INDEX_FILE_NAME), tensor: tensorName, pattern });
  });

  it('shards may live in a subdirectory beside the index', async () => {
    const dir = await shardedCheckpoint();
    await mkdir(join(dir, 'shards'));
    await copyFile(join(dir, 'model-00002-of-00002.safetensors'), join(dir, 'shards', 'lm.safetensors'));
    await writeSafetensors(join(dir, 'model-00002-of-00002.safetensors'), []);
    await writeIndex(dir, {
      'lm_head.weight': 'shards/lm.safetensors',
      'model.embed_tokens.weight': 'model-00001-of-00002.safetensors',
      'model.norm.weight': 'model-00001-of-00002.safetensors',
    });
    const ckpt = await openCheckpoint(dir);
    expect(await ckpt.readRows('lm_head.weight', 0, 1)).toEqual(EMBEDDING.subarray(0, 4));
    await ckpt.close();
  });
});
