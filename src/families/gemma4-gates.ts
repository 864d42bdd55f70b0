// Gemma 4's teacher-forced gate cases: what each shard graph (prefill or decode), the lm-head and the
// encoders are fed at each traced call and what they must give back (the graphs are in gemma4.ts).
import type { Trace } from '../gates/trace.js';
import type { GraphEntry } from './types.js';
import { CacheBuilder, kvDecoderCases, rowMask, stackRows } from './kv-decoder.js';
import type { Feed, GateCase } from './types.js';
import { MASKED } from './blocks.js';
import { pastKv } from './state-io.js';
import { EMBEDS, RING_MASK, RING_SLOT, kvLayout, pleInput, ringIn, type Gemma4Config } from './gemma4.js';
import { SOFT_TOKENS, VISION_PIXELS, VISION_POSITIONS } from './gemma4-vision.js';
import { AUDIO_EMBEDS, AUDIO_FEATURES, AUDIO_MASK, MEL_BINS } from './gemma4-audio.js';

/**
 * The runtime's mask [n, slots + n] over a ring of `slots` slots for n tokens at positions start..
 * (valid of them real; native StepMask, ring): before the call's rows are written slot j holds the
 * latest position p < start with p = j mod slots, which row r (position q = start + r) sees while
 * q − p < window; new token k shows to row r when it is real, k ≤ r and r − k < window.
 */
export function ringMask(slots: number, window: number, start: number, n = 1, valid = n): Float32Array {
  const m = new Float32Array(n * (slots + n)).fill(MASKED);
  for (let r = 0; r < n; r++) {
    const row = m.subarray(r * (slots + n), (r + 1) * (slots + n));
    for (let j = 0; j < slots; j++) {
      const p = start - 1 - ((((start - 1 - j) % slots) + slots) % slots);
      if (p >= 0 && start + r - p < window) row[j] = 0;
    }
    for (let k = 0; k <= r && k < valid; k++) if (r - k < window) row[slots + k] = 0;
  }
  return m;
}

/**
 * The KV decoder's teacher-forced calls (kvDecoderCases: every step one by one for a decode graph,
 * the prompt in chunks of N for a prefill graph, padding rows not compared) over the caches of the
 * layers that compute K/V (rings for sliding ones), plus HF's embedding rows (h.0), each layer's
 * scaled PLE token rows (ple_in.i), the ring mask and slots, and for a donor the shard reads but
 * does not hold (KV-shared layers whose donor is in an earlier shard) the donor's cache with the
 * call's own rows in it, as the runtime has it once the donor's context wrote them. Probes include
 * each layer's mixed per-layer input ple.i.
 */
export function gemma4Cases(c: Gemma4Config, entry: GraphEntry, trace: Trace, maxContext: number): AsyncGenerator<GateCase> {
  const n = entry.n;
  const ring = ringIn(c, entry, maxContext);
  const kv = kvLayout(c, maxContext, ring);
  const f = (data: Float32Array, dims: number[]): Feed => ({ dtype: 'float32', data, dims });
  const takes = (name: string) => entry.inputs.some((t) => t.name === name);
  let donors: { prompt: number; cache: CacheBuilder; layers: number[] } | undefined;
  return kvDecoderCases(entry, trace, kv, {
    kvLayers: (layers) => layers.filter((i) => c.layer[i].kvFrom === i),
    extra: async ({ prompt: p, start, valid, layers }, feeds) => {
      const steps = Array.from({ length: valid }, (_, r) => start + r);
      feeds[EMBEDS] = f(await stackRows(trace, p, steps, n, 'h.0', c.hidden), [1, n, c.hidden]);
      for (const i of layers) feeds[pleInput(i)] = f(await stackRows(trace, p, steps, n, `ple_in.${i}`, c.ple), [1, n, c.ple]);
      if (ring && takes(RING_MASK)) feeds[RING_MASK] = f(ringMask(ring, c.slidingWindow, start, n, valid), [1, 1, n, ring + n]);
      if (ring && takes(RING_SLOT)) feeds[RING_SLOT] = { dtype: 'int32', data: Int32Array.from({ length: n }, (_, r) => (start + r) % ring), dims: [n] };
      if (donors?.prompt !== p) {
        const foreign = [...new Set(layers.map((i) => c.layer[i].kvFrom).filter((d) => !layers.includes(d)))];
        donors = { prompt: p, cache: new CacheBuilder(foreign, kv), layers: foreign };
      }
      await donors.cache.fillTo(trace, p, start + valid);
      for (const i of donors.layers) {
        const dims = [1, c.layer[i].kvHeads, kv.layer(i).ring ?? maxContext, c.layer[i].headDim];
        feeds[pastKv('k', i)] = f(donors.cache.k.get(i)!, dims);
        feeds[pastKv('v', i)] = f(donors.cache.v.get(i)!, dims);
      }
    },
  });
}

/**
 * The vision encoder at each image prompt: HF's processor output in (pixels, positions), its soft
 * tokens and per-block outputs out. Only the image's own rows are compared: the real patches of the
 * per-block values, the first (real patches)/k² soft tokens (the rest of the budget is padding).
 */
