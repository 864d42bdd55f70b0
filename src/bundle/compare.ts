// Compares two bundles for reproducibility (`forge compare`): every file byte for
// byte, except the files the manifests declare nondeterministic (the QNN context binaries, see
// below), which are compared on size and on the digest of their own description. Their real sha256
// appears in manifest.json, so manifest.json's own sha256 varies too: both appear in SHA256SUMS.
// manifest.json is compared with exactly those binaries' sha256 blanked, SHA256SUMS with exactly
// their lines and manifest.json's blanked, each blanked hash first checked against the file it
// names on its own side; everything else byte for byte. The run record and reports under build/
// hold timings and are not part of the bundle.
import { existsSync, readFileSync, statSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { listFiles, sha256OfFile } from '../engine/hash.js';
import { ManifestSchema, type Manifest } from './manifest.js';
import { MANIFEST } from './assemble.js';
import { SUMS } from './bundle-stage.js';

const NOT_BUNDLE = new Set(['build']);

export interface BundleDifference {
  file: string;
  what: string;
}

export interface BundleComparison {
  /** No difference outside what the manifests declare nondeterministic. */
  same: boolean;
  differences: BundleDifference[];
  /** Files compared by size and description only, because both manifests declare them nondeterministic. */
  nondeterministic: string[];
  /** Files compared in all (outside build/). */
  files: number;
}

type ManifestFile = Manifest['contexts'][number]['files'][number];

function readManifest(dir: string): { text: string; raw: Manifest; manifest: Manifest } {
  const path = join(dir, MANIFEST);
  if (!existsSync(path)) throw new Error(`${dir} is not a bundle: it has no ${MANIFEST}`);
  const text = readFileSync(path, 'utf8');
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new Error(`${path}: not JSON (${(e as Error).message})`);
  }
  const parsed = ManifestSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new Error(`${path}: ${issue.path.join('.') || '(root)'}: ${issue.message}`);
  }
  // `raw` keeps the file's key order (the parsed copy follows the schema's).
  return { text, raw: raw as Manifest, manifest: parsed.data };
}

function nondeterministicFiles(m: Manifest): Map<string, ManifestFile> {
  return new Map(m.contexts.flatMap((c) => c.files).filter((f) => f.nondeterministic).map((f) => [f.path, f]));
}

/** The manifest as text with the real sha256 of the named files blanked (everything else untouched). */
function blankedManifest(m: Manifest, files: Set<string>): string {
  const copy = structuredClone(m);
  for (const c of copy.contexts) for (const f of c.files) if (files.has(f.path)) f.sha256 = '-'.repeat(64);
  return JSON.stringify(copy, null, 2) + '\n';
}

/** SHA256SUMS with the lines of `files` blanked, after checking each against the file in `dir`. */
async function blankedSums(dir: string, files: Set<string>, differences: BundleDifference[], hash: (path: string) => Promise<string>): Promise<string> {
  const lines = readFileSync(join(dir, SUMS), 'utf8').split('\n');
  const out: string[] = [];
  for (const line of lines) {
    const m = /^([0-9a-f]{64}) {2}(.+)$/.exec(line);
    if (!m || !files.has(m[2])) {
      out.push(line);
      continue;
    }
    if (!existsSync(join(dir, m[2])) || (await hash(join(dir, m[2]))) !== m[1]) {
      differences.push({ file: SUMS, what: `${join(dir, SUMS)}: the sha256 of ${m[2]} is not that file's` });
    }
    out.push(`${'-'.repeat(64)}  ${m[2]}`);
  }
  return out.join('\n');
}

/** Offset of the first byte where the two files differ (they have the same size), or null. */
async function firstDifference(a: string, b: string): Promise<number | null> {
  const [fa, fb] = await Promise.all([open(a, 'r'), open(b, 'r')]);
  try {
    const size = 1 << 20;
    const ba = Buffer.alloc(size);
    const bb = Buffer.alloc(size);
    for (let pos = 0; ; pos += size) {
      const [ra, rb] = await Promise.all([fa.read(ba, 0, size, pos), fb.read(bb, 0, size, pos)]);
      const n = Math.min(ra.bytesRead, rb.bytesRead);
      for (let i = 0; i < n; i++) if (ba[i] !== bb[i]) return pos + i;
      if (ra.bytesRead !== rb.bytesRead) return pos + n;
      if (n === 0) return null;
    }
  } finally {
    await Promise.all([fa.close(), fb.close()]);
  }
}

