// The runtime's audio pre-processing against Hugging Face's: for every audio prompt the oracle
// traced, the C++ front-end (qhx_features: decode, resample, log-mel, the frame mask) runs on the
// same clip, and its features are compared with the extractor's (trace `audio.features`, padded
// there to the recipe's budget: the runtime pads the same way when it feeds the encoder, so only
// the clip's own frames are compared, and the masks must agree). The figures go on the card; a
// cosine under AUDIO_MIN_COSINE or a different mask fails the parity gate.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { runOwned } from '../engine/subprocess.js';
import { TRACE_AUDIO } from './trace-stage.js';
import type { Trace } from './trace.js';

/** A wrong mel scale or frame offset falls far below; resampler and FFT rounding stay far above. */
export const AUDIO_MIN_COSINE = 0.999;

export interface AudioFeatureCheck {
  prompt: number;
  clip: string;
  frames: number;
  cosine: number;
  maxAbs: number;
  /** The runtime's own times for this clip (decode, resample, features). */
  ms: { decode: number; resample: number; features: number };
  ok: boolean;
}

export async function checkAudioFeatures(qhxFeatures: string, trace: Trace): Promise<AudioFeatureCheck[]> {
  const prompts = trace.meta.prompts.flatMap((p, i) => (p.audio ? [{ i, file: p.audio.file, valid: p.audio.valid_frames }] : []));
  if (!prompts.length) return [];
  const work = mkdtempSync(join(tmpdir(), 'forge-features-'));
  try {
    const out: AudioFeatureCheck[] = [];
    for (const { i, file, valid } of prompts) {
      const bin = join(work, `${i}.bin`), maskBin = join(work, `${i}.mask.bin`);
      const r = await runOwned(qhxFeatures, [join(trace.dir, TRACE_AUDIO, file), '--out', bin, '--mask-out', maskBin, '--json'], { timeoutSeconds: 120 });
      if (r.spawnError) throw new Error(`cannot run ${qhxFeatures}: ${r.spawnError}`);
      if (r.exitCode !== 0) throw new Error(`qhx_features on ${file} exited ${r.signal ?? r.exitCode ?? 'with no status'}: ${r.stderr.trim().split('\n').pop()}`);
      const j = JSON.parse(r.stdout.trim().split('\n').pop()!) as { frames: number; mel_bins: number; valid_frames: number; timings: { decode_ms: number; resample_ms: number; features_ms: number } };
      const buf = readFileSync(bin);
      const ours = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
      const mask = readFileSync(maskBin);
      const hf = await trace.getPrompt(i, 'audio.features');
      const hfMask = await trace.getPrompt(i, 'audio.mask');
      const masksAgree = j.valid_frames === valid && [...mask].every((m, t) => m === hfMask[t]) && hfMask.slice(mask.length).every((m) => m === 0);
      const n = valid * j.mel_bins;
      let dot = 0, a2 = 0, b2 = 0, maxAbs = 0;
      for (let k = 0; k < n; k++) {
        dot += ours[k] * hf[k]; a2 += ours[k] ** 2; b2 += hf[k] ** 2;
        maxAbs = Math.max(maxAbs, Math.abs(ours[k] - hf[k]));
      }
      const cosine = a2 === 0 && b2 === 0 ? 1 : dot / Math.sqrt(a2 * b2);
      out.push({ prompt: i, clip: file, frames: valid, cosine, maxAbs, ms: { decode: j.timings.decode_ms, resample: j.timings.resample_ms, features: j.timings.features_ms }, ok: masksAgree && cosine >= AUDIO_MIN_COSINE });
    }
    return out;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