export async function* gemma4VisionCases(entry: GraphEntry, trace: Trace): AsyncGenerator<GateCase> {
  const prompts = trace.meta.prompts.map((p, i) => ({ p, i })).filter(({ p }) => p.image);
  // An encoder no image reached is not gated: said, not passed.
  if (!prompts.length) throw new Error(`${entry.name}: the trace holds no image prompt, so the vision encoder cannot be gated: give the recipe gates.imagePrompts`);
  const [pixels, positions] = [VISION_PIXELS, VISION_POSITIONS].map((n) => entry.inputs.find((t) => t.name === n)!);
  const out = entry.outputs.find((t) => t.name === SOFT_TOKENS)!;
  for (const { i } of prompts) {
    const pos = await trace.getPrompt(i, 'vision.positions');
    const real = pos.filter((_, k) => k % 2 === 0 && pos[k] >= 0).length;
    const patchRows = (width: number) => rowMask(1, positions.shape[0], width, real);
    const tokens = await trace.getPrompt(i, 'vision.tokens');
    const [L, T] = out.shape;
    const n = tokens.length / T;
    const expected: Record<string, Float32Array> = { [SOFT_TOKENS]: padRows(tokens, L * T) };
    const masks: Record<string, Uint8Array> = { [SOFT_TOKENS]: rowMask(1, L, T, n) };
    for (const [value, probe] of Object.entries(entry.probes)) {
      const width = probe.shape[probe.shape.length - 1];
      const want = await trace.getPrompt(i, probe.name);
      expected[value] = padRows(want, probe.shape.reduce((a, b) => a * b, 1));
      masks[value] = patchRows(width);
    }
    yield {
      prompt: i, step: 0, expected, masks,
      feeds: {
        [VISION_PIXELS]: { dtype: 'float32', data: await trace.getPrompt(i, 'vision.pixels'), dims: pixels.shape },
        [VISION_POSITIONS]: { dtype: 'int32', data: Int32Array.from(pos), dims: positions.shape },
      },
    };
  }
}

/**
 * The audio encoder at each audio prompt: HF's extractor output in (log-mel features and mask, the
 * tail past the clip zero with mask 0, as the extractor pads), its soft tokens and per-layer outputs
 * out. Only the clip's own rows are compared: row t is the clip's when frame 4t is (HF's output mask,
 * mask[::2][::2]), the first ceil(valid frames / 4); HF drops the rest and so must the host.
 */
export async function* gemma4AudioCases(entry: GraphEntry, trace: Trace): AsyncGenerator<GateCase> {
  const prompts = trace.meta.prompts.map((p, i) => ({ p, i })).filter(({ p }) => p.audio);
  if (!prompts.length) throw new Error(`${entry.name}: the trace holds no audio prompt, so the audio encoder cannot be gated: give the recipe gates.audioPrompts`);
  const frames = entry.inputs.find((t) => t.name === AUDIO_FEATURES)!.shape[0];
  const [T, H] = entry.outputs.find((t) => t.name === AUDIO_EMBEDS)!.shape;
  for (const { p, i } of prompts) {
    const features = await trace.getPrompt(i, 'audio.features');
    const mask = await trace.getPrompt(i, 'audio.mask');
    if (mask.length > frames || features.length !== mask.length * MEL_BINS) {
      throw new Error(`${entry.name}: prompt ${i} (${p.audio!.file}): the trace's audio features are ${features.length / MEL_BINS} frames of ${MEL_BINS} bins with a ${mask.length}-frame mask, the encoder takes ${frames} (the checkpoint's feature extractor is not HF's 16 kHz / 10 ms default?)`);
    }
    let n = 0;
    for (let t = 0; t < T; t++) if (mask[4 * t] > 0) n++;
    const tokens = await trace.getPrompt(i, 'audio.tokens');
    if (tokens.length !== n * H) throw new Error(`${entry.name}: prompt ${i} (${p.audio!.file}): HF gave ${tokens.length / H} soft tokens, the mask's valid frames make ${n}`);
    const expected: Record<string, Float32Array> = { [AUDIO_EMBEDS]: padRows(tokens, T * H) };
    const masks: Record<string, Uint8Array> = { [AUDIO_EMBEDS]: rowMask(1, T, H, n) };
    for (const [value, probe] of Object.entries(entry.probes)) {
      const width = probe.shape[probe.shape.length - 1];
      expected[value] = padRows(await trace.getPrompt(i, probe.name), T * width);
      masks[value] = rowMask(1, T, width, n);
    }
    yield {
      prompt: i, step: 0, expected, masks,
      feeds: {
        [AUDIO_FEATURES]: { dtype: 'float32', data: padRows(features, frames * MEL_BINS), dims: [frames, MEL_BINS] },
        [AUDIO_MASK]: { dtype: 'float32', data: padRows(mask, frames), dims: [frames] },
      },
    };
  }
}

/** `data` followed by zeros up to `size` values. */
function padRows(data: Float32Array, size: number): Float32Array {
  if (data.length === size) return data;
  const out = new Float32Array(size);
  out.set(data.subarray(0, size));
  return out;
}
