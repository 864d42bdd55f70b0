// Fuzz: the TS manifest contract (ManifestSchema, which every manifest forge writes is checked
// against) with 10,000 seeded mutations of a valid manifest. forge has no TS reader of a bundle's
// manifest.json (the runtime's loader, fuzzed in native/test/test_fuzz.cpp, is the reader), so the
// property here is the schema's own: it answers every input (never throws, never hangs), each
// refusal carries a field path and a message, and what it accepts survives a JSON round trip.
import { describe, expect, it } from 'vitest';
import { ManifestSchema } from '../../src/bundle/manifest.js';
import { FUZZ_CASES, FUZZ_SEED, mutateJsonText, Rng, show } from './mutate.js';
import { SEED } from '../helpers/manifest-seed.js';


describe('fuzz: manifest schema (TS)', () => {
  it('accepts the seed manifest', () => {
    expect(ManifestSchema.safeParse(SEED).success).toBe(true);
  });

  it(`answers every mutated manifest without throwing; refusals name a field, acceptances round-trip (${FUZZ_CASES} cases)`, () => {
    const rng = new Rng(FUZZ_SEED);
    let refused = 0;
    for (let i = 0; i < FUZZ_CASES; i++) {
      const text = mutateJsonText(rng, SEED).toString('utf8');
      let doc: unknown;
      try {
        doc = JSON.parse(text);
      } catch {
        continue; // damaged text: JSON.parse's business, before any schema
      }
      const where = () => `seed ${FUZZ_SEED}, case ${i}: ${show(text)}`;
      let r: ReturnType<typeof ManifestSchema.safeParse>;
      try {
        r = ManifestSchema.safeParse(doc);
      } catch (err) {
        expect.fail(`${where()}: the schema threw ${(err as Error).stack}`);
      }
      if (r.success) {
        expect(JSON.parse(JSON.stringify(r.data)), where()).toEqual(r.data);
      } else {
        refused++;
        const issue = r.error.issues[0];
        // zod's own message may quote an odd key verbatim; what a caller reports by is the path.
        expect(Array.isArray(issue.path) && issue.message.length > 0, `${where()}: ${JSON.stringify(issue)}`).toBe(true);
      }
    }
    console.log(`fuzz manifest schema: ${FUZZ_CASES} cases, ${refused} refused, seed ${FUZZ_SEED}`);
    expect(refused).toBeGreaterThan(FUZZ_CASES / 2);
  });
});
