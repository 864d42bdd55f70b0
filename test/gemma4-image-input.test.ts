// The runtime's Gemma 4 image pre-processing (native/src/gemma4_image.cpp, run by qhx_pixels
// --soft-tokens) held to HF's: the same JPEG or PNG through transformers' Gemma4ImageProcessorPil
// (oracles/pixels.py's gemma4_pixels, via test/helpers/gemma4_pixels_reference.py with patch 16,
// pooling 3) at budgets of 70 and 280 soft tokens (1120 for two files, 140 and 560 for one), on
// images written here with PIL: wide, tall, square, tiny (30x20, under one 48x48 block: enlarged),
// large (3000x2000), a 2000x12 sliver (at 70: HF's one-block-high fallback), a PNG with alpha, and
// three files whose size is already the target at one budget (not resized there, resized at the
// other).
//
// What must match: the shapes, soft tokens and resized size; the positions exactly (row-major (x, y),
// padding −1); the pixel values bit-exact where the image is not resized (decode and rescale only);
// where resized, image_input.cpp's resize_bicubic (stb's Catmull-Rom, pass by pass) against PIL's
// fixed-point bicubic: within one uint8 step (1/255) per pass, so a step off after the first pass,
// carried through the second's kernel, now and then comes out two steps off.
//
// Bounds, measured (Pillow 12.1.1, transformers 5.23, Debian's libjpeg-turbo 2.1.5 / libpng 1.6.39
// / stb_image_resize of 2022) on the 24 cases: not resized (3), max abs error 0; resized (21), at most
// 0.066 % of the values off at all, off by two steps on at most 2.1 per million (2 cases: a
// 12 → 48 and 2000 → 10368 sliver, a 480x640 RGBA → 672x912), otherwise one, mean abs ≤ 2.6e-6,
// cosine ≥ 0.99999998. The bounds below leave some room over these.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runOwned } from '../src/engine/subprocess.js';
import { ensureNative } from '../src/toolchain/native.js';
import { runPython } from '../src/toolchain/python.js';
import { compare, floats, ints, type PixelDiff } from './helpers/pixel-compare.js';

const ONE_STEP = 1 / 255; // one uint8 step after rescale 1/255 (Gemma 4 does not normalise)
const BOUNDS = {
  exact: { maxAbs: 0, meanAbs: 0, cosine: 0.9999999, offFraction: 0, beyondStepFraction: 0 },
  resize: { maxAbs: 2 * ONE_STEP + 1e-6, meanAbs: 5e-6, cosine: 0.9999999, offFraction: 0.001, beyondStepFraction: 1e-5 },
};
const PATCH = 16;
const POOLING = 3;

// Prints the file names in the order written. scene() is test/helpers/image_files.py's.
const GEN = String.raw`
import json, sys
import numpy as np
from PIL import Image
sys.path.insert(0, sys.argv[2])
from image_files import scene

out = sys.argv[1]
files = []
def add(name):
    files.append(name)
    return f'{out}/{name}'

rng = np.random.default_rng(27)
def with_alpha(im):
    w, h = im.size
    a = np.clip(np.add.outer(np.arange(h) * 255 // (h - 1), np.zeros(w, int)) + rng.integers(-40, 40, (h, w)), 0, 255)
    a[:h // 8] = 0
    a[-h // 8:] = 255
    return Image.fromarray(np.dstack([np.asarray(im), a]).astype(np.uint8))

scene(1200, 500, 21).save(add('wide-1200x500.jpg'), quality=90)
scene(400, 1000, 22).save(add('tall-400x1000.png'))
scene(700, 700, 23).save(add('square-700x700.jpg'), quality=95)
scene(30, 20, 24).save(add('tiny-30x20.png'))
scene(3000, 2000, 25).save(add('large-3000x2000.jpg'), quality=85)
scene(2000, 12, 26).save(add('sliver-2000x12.png'))
with_alpha(scene(640, 480, 28)).save(add('alpha-640x480.png'))
scene(480, 336, 29).save(add('fit70-480x336.jpg'), quality=92)
with_alpha(scene(480, 336, 30)).save(add('fit70-480x336-alpha.png'))
scene(960, 672, 31).save(add('fit280-960x672.png'))
print(json.dumps(files))
`;

interface Ref {
  patches: number;
  patch_dim: number;
  soft_tokens: number;
  size: [number, number];
  source: [number, number];
}

interface Case {
  name: string;
  file: string;
  budget: number;
  key: string;
  ref: Ref;
}

