// The runtime's image pre-processing (native/src/image_input.cpp, run by the qhx_pixels tool) held to
// HF's: the same JPEG or PNG file through transformers' Qwen2-VL image processor (PIL backend,
// Qwen3-VL's), patch 16, temporal 2, merge 2, mean = std = 0.5, min_pixels = max_pixels = H·W after a
// PIL BICUBIC stretch to the recipe's W×H — oracles/pixels.py's reference_pixels — on images written
// here with PIL at test time: JPEG and PNG, square and not, at the recipe size and not, and a PNG of
// every colour type and bit depth PIL reads, at two recipe sizes (512x512, Qwen3-VL's; 96x128 (HxW),
// the tiny recipe's, not square).
//
// The reference is HF's own conversion to RGB (transformers' convert_to_rgb: transparency composited
// onto white, what the processor does to the image as opened), then pixels.py's stretch and the
// processor; oracles/pixels.py, which the oracle traces with, is checked to give exactly the same.
//
// Bounds, measured (Pillow 12.1.1, transformers 5.23, Debian's libjpeg-turbo 2.1.5 / libpng 1.6.39
// / stb_image_resize of 2022): a file at the recipe size, decoded and normalised only, is bit-exact
// (max abs error 0); a resized one is off by one uint8 step (2/255 after normalising) on at most
// 0.024 % of its values (PIL's 22-bit fixed-point weights against stb's float), mean abs ≤ 2e-6,
// cosine ≥ 0.99999997.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runOwned } from '../src/engine/subprocess.js';
import { ensureNative } from '../src/toolchain/native.js';
import { runPython } from '../src/toolchain/python.js';
import { compare, floats } from './helpers/pixel-compare.js';

const ONE_STEP = 2 / 255; // one uint8 step after rescale 1/255 and (x − 0.5) / 0.5
const BOUNDS = {
  exact: { maxAbs: 1e-6, meanAbs: 1e-7, cosine: 0.9999999, offFraction: 0 },
  resize: { maxAbs: ONE_STEP + 1e-6, meanAbs: 1e-5, cosine: 0.9999, offFraction: 0.001 },
};

