// Fuzz: the safetensors header reader against 10,000 seeded mutations of a valid file: header JSON
// changed structurally (dtypes, shapes, offsets that overlap or run past the end, fields dropped,
// wrong types, huge numbers), the 8-byte length prefix rewritten, the file truncated or bit-flipped.
// Every case must open (and then read every tensor), or be refused by a CheckpointError of one line
// naming the file.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CheckpointError } from '../../src/io/errors.js';
import { openSafetensors } from '../../src/io/safetensors.js';
import { encodeHeader } from '../../src/io/safetensors-writer.js';
import { expectClearRefusal, FUZZ_CASES, FUZZ_SEED, mutateBytes, mutateJson, Rng, show } from './mutate.js';

/** A valid header over 52 bytes of data: mixed dtypes, a scalar, an empty tensor, metadata. */
const HEADER = {
  __metadata__: { format: 'pt' },
  'model.embed_tokens.weight': { dtype: 'BF16', shape: [4, 2], data_offsets: [0, 16] },
  'model.norm.weight': { dtype: 'F32', shape: [2], data_offsets: [16, 24] },
  'lm_head.weight': { dtype: 'F16', shape: [2, 3], data_offsets: [24, 36] },
  scale: { dtype: 'F64', shape: [], data_offsets: [36, 44] },
  empty: { dtype: 'I8', shape: [0, 5], data_offsets: [44, 44] },
  ids: { dtype: 'I32', shape: [2], data_offsets: [44, 52] },
};
const DATA = Buffer.from(Array.from({ length: 52 }, (_, i) => i));

function fileBytes(header: unknown, data: Buffer): Buffer {
  return Buffer.concat([encodeHeader(header), data]);
}

/** One case's file: a structural header edit, a rewritten length prefix, or byte damage. */
function mutatedFile(rng: Rng): Buffer {
  switch (rng.below(4)) {
    case 0:
    case 1:
      return fileBytes(mutateJson(rng, HEADER), rng.chance(4) ? DATA.subarray(0, rng.below(DATA.length)) : DATA);
    case 2: {
      const bytes = fileBytes(HEADER, DATA);
      const lengths = [0n, 1n, 7n, 2n ** 63n, 2n ** 64n - 1n, BigInt(bytes.length - 8), BigInt(bytes.length), 100_000_001n];
      bytes.writeBigUInt64LE(rng.pick(lengths), 0);
      return bytes;
    }
    default:
      return mutateBytes(rng, fileBytes(HEADER, DATA));
  }
}

describe('fuzz: safetensors header', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'forge-fuzz-st-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('opens the unmutated seed file and reads every tensor', async () => {
    const path = join(dir, 'seed.safetensors');
    await writeFile(path, fileBytes(HEADER, DATA));
    const st = await openSafetensors(path);
    expect([...st.tensors.keys()].sort()).toEqual(Object.keys(HEADER).filter((k) => k !== '__metadata__').sort());
    await st.close();
  });

  it(`refuses every mutated file with one CheckpointError line naming it, or reads it whole (${FUZZ_CASES} cases)`, async () => {
    const rng = new Rng(FUZZ_SEED);
    const path = join(dir, 'model-00001-of-00001.safetensors');
    let refused = 0;
    for (let i = 0; i < FUZZ_CASES; i++) {
      const bytes = mutatedFile(rng);
      await writeFile(path, bytes);
      try {
        const st = await openSafetensors(path);
        try {
          // What opens must be readable: every tensor lies inside the file.
          for (const name of st.tensors.keys()) await st.read(name);
        } finally {
          await st.close();
        }
      } catch (err) {
        refused++;
        expectClearRefusal(err, CheckpointError, path, () => `case ${i}: ${show(bytes)}`);
      }
    }
    console.log(`fuzz safetensors: ${FUZZ_CASES} cases, ${refused} refused, seed ${FUZZ_SEED}`);
    expect(refused).toBeGreaterThan(FUZZ_CASES / 2);
  });
});