interface QhxJson {
  patches: number;
  patch_dim: number;
  soft_tokens: number;
  size: [number, number];
  grid: [number, number];
  timings: Record<string, number>;
}

describe('Gemma 4 image input: qhx_pixels --soft-tokens against HF\'s Gemma4ImageProcessorPil', () => {
  const root = mkdtempSync(join(tmpdir(), 'forge-gemma4-image-'));
  const cases: Case[] = [];
  let qhxPixels = '';

  const qhx = (file: string, budget: number, out: string, extra: string[] = []) =>
    runOwned(qhxPixels, [file, '--soft-tokens', String(budget), '--patch', String(PATCH), '--pooling', String(POOLING), '--out', out, ...extra]);

  beforeAll(async () => {
    // One after the other: the build and HF's processor would share two cores.
    qhxPixels = join((await ensureNative()).buildDir, 'qhx_pixels');
    writeFileSync(join(root, 'gen.py'), GEN);
    const names = JSON.parse((await runPython(join(root, 'gen.py'), [root, resolve('test/helpers')])).stdout) as string[];
    const jobs: [string, number][] = [];
    for (const name of names) {
      for (const budget of [70, 280]) jobs.push([join(root, name), budget]);
      if (name.startsWith('large') || name.startsWith('wide')) jobs.push([join(root, name), 1120]);
      if (name.startsWith('square')) jobs.push([join(root, name), 140], [join(root, name), 560]);
    }
    const refs = JSON.parse(
      (await runPython(resolve('test/helpers/gemma4_pixels_reference.py'), [root, String(PATCH), String(POOLING), JSON.stringify(jobs)])).stdout,
    ) as Record<string, Ref>;
    for (const [file, budget] of jobs) {
      const name = file.slice(root.length + 1);
      const key = `${name}.${budget}`;
      cases.push({ name, file, budget, key, ref: refs[key] });
    }
  }, 900_000);

  afterAll(() => rmSync(root, { recursive: true, force: true }));

  const resized = (c: Case) => c.ref.size[0] !== c.ref.source[0] || c.ref.size[1] !== c.ref.source[1];

  it('has the cases it was written for, and HF sizes them as read from its code', () => {
    expect(cases.length).toBe(10 * 2 + 2 + 2);
    expect(cases.filter((c) => !resized(c)).map((c) => c.key).sort()).toEqual(['fit280-960x672.png.280', 'fit70-480x336-alpha.png.70', 'fit70-480x336.jpg.70']);
    const at = (key: string) => cases.find((c) => c.key === key)!.ref;
    // The tiny image is enlarged: √(70·9·256 / 600) = 16.4 → 327.9x491.8 → 288x480 (multiples of 48).
    expect(at('tiny-30x20.png.70')).toMatchObject({ size: [288, 480], soft_tokens: 60, patches: 630, patch_dim: 768 });
    // The sliver's height rounds to 0 blocks: one block high, ⌊2000/12⌋ blocks wide capped at 70.
    expect(at('sliver-2000x12.png.70')).toMatchObject({ size: [48, 3360], soft_tokens: 70 });
    expect(at('large-3000x2000.jpg.1120').patches).toBe(1120 * 9);
  });

  it('matches HF on every file: positions exactly, pixels bit-exact where not resized, within a uint8 step or two where resized', async () => {
    const rows: string[] = [];
    const measured: [Case, PixelDiff][] = [];
    for (const c of cases) {
      const out = join(root, `${c.key}.qhx.bin`);
      const pos = join(root, `${c.key}.qhx-pos.bin`);
      const r = await qhx(c.file, c.budget, out, ['--positions', pos, '--json']);
      expect(r.exitCode, `${c.key}: ${r.stderr}`).toBe(0);
      const j = JSON.parse(r.stdout) as QhxJson;
      expect([j.patches, j.patch_dim, j.soft_tokens, j.size], c.key).toEqual([c.ref.patches, c.ref.patch_dim, c.ref.soft_tokens, c.ref.size]);
      expect(j.patches).toBe(c.budget * POOLING * POOLING);
      expect(j.grid).toEqual([c.ref.size[0] / PATCH, c.ref.size[1] / PATCH]);
      expect(j.timings.resize_ms > 0, c.key).toBe(resized(c));

      const ours = ints(pos);
      const theirs = ints(join(root, `${c.key}.pos.bin`));
      expect(ours.length, c.key).toBe(c.ref.patches * 2);
      const firstOff = ours.findIndex((v, i) => v !== theirs[i]);
      expect(firstOff, `${c.key}: first position off at row ${firstOff >> 1}`).toBe(-1);

      const m = compare(floats(out), floats(join(root, `${c.key}.hf.bin`)), ONE_STEP);
      measured.push([c, m]);
      rows.push(`${c.key.padEnd(32)} ${c.ref.source.join('x')} -> ${c.ref.size.join('x')} max ${(m.maxAbs / ONE_STEP).toFixed(3)} step mean ${m.meanAbs.toExponential(3)} cos ${m.cosine.toFixed(9)} off ${(m.offFraction * 100).toFixed(4)}% >1 step ${(m.beyondStepFraction * 1e6).toFixed(2)} ppm  decode ${j.timings.decode_ms.toFixed(1)} resize ${j.timings.resize_ms.toFixed(1)} patchify ${j.timings.patchify_ms.toFixed(1)} ms`);
    }
    // Printed before the bounds are checked, so that a failure shows every file's figures.
    console.log(`[measured] qhx_pixels --soft-tokens vs HF (max abs in uint8 steps, mean abs, cosine, values off by > 1e-6; qhx timings):\n${rows.join('\n')}`);
    for (const [c, m] of measured) {
      const b = resized(c) ? BOUNDS.resize : BOUNDS.exact;
      expect(m.maxAbs, c.key).toBeLessThanOrEqual(b.maxAbs);
      expect(m.meanAbs, c.key).toBeLessThanOrEqual(b.meanAbs);
      expect(m.cosine, c.key).toBeGreaterThanOrEqual(b.cosine);
      expect(m.offFraction, c.key).toBeLessThanOrEqual(b.offFraction);
      expect(m.beyondStepFraction, c.key).toBeLessThanOrEqual(b.beyondStepFraction);
    }
  }, 300_000);

  it('lays the patches out row-major, (x, y) per row, padding zero at (−1, −1)', async () => {
    // Independent of HF: a wrong ordering (column-major, (y, x)) or padding fails here too.
    const c = cases.find((x) => x.key === 'wide-1200x500.jpg.280')!;
    const out = join(root, 'layout.bin');
    const pos = join(root, 'layout-pos.bin');
    const r = await qhx(c.file, c.budget, out, ['--positions', pos, '--json']);
    expect(r.exitCode, r.stderr).toBe(0);
    const [gh, gw] = (JSON.parse(r.stdout) as QhxJson).grid;
    expect(gw).toBeGreaterThan(gh); // wide: the difference between row- and column-major shows
    const p = ints(pos);
    const px = floats(out);
    const dim = 3 * PATCH * PATCH;
    for (let row = 0; row < c.ref.patches; row++) {
      const real = row < gh * gw;
      const want = real ? [row % gw, Math.floor(row / gw)] : [-1, -1];
      expect([p[2 * row], p[2 * row + 1]], `row ${row}`).toEqual(want);
      if (!real) expect(px.subarray(row * dim, (row + 1) * dim).every((v) => v === 0), `padding row ${row}`).toBe(true);
    }
  });

  it('refuses a budget HF does not offer, a mode mix, and an unreadable file, in one line', async () => {
    const c = cases[0];
    const x = join(root, 'x.bin');
    const refusals: [string[], string][] = [
      [[c.file, '--soft-tokens', '100', '--out', x], 'qhx_pixels: error: gemma4 image spec: max_soft_tokens 100 must be one of 70, 140, 280, 560, 1120 (the budgets HF\'s Gemma 4 image processor accepts)'],
      [[c.file, '--soft-tokens', '70', '--pooling', '0', '--out', x], 'qhx_pixels: error: gemma4 image spec: pooling 0 must be positive'],
      [[c.file, '--soft-tokens', '70', '--size', '512x512', '--out', x], 'qhx_pixels: error: --size is not an option of --soft-tokens (Gemma 4); usage:'],
      [[c.file, '--size', '512x512', '--positions', x, '--out', x], 'qhx_pixels: error: --positions needs --soft-tokens N (Gemma 4); usage:'],
      [[join(root, 'missing.png'), '--soft-tokens', '70', '--out', x], `qhx_pixels: error: ${join(root, 'missing.png')}: cannot open image: No such file or directory`],
    ];
    for (const [args, want] of refusals) {
      const r = await runOwned(qhxPixels, args);
      expect(r.exitCode, args.join(' ')).toBe(1);
      expect(r.stderr.trim().split('\n'), args.join(' ')).toHaveLength(1);
      expect(r.stderr.trim().startsWith(want), r.stderr).toBe(true);
    }
  });
});
