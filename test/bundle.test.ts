import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import { build } from '../src/build.js';
import { loadRecipe } from '../src/recipe/load.js';
import { silentProgress } from '../src/engine/progress.js';
import type { RunRecord } from '../src/engine/record.js';
import { compareBundles } from '../src/bundle/compare.js';
import { NONDETERMINISTIC_QNN_BINARY } from '../src/bundle/manifest.js';
import { fmtMargin } from '../src/bundle/confidence.js';
import { forge } from './helpers/forge-cli.js';

// Two builds: one on this run's cache (made cold when the run started, by whichever test first
// built tiny-qwen3), one from a clean cache of its own. Every stage of both ran from nothing, in
// two processes' caches: what differs between them is what a clean rebuild changes.
let a: RunRecord;
let b: RunRecord;
const buildTwin = () => build({ recipe: 'tiny-qwen3', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-bundle-')), progress: silentProgress });
async function cleanBuild(): Promise<RunRecord> {
  const prev = process.env.FORGE_CACHE;
  const cache = mkdtempSync(join(tmpdir(), 'forge-bundle-cache-'));
  process.env.FORGE_CACHE = cache;
  try {
    return await buildTwin();
  } finally {
    process.env.FORGE_CACHE = prev;
    rmSync(cache, { recursive: true, force: true });
  }
}

beforeAll(async () => {
  a = await buildTwin();
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
    expect(card).toContain(`teacher-forced on Hugging Face's tokens): pass. Rule: ${parity.rule}.`);
    for (const [v, name] of [['export', 'fp32 reference'], ['quantize', 'shipped (w8)']]) {
      const r = parity.variants[v];
      expect(card).toContain(`| ${name} | ${r.total - r.mismatches}/${r.total} | ${r.ties} (${parity.maxTies}) | ${r.tieMargin.toExponential(2)} |`);
    }
    for (const [g, e] of Object.entries((a.gates.oracle as any).graphs) as Array<[string, any]>) {
      expect(card).toContain(`| ${g} | ${e.minCosine.toFixed(7)} | ${e.top1 ?? '-'} |`);
    }
    expect(card).toContain('no device figure was measured for this bundle');
    expect(card).toContain('soc_model 87');
    expect(card).not.toMatch(/\d+\.\d+ ms/); // host timings live in build/report.md, not in the card
  });

  it('says on its card and in its run record how many bytes a decode step moves: the planned weights, the whole K/V caches, the rest', () => {
    const card = readFileSync(join(a.bundle!, 'README.md'), 'utf8');
    const plan = a.summaries.plan as any;
    const m = JSON.parse(readFileSync(join(a.bundle!, 'manifest.json'), 'utf8'));
    // The twin's K/V caches: per layer K and V, [kvHeads, maxContext, headDim] float32, read whole at every position.
    const kv = m.contexts.flatMap((c: any) => c.graphs).filter((g: any) => g.role === 'decode').flatMap((g: any) => g.inputs).filter((i: any) => i.bind === 'state' && /^past_[kv]_/.test(i.name));
    expect(kv.length).toBeGreaterThan(0);
    const kvBytes = kv.reduce((s: number, i: any) => s + i.shape.reduce((x: number, y: number) => x * y, 1) * 4, 0);
    const perToken = (a.summaries.bundle as any).decodeBytesPerToken;
    expect(Object.keys(perToken)).toEqual(['128', '256']); // 128, 512, 2048 and maxContext, within maxContext 256
    // Weights (the plan's contexts) and caches are most of it; masks, hand-offs and logits the rest.
    const rest = perToken['128'] - plan.totalContextBytes - kvBytes;
    expect(rest).toBeGreaterThan(0);
    expect(rest).toBeLessThan(0.05 * perToken['128']);
    expect(perToken['256']).toBe(perToken['128']); // caches read whole: the same at every position, as built
    expect(card).toContain('**Bytes per decode token** (counted from the plan and the graphs, not measured on a device');
    expect(card).toMatch(/\| 128 \| \d+\.\d kB \| \d+\.\d kB \| \d+\.\d kB \| \d+\.\d kB \|/);
  });

  it('has a card and a report that show the trace\'s margin distribution beside each precision\'s largest logit error', () => {
    const card = readFileSync(join(a.bundle!, 'README.md'), 'utf8');
    const md = readFileSync(join(a.bundle!, 'build', 'report.md'), 'utf8');
    const m = (a.summaries.trace as any).margins;
    const logitError = (a.gates.oracle as any).logitError;
    expect(card).toContain(`margin at each of the ${m.count} greedy steps the gates trace (${loadRecipe('tiny-qwen3').recipe.gates.prompts.length} prompts): min ${fmtMargin(m.min)}, p5 ${fmtMargin(m.p5)}, median ${fmtMargin(m.p50)}, max ${fmtMargin(m.max)}; ${m.below_fp16_spacing} below 0.00391`);
    expect(md).toContain(`| ${m.count} | ${fmtMargin(m.min)} | ${fmtMargin(m.p5)} | ${fmtMargin(m.p50)} | ${fmtMargin(m.max)} | ${m.below_fp16_spacing} | ${m.below_0_1} |`);
    for (const [name, input] of [['fp32 reference', 'export'], ['shipped (w8)', 'quantize']]) {
      const chain: string[] = (a.gates.oracle as any).logitChain[input];
      expect(chain.at(-1)).toBe('lm_head');
      const line = `| ${name} | oracle gate (ONNX Runtime CPU, each step end to end on the traced tokens and caches) | ${chain.join(', ')} | ${logitError[input].toExponential(2)} |`;
      expect(card).toContain(line);
      expect(md).toContain(line);
    }
    expect(card).toMatch(new RegExp(`\\| shipped \\(w8\\) \\| emulation gate \\(x86 HTP simulator, fp16 activations, teacher-forced\\) \\| lm_head \\| \\d\\.\\d\\de-\\d+ \\| \\d+/${m.count} \\|`));
  });

  it('is byte-identical across clean builds except the context binaries, which its manifest declares nondeterministic and why', async () => {
    const r = await compareBundles(a.bundle!, b.bundle!);
    expect(r.differences).toEqual([]);
    expect(r.same).toBe(true);
    expect(r.files).toBe(bundleFiles(a).length);
    // Exactly the QNN context binaries are exempt from the byte comparison, each declared so with the reason.
    expect(r.nondeterministic).toEqual(['lm_head.bin', 'shard0.bin']);
    const m = JSON.parse(readFileSync(join(a.bundle!, 'manifest.json'), 'utf8'));
    for (const c of m.contexts) expect(c.files[0].nondeterministic).toEqual({ why: NONDETERMINISTIC_QNN_BINARY, describeSha256: expect.stringMatching(/^[0-9a-f]{64}$/) });
  });

  describe('forge compare', () => {
    // Each case: a copy of bundle b with one change; the comparison with a must name it.
    const copies: string[] = [];
    afterAll(() => { for (const d of copies) rmSync(d, { recursive: true, force: true }); });
    const changed = (edit: (dir: string) => void): string => {
      const dir = mkdtempSync(join(tmpdir(), 'forge-bundle-copy-'));
      copies.push(dir);
      cpSync(b.bundle!, dir, { recursive: true });
      edit(dir);
      return dir;
    };
    const flipByte = (file: string, at: number) => {
      const buf = readFileSync(file);
      buf[at] ^= 0xff;
      writeFileSync(file, buf);
    };
    const editManifest = (dir: string, f: (m: any) => void) => {
      const m = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
      f(m);
      writeFileSync(join(dir, 'manifest.json'), JSON.stringify(m, null, 2) + '\n');
    };

    it('names a flipped byte in any deterministic file, with its offset', async () => {
      for (const f of ['embedding.f16.bin', 'shard0.decode_ctx.onnx', 'tokenizer.json', 'README.md']) {
        const dir = changed((d) => flipByte(join(d, f), 7));
        expect((await compareBundles(a.bundle!, dir)).differences, f).toEqual([{ file: f, what: 'first differing byte at offset 7' }]);
      }
    });

    it('still checks each nondeterministic binary against the sha256 its own manifest records', async () => {
      const dir = changed((d) => flipByte(join(d, 'shard0.bin'), 1000));
      const r = await compareBundles(a.bundle!, dir);
      expect(r.same).toBe(false);
      expect(r.differences).toEqual([
        { file: 'shard0.bin', what: `${join(dir, 'shard0.bin')} does not match the sha256 its manifest records` },
        { file: 'SHA256SUMS', what: `${join(dir, 'SHA256SUMS')}: the sha256 of shard0.bin is not that file's` },
      ]);
    });

    it('compares manifest.json exactly except the nondeterministic binaries\' sha256', async () => {
      const dir = changed((d) => editManifest(d, (m) => { m.tokenizer.sha256 = 'a'.repeat(64); }));
      const r = await compareBundles(a.bundle!, dir);
      expect(r.differences.map((x) => x.file)).toEqual(['SHA256SUMS', 'manifest.json']);
      // SHA256SUMS: its manifest.json line no longer matches the edited file.
      expect(r.differences[0].what).toBe(`${join(dir, 'SHA256SUMS')}: the sha256 of manifest.json is not that file's`);
      expect(r.differences[1].what).toMatch(/^differs outside the sha256s that vary with the nondeterministic files: line \d+: .* vs .*\\"sha256\\": \\"a{64}\\"/);
    });

    it('checks the SHA256SUMS lines it blanks (a binary\'s, manifest.json\'s) against the files they name', async () => {
      const dir = changed((d) => {
        const sums = readFileSync(join(d, 'SHA256SUMS'), 'utf8').replace(/^[0-9a-f]{64}(?=  shard0\.bin$)/m, 'e'.repeat(64));
        writeFileSync(join(d, 'SHA256SUMS'), sums);
      });
      expect((await compareBundles(a.bundle!, dir)).differences).toEqual([{ file: 'SHA256SUMS', what: `${join(dir, 'SHA256SUMS')}: the sha256 of shard0.bin is not that file's` }]);
    });

    it('refuses an exemption only one side declares, and binaries whose description differs', async () => {
      const undeclared = changed((d) => editManifest(d, (m) => { delete m.contexts[1].files[0].nondeterministic; }));
      expect((await compareBundles(a.bundle!, undeclared)).differences.map((x) => `${x.file}: ${x.what}`)).toEqual(expect.arrayContaining([
        `lm_head.bin: declared nondeterministic in ${a.bundle!} only`,
      ]));
      const redescribed = changed((d) => editManifest(d, (m) => { m.contexts[0].files[0].nondeterministic.describeSha256 = 'c'.repeat(64); }));
      const r = await compareBundles(a.bundle!, redescribed);
      expect(r.differences.some((x) => x.file === 'shard0.bin' && x.what.startsWith('its description differs'))).toBe(true);
    });

    it('names files only one bundle has, and ignores build/ (timings)', async () => {
      const dir = changed((d) => {
        writeFileSync(join(d, 'extra.txt'), 'x');
        writeFileSync(join(d, 'build', 'run.json'), '{}');
      });
      expect((await compareBundles(a.bundle!, dir)).differences).toEqual([{ file: 'extra.txt', what: `only in ${dir}` }]);
    });

    it('is `forge compare`, which exits 1 on a difference', async () => {
      const same = await forge(['compare', a.bundle!, b.bundle!]);
      expect(same.code).toBe(0);
      expect(same.stdout).toContain('same: 11 files, 0 differences; compared by size and description only (declared nondeterministic): lm_head.bin, shard0.bin');
      const dir = changed((d) => flipByte(join(d, 'tokenizer.json'), 3));
      const diff = await forge(['compare', a.bundle!, dir]);
      expect(diff.code).toBe(1);
      expect(diff.stdout).toContain('DIFFERS tokenizer.json: first differing byte at offset 3');
    });
  });

  it('is fully byte-identical when rebuilt over the same cache', async () => {
    const again = await buildTwin();
    const first = await buildTwin();
    for (const f of bundleFiles(first)) expect(readFileSync(join(again.bundle!, f)).equals(readFileSync(join(first.bundle!, f))), f).toBe(true);
  });
});
