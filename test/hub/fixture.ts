// Fixture bundles for the publish tests: random bytes where a real bundle has weights, a
// SHA256SUMS over every bundle file, and a build/run.json with the gates a test asks for.
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

export interface FixtureOptions {
  ok?: boolean;
  /** undefined: oracle and parity pass. A gate may carry its figures and inner verdicts (graphs, variants …). */
  gates?: Record<string, { ok: boolean; [figure: string]: unknown }>;
  /** Gates the build names as not run, with why. */
  gatesNotRun?: Record<string, string>;
  /** The gates the recipe asks for, as the run record keeps them; undefined: oracle and parity; null: left out. */
  gatesRequired?: string[] | null;
  /** Further run record fields (status, until, stages …), laid over the rest. */
  record?: Record<string, unknown>;
  /** Leave build/run.json out. */
  noRunRecord?: boolean;
}

export const BUNDLE_FILES = ['README.md', 'embedding.f16.bin', 'manifest.json', 'model.data', 'model.onnx', 'tokenizer.json'];

export function makeBundle(opts: FixtureOptions = {}): string {
  const dir = join(mkdtempSync(join(tmpdir(), 'forge-hub-')), 'out', 'tiny', 'v81');
  mkdirSync(join(dir, 'build'), { recursive: true });
  const files: Record<string, Buffer> = {
    'README.md': Buffer.from(`# tiny\n\nA fixture bundle ${randomBytes(4).toString('hex')}.\n`),
    'manifest.json': Buffer.from(JSON.stringify({ format: 1, graphs: ['model.onnx'], nonce: randomBytes(4).toString('hex') })),
    'tokenizer.json': Buffer.from(JSON.stringify({ model: { vocab: { a: 0, b: 1 } } })),
    'model.onnx': randomBytes(150_000),
    'model.data': randomBytes(400_000),
    'embedding.f16.bin': randomBytes(100_000),
  };
  for (const [p, b] of Object.entries(files)) writeFileSync(join(dir, p), b);
  writeSums(dir);
  if (!opts.noRunRecord) {
    const gates = opts.gates ?? { oracle: { ok: true }, parity: { ok: true } };
    const gatesRequired = opts.gatesRequired === undefined ? ['oracle', 'parity'] : opts.gatesRequired;
    writeFileSync(join(dir, 'build', 'run.json'), JSON.stringify({
      recipe: 'tiny', arch: 'v81', ok: opts.ok ?? true, stages: [], gates, summaries: {}, tools: {}, bundle: dir, seconds: 1,
      ...(opts.gatesNotRun ? { gatesNotRun: opts.gatesNotRun } : {}), ...(gatesRequired ? { gatesRequired } : {}), ...opts.record,
    }));
  }
  return dir;
}

export function writeSums(dir: string, files = BUNDLE_FILES): void {
  const lines = files.map((p) => `${createHash('sha256').update(readFileSync(join(dir, p))).digest('hex')}  ${p}`);
  writeFileSync(join(dir, 'SHA256SUMS'), lines.join('\n') + '\n');
}

/** Rewrites a bundle file (and SHA256SUMS, so the bundle stays consistent). */
export function changeFile(dir: string, path: string, content: Buffer = randomBytes(120_000)): void {
  mkdirSync(dirname(join(dir, path)), { recursive: true });
  writeFileSync(join(dir, path), content);
  writeSums(dir);
}

export const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');
