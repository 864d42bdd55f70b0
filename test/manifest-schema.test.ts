import { describe, it, expect } from 'vitest';
import { readFileSync } from 'node:fs';
import { manifestJsonSchema } from '../src/bundle/manifest.js';

describe('manifest.schema.json', () => {
  it('is what the zod schema generates (run `npm run manifest-schema` after changing src/bundle/manifest.ts)', () => {
    expect(JSON.parse(readFileSync('src/bundle/manifest.schema.json', 'utf8'))).toEqual(manifestJsonSchema());
  });
});
