// Qwen3-VL end to end on its tiny twin (a vision tower trained on shapes drawn by code, so images
// change its answers): `forge build tiny-qwen3-vl` for v81 and v79 with every gate — the oracle on
// the vision encoder (each block, the merged image tokens, each DeepStack feature) and on the text
// graphs fed image prompts, host parity N/N in fp32 and W8 through qwen3_vl_generate for two images
// whose continuations differ, the simulator gate on the compiled vision and text contexts, the C++
// image front-end against HF's processor on the card — and the bundle's text-only manifest.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import type { RunRecord } from '../src/engine/record.js';
import { Trace } from '../src/gates/trace.js';
import type { Manifest } from '../src/bundle/manifest.js';
import { TEXT_MANIFEST } from '../src/bundle/assemble.js';

let out = '';
const records: Record<string, RunRecord> = {};
const entry = (r: RunRecord, id: string) => join(cacheRoot(), id, r.stages.find((s) => s.name === id)!.key!);
const bundle = (arch: string) => join(out, arch);
const json = (file: string) => JSON.parse(readFileSync(file, 'utf8'));

beforeAll(async () => {
  out = mkdtempSync(join(tmpdir(), 'forge-qwen3-vl-'));
  for (const arch of ['v81', 'v79']) {
    records[arch] = await build({ recipe: 'tiny-qwen3-vl', arch, out: bundle(arch), progress: silentProgress });
    expect(records[arch].error).toBeUndefined();
  }
}, 2_400_000); // the twin (text and vision trained) is made first: ~5 min on two busy cores; each simulator gate ~30 s

afterAll(() => { if (out) rmSync(out, { recursive: true, force: true }); });

