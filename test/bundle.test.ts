import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import type { RunRecord } from '../src/engine/record.js';

// Two builds from two clean caches.
let a: RunRecord;
let b: RunRecord;
async function cleanBuild(): Promise<RunRecord> {
  const prev = process.env.FORGE_CACHE;
  const cache = mkdtempSync(join(tmpdir(), 'forge-bundle-cache-'));
  process.env.FORGE_CACHE = cache;
  try {
    return await build({ recipe: 'tiny-qwen3', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-bundle-')), progress: silentProgress });
  } finally {
    process.env.FORGE_CACHE = prev;
    rmSync(cache, { recursive: true, force: true });
  }
}

beforeAll(async () => {
  a = await cleanBuild();
  b = await cleanBuild();
}, 1_200_000);

const bundleFiles = (r: RunRecord) => readdirSync(r.bundle!).filter((f) => f !== 'build').sort();

describe('bundle', () => {
  it('is flat and complete: manifest, context binaries with wrappers, embedding, tokenizer, card, checksums', () => {
    expect(a.ok).toBe(true);
    expect(bundleFiles(a)).toEqual(['README.md', 'SHA256SUMS', 'embedding.f16.bin', 'lm_head.bin', 'lm_head_ctx.onnx', 'manifest.json', 'shard0.bin', 'shard0.decode_ctx.onnx', 'shard0.prefill_ctx.onnx', 'tokenizer.json', 'tokenizer_config.json']);
    const m = JSON.parse(readFileSync(join(a.bundle!, 'manifest.json'), 'utf8'));
    expect(m.contexts[0].graphs.map((g: any) => g.qnn.binary)).toEqual(['shard0.bin', 'shard0.bin']);
    expect(m.contexts[0].graphs[0].file).toBeUndefined(); // a device bundle carries no ONNX weights twice
  });

  it("has a build report that shows each compiled context's size against the ceiling", () => {
    const md = readFileSync(join(a.bundle!, 'build', 'report.md'), 'utf8');
    const bytes = (name: string) => statSync(join(a.bundle!, `${name}.bin`)).size;
    expect(md).toContain('Compiled context binaries');
    for (const c of ['shard0', 'lm_head']) expect(md).toContain(`| ${c} | ${(bytes(c) / 1e6).toFixed(1)} MB |`);
  });

  it('verifies with sha256sum -c', async () => {
    const r = await $({ cwd: a.bundle!, quiet: true })`sha256sum -c SHA256SUMS`;
    expect(r.stdout.trim().split('\n').every((l) => l.endsWith(': OK'))).toBe(true);
    expect(r.stdout.trim().split('\n')).toHaveLength(bundleFiles(a).length - 1);
  });

  it('has a model card whose numbers are the run record\'s', () => {
    const card = readFileSync(join(a.bundle!, 'README.md'), 'utf8');
    const parity = a.gates.parity as any;
    expect(card).toContain(`${parity.matched}/${parity.total} tokens equal to Hugging Face`);
    for (const [g, e] of Object.entries((a.gates.oracle as any).graphs) as Array<[string, any]>) {
      expect(card).toContain(`| ${g} | ${e.minCosine.toFixed(7)} | ${e.top1 ?? '-'} |`);
    }
    expect(card).toContain('no device figure was measured for this bundle');
    expect(card).toContain('soc_model 87');
    expect(card).not.toMatch(/\d+\.\d+ ms/); // host timings live in build/report.md, not in the card
  });

  it('is byte-identical across clean builds, except the context binaries the QNN compiler varies', () => {
    expect(bundleFiles(b)).toEqual(bundleFiles(a));
    const varying = new Set(['shard0.bin', 'lm_head.bin', 'manifest.json', 'SHA256SUMS']);
    for (const f of bundleFiles(a).filter((x) => !varying.has(x))) {
      expect(readFileSync(join(b.bundle!, f)).equals(readFileSync(join(a.bundle!, f))), f).toBe(true);
    }
    // The manifests differ only in the binaries' sha256s.
    const mask = (r: RunRecord) => {
      const m = JSON.parse(readFileSync(join(r.bundle!, 'manifest.json'), 'utf8'));
      for (const c of m.contexts) for (const f of c.files) f.sha256 = 'x';
      return m;
    };
    expect(mask(b)).toEqual(mask(a));
  });

  it('is fully byte-identical when rebuilt over the same cache', async () => {
    const again = await build({ recipe: 'tiny-qwen3', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-bundle-')), progress: silentProgress });
    const first = await build({ recipe: 'tiny-qwen3', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-bundle-')), progress: silentProgress });
    for (const f of bundleFiles(first)) expect(readFileSync(join(again.bundle!, f)).equals(readFileSync(join(first.bundle!, f))), f).toBe(true);
  });
});