// Test images. PIL draws photo-like scenes (smooth colour, noise, sharp-edged shapes and lines: the
// kernel's overshoot matters there) and saves them as JPEG (4:2:0, 4:2:2, 4:4:4 progressive, grey)
// and PNG; the PNG forms Pillow cannot save (16-bit RGB(A), 1/2/4-bit grey, tRNS, interlaced, ...)
// are written chunk by chunk. Prints {file name: kind}; kind is exact (at the recipe size) or
// resize, with -alpha where HF composites transparency onto white (an alpha channel, or a tRNS
// colour). The drawing and PNG writing are test/helpers/image_files.py's.
const GEN = String.raw`
import json, struct, sys
import numpy as np
sys.path.insert(0, sys.argv[4])
from image_files import scene, write_png

out, H, W = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
files = {}
def add(name, kind):
    files[name] = kind
    return f'{out}/{name}'
scene(1000, 750, 1).save(add('photo-1000x750.jpg', 'resize'), quality=90)
scene(W, H, 2).save(add(f'exact-{W}x{H}.jpg', 'exact'), quality=92)
scene(W, H, 3).save(add(f'exact-{W}x{H}.png', 'exact'))
scene(W, H, 4).save(add(f'exact-{W}x{H}-progressive-444.jpg', 'exact'), quality=95, progressive=True, subsampling=0)
scene(W, H, 5).convert('L').save(add(f'exact-{W}x{H}-grey.jpg', 'exact'), quality=90)
scene(W, H, 6).save(add(f'exact-{W}x{H}-422.jpg', 'exact'), quality=80, subsampling=1)
scene(300, 200, 7).save(add('grow-300x200.jpg', 'resize'), quality=85)
scene(700, 700, 8).save(add('square-700x700.jpg', 'resize'), quality=95)
scene(333, 777, 9).save(add('tall-333x777.png', 'resize'))
scene(640, 480, 10).convert('L').save(add('grey-640x480.png', 'resize'))
rgb = np.asarray(scene(W, H, 11)).astype(np.uint32)
rng = np.random.default_rng(12)
alpha = np.clip(np.add.outer(np.arange(H) * 255 // (H - 1), np.zeros(W, int)) + rng.integers(-40, 40, (H, W)), 0, 255)
alpha[:H // 8] = 0
alpha[-H // 8:] = 255
grey = rgb.mean(-1).astype(np.uint32)
pal = rng.integers(0, 256, (256, 3))
idx = (grey[..., None] * 7 + rgb[..., :1]) % 256
write_png(add('rgb16.png', 'exact'), rgb * 257 + rng.integers(0, 256, rgb.shape), 2, 16)
write_png(add('rgba8.png', 'exact-alpha'), np.dstack([rgb, alpha]), 6, 8)
write_png(add('rgba16.png', 'exact-alpha'), np.dstack([rgb, alpha]) * 257, 6, 16)
write_png(add('grey16.png', 'exact'), grey[..., None] * 3, 0, 16)  # up to 765: PIL's I;16 saturates at 255
write_png(add('grey8.png', 'exact'), grey[..., None], 0, 8)
write_png(add('grey4.png', 'exact'), grey[..., None] >> 4, 0, 4)
write_png(add('grey2.png', 'exact'), grey[..., None] >> 6, 0, 2)
write_png(add('grey1.png', 'exact'), grey[..., None] >> 7, 0, 1)
write_png(add('greyalpha8.png', 'exact-alpha'), np.dstack([grey, alpha]), 4, 8)
write_png(add('greyalpha16.png', 'exact-alpha'), np.dstack([grey, alpha]) * 257, 4, 16)
write_png(add('palette8.png', 'exact'), idx, 3, 8, plte=pal)
write_png(add('palette4-trns.png', 'exact-alpha'), idx % 16, 3, 4, plte=pal[:16], trns=bytes(range(0, 256, 17)[:16]))
write_png(add('rgb8-trns.png', 'exact'), rgb // 32 * 32, 2, 8, trns=struct.pack('>HHH', 64, 0, 128))
write_png(add('grey8-trns.png', 'exact'), grey[..., None] // 16 * 16, 0, 8, trns=struct.pack('>H', 128))
write_png(add('grey16-trns.png', 'exact-alpha'), grey[..., None] * 3, 0, 16, trns=struct.pack('>H', 472))  # PIL compares 472 & 0xff = 216
write_png(add('grey2-trns.png', 'exact'), grey[..., None] >> 6, 0, 2, trns=struct.pack('>H', 1))  # PIL: never matches
write_png(add('rgb16-trns.png', 'exact'), (rgb // 64 * 64) * 257, 2, 16, trns=struct.pack('>HHH', 64 * 257, 128 * 257, 0))
write_png(add('rgb8-interlaced.png', 'exact'), rgb, 2, 8, interlace=True)
write_png(add('rgba-300x200.png', 'resize-alpha'), np.dstack([np.asarray(scene(300, 200, 13)), rng.integers(0, 256, (200, 300))]), 6, 8)
print(json.dumps(files))
`;

// References for each file, as float32 .bin: <name>.pixels.bin = oracles/pixels.py's
// reference_pixels (PIL convert("RGB")), <name>.hf.bin = HF's convert_to_rgb, then pixels.py's
// stretch and the checkpoint's image processor. Prints {name: [patches, patch_dim, grid]}.
const REF = String.raw`
import json, os, sys
sys.path.insert(0, sys.argv[1])
import pixels
from PIL import Image
from transformers.image_transforms import convert_to_rgb
model, out, H, W, files = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6])
processor = pixels.image_processor(model)
res = {}
for f in files:
    name = os.path.basename(f)
    pv, grid = pixels.reference_pixels(model, f, H, W)
    pv.numpy().astype('<f4').tofile(f'{out}/{name}.pixels.bin')
    with Image.open(f) as im:
        rgb = Image.fromarray(convert_to_rgb(im, return_numpy=True))
    hf, _ = pixels.processor_pixels(processor, pixels.stretch(rgb, H, W), H, W, f)
    hf.numpy().astype('<f4').tofile(f'{out}/{name}.hf.bin')
    res[name] = [pv.shape[0], pv.shape[1], grid[0].tolist()]
print(json.dumps(res))
`;