describe('tiny-qwen3-vl', () => {
  it('builds green with every gate for v81 and v79', () => {
    for (const arch of ['v81', 'v79']) {
      const r = records[arch];
      expect(r.ok, arch).toBe(true);
      for (const gate of ['oracle', 'parity', 'emulation']) expect(r.gates[gate as keyof typeof r.gates], `${arch} ${gate}`).toMatchObject({ ok: true });
      expect(existsSync(join(bundle(arch), 'manifest.json'))).toBe(true);
    }
  });

  it('traces two images whose greedy continuations differ, one not square and one not the recipe\'s size', async () => {
    const trace = await Trace.open(entry(records.v81, 'trace'));
    try {
      const images = trace.meta.prompts.filter((p) => p.image);
      expect(images.length).toBeGreaterThanOrEqual(2);
      expect(images[0].generated).not.toEqual(images[1].generated);
      // The recipe asks what the twin was trained to answer (twin_images.IMAGE_PROMPT): HF is sure of
      // every token it parity-checks, above the twin's margin floor (0.5), so W8 cannot flip one.
      for (const p of images) expect(Math.min(...p.margins.slice(0, 16)), p.image!.file).toBeGreaterThan(0.5);
      for (const p of images) expect(p.image).toMatchObject({ size: [96, 128], grid: [1, 6, 8], tokens: 12 });
      // The files as drawn (before the stretch): at least one not 128×96, at least one not square.
      const sizes = images.map((p) => pngOrJpegSize(join(trace.dir, 'images', p.image!.file)));
      expect(sizes.some(([w, h]) => w !== 128 || h !== 96)).toBe(true);
      expect(sizes.some(([w, h]) => w !== h)).toBe(true);
    } finally {
      await trace.close();
    }
  });

  it('gates the vision encoder per block, on its image tokens and each DeepStack feature, and the text graphs on image prompts', () => {
    const oracle = json(join(entry(records.v81, 'oracle'), 'oracle.json')) as { rows: Array<{ variant: string; graph: string; output: string; minCosine: number; ok: boolean }> };
    for (const variant of ['export:fp32', 'quantize:w8']) {
      const outputs = oracle.rows.filter((r) => r.variant === variant && r.graph === 'vision').map((r) => r.output);
      expect(outputs).toEqual(expect.arrayContaining(['image_embeds', 'deepstack_0', 'deepstack_1', 'deepstack_2', 'vision.embed', 'vision.block.0', 'vision.block.1', 'vision.block.2']));
      // DeepStack joins the residual inside the text graphs: each addition is compared with HF's next layer input.
      for (const g of ['shard0.prefill', 'shard0.decode']) {
        expect(oracle.rows.filter((r) => r.variant === variant && r.graph === g).map((r) => r.output)).toEqual(expect.arrayContaining(['deepstack.0.added', 'deepstack.1.added', 'deepstack.2.added']));
      }
    }
    const fp32 = oracle.rows.filter((r) => r.variant === 'export:fp32');
    expect(Math.min(...fp32.map((r) => r.minCosine))).toBeGreaterThan(0.99999);
    expect(oracle.rows.every((r) => r.ok)).toBe(true);
  });

  it('matches HF N/N on the host in fp32 and W8 for every prompt, images included, and on the simulator', () => {
    const parity = json(join(bundle('v81'), 'build', 'parity.json'));
    for (const v of ['export', 'quantize']) expect(parity.variants[v], v).toMatchObject({ ok: true, mismatches: 0 });
    expect(parity.detail.quantize.perPrompt.length).toBe(6);
    const emulation = json(join(bundle('v81'), 'build', 'emulation.json'));
    expect(Object.keys(emulation.oracle.graphs)).toEqual(expect.arrayContaining(['vision', 'shard0.prefill', 'shard0.decode', 'lm_head']));
    expect(emulation.oracle.graphs.vision).toMatchObject({ ok: true, cases: 2 });
    expect(emulation.parity).toMatchObject({ ok: true, mismatchCount: 0, total: 96 });
  });

  it("puts the C++ front-end's figures against HF's processor on the card, per image", () => {
    const parity = json(join(bundle('v81'), 'build', 'parity.json'));
    expect(parity.pixels.length).toBe(2);
    for (const c of parity.pixels) expect(c.cosine).toBeGreaterThan(0.9999);
    const card = readFileSync(join(bundle('v81'), 'README.md'), 'utf8');
    expect(card).toContain('## Images');
    expect(card).toContain("**Pre-processing against Hugging Face's processor**");
    for (const c of parity.pixels) expect(card).toContain(`| \`${c.image}\` | ${c.cosine.toFixed(7)} |`);
  });

  it('ships a text-only manifest over the same files, without the encoder, which matches HF on the text prompts', async () => {
    const full = json(join(bundle('v81'), 'manifest.json')) as Manifest;
    const text = json(join(bundle('v81'), TEXT_MANIFEST)) as Manifest;
    expect(full.contexts.map((c) => c.name)).toContain('vision');
    expect(text.contexts.map((c) => c.name)).toEqual(full.contexts.map((c) => c.name).filter((n) => n !== 'vision'));
    expect(readFileSync(join(bundle('v81'), 'SHA256SUMS'), 'utf8')).toContain(TEXT_MANIFEST);
    // The parity gate ran it on the host on the text prompts, in fp32 and W8 (the image prompts need the encoder).
    const parity = json(join(bundle('v81'), 'build', 'parity.json'));
    expect(parity.textManifest.file).toBe(TEXT_MANIFEST);
    for (const v of ['export', 'quantize']) expect(parity.textManifest.variants[v], v).toMatchObject({ ok: true, mismatches: 0, total: 4 * 16 });
    expect(readFileSync(join(bundle('v81'), 'README.md'), 'utf8')).toContain('**Text-only manifest**');
  });
});

/** Width and height of a PNG (IHDR) or a baseline JPEG (SOF0). */
function pngOrJpegSize(file: string): [number, number] {
  const b = readFileSync(file);
  if (b.readUInt32BE(0) === 0x89504e47) return [b.readUInt32BE(16), b.readUInt32BE(20)];
  for (let i = 2; i < b.length;) {
    const marker = b.readUInt16BE(i);
    if (marker >= 0xffc0 && marker <= 0xffc2) return [b.readUInt16BE(i + 7), b.readUInt16BE(i + 5)];
    i += 2 + b.readUInt16BE(i + 2);
  }
  throw new Error(`${file}: no size found`);
}
