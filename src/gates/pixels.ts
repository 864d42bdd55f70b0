// The runtime's image pre-processing against Hugging Face's: for every image prompt the oracle
// traced, the C++ front-end (qhx_pixels: decode, resize, rescale, normalise, patchify, with the
// bundle manifest's own parameters) runs on the same file, and its pixel_values are compared with the
// processor's (trace `p{p}/pixels`). The figures go on the card; a cosine under PIXELS_MIN_COSINE
// fails the parity gate (a wrong channel order or patch order, not a resampling difference).
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { runOwned } from '../engine/subprocess.js';
import type { Manifest } from '../bundle/manifest.js';
import { TRACE_IMAGES } from './trace-stage.js';
import type { Trace } from './trace.js';

/** Measured PIL-vs-stb resampling differences stay far above this; a patch-order or channel bug falls far below. */
export const PIXELS_MIN_COSINE = 0.999;

export interface PixelCheck {
  prompt: number;
  image: string;
  cosine: number;
  maxAbs: number;
  meanAbs: number;
  /** The runtime's own times for this file (decode, resize, patchify). */
  ms: { decode: number; resize: number; patchify: number };
  ok: boolean;
}

/**
 * The manifest's pre-processing as qhx_pixels options, and the trace's names of HF's processor output:
 * a fixed grid (Qwen-VL: image_height, patch_size …; trace `pixels`) or Gemma 4's soft-token budget
 * (max_soft_tokens, patch_size, pooling_kernel_size; trace `vision.pixels` and `vision.positions`).
 */
export function pixelOptions(m: Pick<Manifest, 'hostOpParams'>): { args: string[]; pixels: string; positions?: string } {
  const p = m.hostOpParams ?? {};
  const need = (k: string) => {
    if (p[k] === undefined) throw new Error(`the manifest's hostOpParams has no ${k}: the bundle takes no images`);
    return String(p[k]);
  };
  if (p.max_soft_tokens !== undefined) {
    return { args: ['--soft-tokens', need('max_soft_tokens'), '--patch', need('patch_size'), '--pooling', need('pooling_kernel_size')], pixels: 'vision.pixels', positions: 'vision.positions' };
  }
  return {
    args: ['--size', `${need('image_height')}x${need('image_width')}`, '--patch', need('patch_size'), '--temporal', need('temporal_patch_size'),
      '--merge', need('merge_size'), '--mean', need('image_mean'), '--std', need('image_std')],
    pixels: 'pixels',
  };
}

export async function checkPixels(qhxPixels: string, manifest: Pick<Manifest, 'hostOpParams'>, trace: Trace): Promise<PixelCheck[]> {
  const prompts = trace.meta.prompts.flatMap((p, i) => (p.image ? [{ i, file: p.image.file }] : []));
  if (!prompts.length) return [];
  const work = mkdtempSync(join(tmpdir(), 'forge-pixels-'));
  try {
    const out: PixelCheck[] = [];
    for (const { i, file } of prompts) {
      const bin = join(work, `${i}.bin`), at = join(work, `${i}.positions.bin`);
      const opts = pixelOptions(manifest);
      const r = await runOwned(qhxPixels, [join(trace.dir, TRACE_IMAGES, file), ...opts.args, '--out', bin, ...(opts.positions ? ['--positions', at] : []), '--json'], { timeoutSeconds: 120 });
      if (r.spawnError) throw new Error(`cannot run ${qhxPixels}: ${r.spawnError}`);
      if (r.exitCode !== 0) throw new Error(`qhx_pixels on ${file} exited ${r.signal ?? r.exitCode ?? 'with no status'}: ${r.stderr.trim().split('\n').pop()}`);
      const timings = (JSON.parse(r.stdout.trim().split('\n').pop()!) as { timings: { decode_ms: number; resize_ms: number; patchify_ms: number } }).timings;
      const buf = readFileSync(bin);
      const ours = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
      const hf = await trace.getPrompt(i, opts.pixels);
      if (ours.length !== hf.length) throw new Error(`qhx_pixels gave ${ours.length} values for ${file}, Hugging Face's processor ${hf.length}`);
      // Where the encoder takes the patches' positions, they are the processor's exactly (else a patch lands elsewhere).
      if (opts.positions) {
        const pos = readFileSync(at);
        const mine = new Int32Array(pos.buffer, pos.byteOffset, pos.byteLength / 4);
        const theirs = await trace.getPrompt(i, opts.positions);
        const differs = mine.length !== theirs.length ? 0 : mine.findIndex((v, k) => v !== theirs[k]);
        if (mine.length !== theirs.length || differs >= 0) {
          throw new Error(`qhx_pixels' patch positions for ${file} differ from Hugging Face's processor (${mine.length !== theirs.length ? `${mine.length / 2} against ${theirs.length / 2} patches` : `patch ${differs >> 1}`})`);
        }
      }
      let dot = 0, a2 = 0, b2 = 0, maxAbs = 0, sumAbs = 0;
      for (let k = 0; k < hf.length; k++) {
        const d = Math.abs(ours[k] - hf[k]);
        dot += ours[k] * hf[k]; a2 += ours[k] ** 2; b2 += hf[k] ** 2;
        maxAbs = Math.max(maxAbs, d); sumAbs += d;
      }
      const cosine = a2 === 0 && b2 === 0 ? 1 : dot / Math.sqrt(a2 * b2);
      out.push({ prompt: i, image: file, cosine, maxAbs, meanAbs: sumAbs / hf.length, ms: { decode: timings.decode_ms, resize: timings.resize_ms, patchify: timings.patchify_ms }, ok: cosine >= PIXELS_MIN_COSINE });
    }
    return out;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