// Qwen3-VL-2B's preprocessor_config.json, as far as the processor reads it.
const PREPROCESSOR = {
  image_processor_type: 'Qwen2VLImageProcessor',
  do_convert_rgb: true,
  do_resize: true,
  do_rescale: true,
  rescale_factor: 0.00392156862745098,
  do_normalize: true,
  image_mean: [0.5, 0.5, 0.5],
  image_std: [0.5, 0.5, 0.5],
  resample: 3,
  patch_size: 16,
  temporal_patch_size: 2,
  merge_size: 2,
  size: { shortest_edge: 65536, longest_edge: 16777216 },
};

const SIZES: [number, number][] = [
  [512, 512],
  [96, 128],
];

interface Case {
  size: string;
  name: string;
  file: string;
  kind: string;
  ref: { patches: number; patchDim: number; grid: number[] };
}

describe('image input: qhx_pixels against HF\'s Qwen2-VL image processor (oracles/pixels.py)', () => {
  const root = mkdtempSync(join(tmpdir(), 'forge-image-input-'));
  const model = join(root, 'model');
  const cases: Case[] = [];
  let qhxPixels = '';

  beforeAll(async () => {
    qhxPixels = join((await ensureNative()).buildDir, 'qhx_pixels');
    mkdirSync(model);
    writeFileSync(join(model, 'preprocessor_config.json'), JSON.stringify(PREPROCESSOR, null, 1));
    writeFileSync(join(root, 'gen.py'), GEN);
    writeFileSync(join(root, 'ref.py'), REF);
    for (const [h, w] of SIZES) {
      const dir = join(root, `${h}x${w}`);
      mkdirSync(dir);
      const files = JSON.parse((await runPython(join(root, 'gen.py'), [dir, String(h), String(w), resolve('test/helpers')])).stdout) as Record<string, string>;
      const paths = Object.keys(files).map((n) => join(dir, n));
      const refs = JSON.parse((await runPython(join(root, 'ref.py'), [resolve('oracles'), model, dir, String(h), String(w), JSON.stringify(paths)])).stdout) as Record<
        string,
        [number, number, number[]]
      >;
      for (const [name, kind] of Object.entries(files)) {
        const [patches, patchDim, grid] = refs[name];
        cases.push({ size: `${h}x${w}`, name, file: join(dir, name), kind, ref: { patches, patchDim, grid } });
      }
    }
  }, 900_000);

  afterAll(() => rmSync(root, { recursive: true, force: true }));

  it('has the cases it was written for', () => {
    expect(cases.length).toBe(2 * 29);
    expect(cases.filter((c) => c.kind.startsWith('resize')).length).toBe(2 * 6);
  });

  it('matches HF on every file: bit-exact at the recipe size, within one uint8 step where resized', async () => {
    const rows: string[] = [];
    for (const c of cases) {
      const out = `${c.file}.qhx.bin`;
      const r = await runOwned(qhxPixels, [c.file, '--size', c.size, '--patch', '16', '--temporal', '2', '--merge', '2', '--mean', '0.5,0.5,0.5', '--std', '0.5,0.5,0.5', '--out', out, '--json']);
      expect(r.exitCode, `${c.size} ${c.name}: ${r.stderr}`).toBe(0);
      const j = JSON.parse(r.stdout) as { patches: number; patch_dim: number; grid: number[]; timings: Record<string, number> };
      const [h, w] = c.size.split('x').map(Number);
      expect([j.patches, j.patch_dim, j.grid], c.name).toEqual([c.ref.patches, c.ref.patchDim, [h / 16, w / 16]]);
      expect(c.ref.grid).toEqual([1, h / 16, w / 16]);
      const resized = c.kind.startsWith('resize');
      expect(j.timings.resize_ms > 0, c.name).toBe(resized);
      const ours = floats(out);
      const hf = floats(`${c.file}.hf.bin`);
      expect(ours.length).toBe(c.ref.patches * c.ref.patchDim);
      // The oracle's reference (pixels.py) is HF's conversion, transparency included.
      expect(compare(floats(`${c.file}.pixels.bin`), hf).maxAbs, `${c.name}: pixels.py vs HF`).toBe(0);
      const m = compare(ours, hf);
      rows.push(`${c.size} ${c.name.padEnd(34)} max ${m.maxAbs.toExponential(3)} mean ${m.meanAbs.toExponential(3)} cos ${m.cosine.toFixed(9)} off ${(m.offFraction * 100).toFixed(3)}%`);
      const b = resized ? BOUNDS.resize : BOUNDS.exact;
      expect(m.maxAbs, `${c.size} ${c.name}`).toBeLessThanOrEqual(b.maxAbs);
      expect(m.meanAbs, `${c.size} ${c.name}`).toBeLessThanOrEqual(b.meanAbs);
      expect(m.cosine, `${c.size} ${c.name}`).toBeGreaterThanOrEqual(b.cosine);
      expect(m.offFraction, `${c.size} ${c.name}`).toBeLessThanOrEqual(b.offFraction);
    }
    console.log(`[measured] qhx_pixels vs HF (max abs, mean abs, cosine, values off by > 1e-6):\n${rows.join('\n')}`);
  }, 600_000);

  it('pixels.py\'s command line gives what its reference_pixels gives', async () => {
    const c = cases.find((x) => x.size === '96x128' && x.name === 'photo-1000x750.jpg')!;
    const out = join(root, 'cli.bin');
    const r = await runPython(resolve('oracles/pixels.py'), ['--model', model, '--image', c.file, '--size', c.size, '--out', out]);
    expect(JSON.parse(r.stdout)).toEqual({ patches: c.ref.patches, patch_dim: c.ref.patchDim, grid: c.ref.grid });
    expect(compare(floats(out), floats(`${c.file}.pixels.bin`)).maxAbs).toBe(0);
  }, 120_000);

  it('times decode, resize and patchify of a 1000x750 JPEG to 512x512', async () => {
    const c = cases.find((x) => x.size === '512x512' && x.name === 'photo-1000x750.jpg')!;
    const runs: Record<string, number>[] = [];
    for (let i = 0; i < 7; i++) {
      const r = await runOwned(qhxPixels, [c.file, '--size', '512x512', '--out', join(root, 'timing.bin'), '--json']);
      expect(r.exitCode, r.stderr).toBe(0);
      runs.push((JSON.parse(r.stdout) as { timings: Record<string, number> }).timings);
    }
    const median = (k: string) => runs.map((t) => t[k]).sort((a, b) => a - b)[3];
    for (const k of ['decode_ms', 'resize_ms', 'patchify_ms']) expect(median(k)).toBeGreaterThan(0);
    console.log(`[measured] qhx_pixels ${basename(c.file)} -> 512x512, median of 7: decode ${median('decode_ms').toFixed(2)} ms, resize ${median('resize_ms').toFixed(2)} ms, patchify ${median('patchify_ms').toFixed(2)} ms`);
  }, 120_000);

  it('refuses, in one line naming the file, what it cannot read', async () => {
    const missing = join(root, 'missing.jpg');
    const text = join(root, 'notes.png');
    writeFileSync(text, 'not an image\n');
    const cut = join(root, 'cut.jpg');
    const whole = readFileSync(cases.find((x) => x.name === 'photo-1000x750.jpg')!.file);
    writeFileSync(cut, whole.subarray(0, whole.length >> 1));
    for (const [file, why] of [
      [missing, /cannot open image: No such file or directory$/],
      [text, /not a JPEG or PNG image/],
      [cut, /JPEG: the data is truncated \(premature end of file\)$/],
    ] as const) {
      const r = await runOwned(qhxPixels, [file, '--size', '512x512', '--out', join(root, 'x.bin')]);
      expect(r.exitCode).toBe(1);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toContain(`qhx_pixels: error: ${file}: `);
      expect(r.stderr.trim()).toMatch(why);
    }
    const bad = await runOwned(qhxPixels, [cases[0].file, '--size', '500x512', '--out', join(root, 'x.bin')]);
    expect(bad.exitCode).toBe(1);
    expect(bad.stderr.trim()).toBe('qhx_pixels: error: image spec: size 500x512 (HxW) must be a multiple of patch·merge = 32 on each side');
  });
});
