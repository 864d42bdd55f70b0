// Gemma 4's teacher-forced gate cases: what each decode graph is fed at each traced step and what it
// must give back (the graphs are in gemma4.ts).
import type { Trace } from '../gates/trace.js';
import type { GraphEntry } from './types.js';
import { CacheBuilder, lmHeadCases, promptCalls, rowMask, stackKv, stackRows } from './kv-decoder.js';
import type { CompareMask } from '../gates/compare.js';
import type { Feed, GateCase } from './types.js';
import { MASKED, attentionMask } from './blocks.js';
import { LM_HEAD_KIND } from './decoder.js';
import { newKv, pastKv } from './state-io.js';
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
 * Each call a shard takes (every step one by one for a decode graph, the prompt in chunks of N for a
 * prefill graph; the last chunk's padding rows not compared) gets HF's residual entering its first
 * layer, HF's embedding rows (h.0) and each layer's scaled PLE token rows (ple_in.i), and the K/V
 * caches: its own layers' rows of steps before the call, and for a donor it reads but does not hold
 * (KV-shared layers whose donor is in an earlier shard) the rows up to the call's last, as the
 * runtime has them once the donor's context wrote the call's rows. It must give back h.{last+1} (or
 * final), its layers' new K/V rows, and (probes) each layer's mixed per-layer input ple.i and residual.
 */
export async function* gemma4Cases(c: Gemma4Config, entry: GraphEntry, trace: Trace, maxContext: number): AsyncGenerator<GateCase> {
  const H = trace.meta.hidden;
  const n = entry.n;
  const ring = ringIn(c, entry, maxContext);
  const kv = kvLayout(c, maxContext, ring);
  const f = (data: Float32Array, dims: number[]): Feed => ({ dtype: 'float32', data, dims });
  const takes = (name: string) => entry.inputs.some((t) => t.name === name);
  for (let p = 0; p < trace.meta.prompts.length; p++) {
    const prompt = trace.meta.prompts[p];
    if (entry.kind === LM_HEAD_KIND) {
      yield* lmHeadCases(trace, p);
      continue;
    }
    const layers = Array.from({ length: entry.last! - entry.first! + 1 }, (_, k) => entry.first! + k);
    const own = layers.filter((i) => c.layer[i].kvFrom === i);
    const foreign = [...new Set(layers.map((i) => c.layer[i].kvFrom).filter((d) => !layers.includes(d)))];
    const ownCache = new CacheBuilder(own, kv);
    const donorCache = new CacheBuilder(foreign, kv);
    for (const { start, valid } of promptCalls(entry, prompt.prompt_tokens.length, prompt.steps)) {
      if (start + valid > maxContext) throw new Error(`prompt ${p}: step ${start + valid - 1} is past the graph's ${maxContext} cache slots`);
      await ownCache.fillTo(trace, p, start);
      await donorCache.fillTo(trace, p, start + valid);
      const steps = Array.from({ length: valid }, (_, r) => start + r);
      const rows = (what: string, width: number) => stackRows(trace, p, steps, n, what, width);
      const feeds: Record<string, Feed> = {
        hidden_in: f(await rows(`h.${entry.first}`, H), [1, n, H]),
        position: { dtype: 'int32', data: Int32Array.from({ length: n }, (_, r) => Math.min(start + r, maxContext - 1)), dims: [n] },
        attn_mask: f(attentionMask(maxContext, n, start, valid), [1, 1, n, maxContext + n]),
        [EMBEDS]: f(await rows('h.0', H), [1, n, H]),
      };
      for (const i of layers) feeds[pleInput(i)] = f(await rows(`ple_in.${i}`, c.ple), [1, n, c.ple]);
      if (ring && takes(RING_MASK)) feeds[RING_MASK] = f(ringMask(ring, c.slidingWindow, start, n, valid), [1, 1, n, ring + n]);
      if (ring && takes(RING_SLOT)) feeds[RING_SLOT] = { dtype: 'int32', data: Int32Array.from({ length: n }, (_, r) => (start + r) % ring), dims: [n] };
      for (const [cache, ids] of [[ownCache, own], [donorCache, foreign]] as const) {
        for (const i of ids) {
          const shape = [1, c.layer[i].kvHeads, kv.layer(i).ring ?? maxContext, c.layer[i].headDim];
          feeds[pastKv('k', i)] = f(cache.k.get(i)!, shape);
          feeds[pastKv('v', i)] = f(cache.v.get(i)!, shape);
        }
      }
      const expected: Record<string, Float32Array> = {};
      const masks: Record<string, CompareMask> = {};
      for (const i of own) {
        for (const what of ['k', 'v'] as const) {
          expected[newKv(what, i)] = await stackKv(trace, p, steps, n, `${what}.${i}`, kv.layer(i));
          if (valid < n) masks[newKv(what, i)] = rowMask(c.layer[i].kvHeads, n, c.layer[i].headDim, valid);
        }
      }
      const byRow: Array<[string, string, number]> = Object.entries(entry.probes).map(([value, probe]) => [value, probe.name, probe.shape[probe.shape.length - 1]]);
      byRow.push(['hidden_out', entry.isLast ? 'final' : `h.${entry.last! + 1}`, H]);
      if (entry.outputs.some((o) => o.name === 'logits')) byRow.push(['logits', 'logits', trace.meta.vocab]);
      for (const [value, what, width] of byRow) {
        expected[value] = await rows(what, width);
        if (valid < n) masks[value] = rowMask(1, n, width, valid);
      }
      // The run consumed the feeds before this generator resumes: filling the caches in place is safe.
      yield { prompt: p, step: start, feeds, expected, ...(valid < n ? { masks } : {}) };
    }
  }
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