function firstLineDifference(a: string, b: string): string {
  const la = a.split('\n');
  const lb = b.split('\n');
  for (let i = 0; i < Math.max(la.length, lb.length); i++) {
    if (la[i] !== lb[i]) return `line ${i + 1}: ${JSON.stringify(la[i] ?? '(none)')} vs ${JSON.stringify(lb[i] ?? '(none)')}`;
  }
  return 'same lines';
}

/**
 * Compares bundle `a` with bundle `b`. Exact everywhere except the context binaries both manifests
 * declare nondeterministic (same declaration on both sides, same size, same description digest);
 * each of those must still match the sha256 its own manifest records.
 */
export async function compareBundles(a: string, b: string): Promise<BundleComparison> {
  // The exempt binaries (GBs at real size) are hashed against their manifest and their SHA256SUMS
  // line: once each.
  const hashes = new Map<string, Promise<string>>();
  const hash = (path: string) => hashes.get(path) ?? hashes.set(path, sha256OfFile(path)).get(path)!;
  const ma = readManifest(a);
  const mb = readManifest(b);
  const differences: BundleDifference[] = [];
  const [filesA, filesB] = await Promise.all([listFiles(a, NOT_BUNDLE), listFiles(b, NOT_BUNDLE)]);
  for (const f of filesA) if (!filesB.includes(f)) differences.push({ file: f, what: `only in ${a}` });
  for (const f of filesB) if (!filesA.includes(f)) differences.push({ file: f, what: `only in ${b}` });

  const ndA = nondeterministicFiles(ma.manifest);
  const ndB = nondeterministicFiles(mb.manifest);
  const exempt = new Set([...ndA.keys()].filter((f) => ndB.has(f)));
  for (const f of new Set([...ndA.keys(), ...ndB.keys()])) {
    if (!exempt.has(f)) differences.push({ file: f, what: `declared nondeterministic in ${ndA.has(f) ? a : b} only` });
  }
  for (const f of exempt) {
    const [ea, eb] = [ndA.get(f)!, ndB.get(f)!];
    if (ea.bytes !== eb.bytes) differences.push({ file: f, what: `${ea.bytes} bytes vs ${eb.bytes}` });
    if (ea.nondeterministic!.describeSha256 !== eb.nondeterministic!.describeSha256) {
      differences.push({ file: f, what: `its description differs (describeSha256 ${ea.nondeterministic!.describeSha256} vs ${eb.nondeterministic!.describeSha256})` });
    }
    // Exempt from the cross comparison, not from integrity: each must be what its own manifest says.
    for (const [dir, e] of [[a, ea], [b, eb]] as const) {
      if (!existsSync(join(dir, f))) continue;
      const size = statSync(join(dir, f)).size;
      if (size !== e.bytes) differences.push({ file: f, what: `${join(dir, f)} has ${size} bytes, its manifest says ${e.bytes}` });
      else if ((await hash(join(dir, f))) !== e.sha256) differences.push({ file: f, what: `${join(dir, f)} does not match the sha256 its manifest records` });
    }
  }

  // Parsing must not hide formatting: each manifest must be exactly what re-serialising it gives.
  for (const [dir, m] of [[a, ma], [b, mb]] as const) {
    if (JSON.stringify(JSON.parse(m.text), null, 2) + '\n' !== m.text) differences.push({ file: MANIFEST, what: `${dir}/${MANIFEST} is not in forge's canonical formatting` });
  }
  const common = filesA.filter((f) => filesB.includes(f));
  for (const f of common) {
    if (exempt.has(f)) continue;
    if (f === MANIFEST || f === SUMS) {
      // manifest.json holds the exempt binaries' real sha256, so its own hash varies with them.
      const sumsBlanked = new Set([...exempt, ...(exempt.size ? [MANIFEST] : [])]);
      const [ta, tb] = f === MANIFEST
        ? [blankedManifest(ma.raw, exempt), blankedManifest(mb.raw, exempt)]
        : [await blankedSums(a, sumsBlanked, differences, hash), await blankedSums(b, sumsBlanked, differences, hash)];
      if (ta !== tb) differences.push({ file: f, what: `differs outside the sha256s that vary with the nondeterministic files: ${firstLineDifference(ta, tb)}` });
      continue;
    }
    const [sa, sb] = [statSync(join(a, f)).size, statSync(join(b, f)).size];
    if (sa !== sb) {
      differences.push({ file: f, what: `${sa} bytes vs ${sb}` });
      continue;
    }
    const at = await firstDifference(join(a, f), join(b, f));
    if (at !== null) differences.push({ file: f, what: `first differing byte at offset ${at}` });
  }
  return { same: differences.length === 0, differences, nondeterministic: [...exempt].sort(), files: common.length };
}
