// Gemma 4's teacher-forced gate cases: what each decode graph is fed at each traced step and what it
// must give back (the graphs are in gemma4.ts).
import type { Trace } from '../gates/trace.js';
import type { GraphEntry } from './types.js';
import { CacheBuilder, lmHeadCases } from './kv-decoder.js';
import type { Feed, GateCase } from './types.js';
import { MASKED, attentionMask } from './blocks.js';
import { LM_HEAD_KIND } from './decoder.js';
import { newKv, pastKv } from './state-io.js';
import { EMBEDS, RING_MASK, RING_SLOT, kvLayout, pleInput, ringOf, type Gemma4Config } from './gemma4.js';
import { SOFT_TOKENS, VISION_PIXELS, VISION_POSITIONS } from './gemma4-vision.js';
import { AUDIO_EMBEDS, AUDIO_FEATURES, AUDIO_MASK, MEL_BINS } from './gemma4-audio.js';

/**
 * The runtime's mask over a ring of `slots` slots for the token at `position` (native StepMask, ring):
 * slots of earlier positions show while inside the window; once the ring is full, all but the slot
 * about to be overwritten (it holds position - slots). The new token's own column shows.
 */
export function ringMask(slots: number, position: number): Float32Array {
  const m = new Float32Array(slots + 1).fill(MASKED);
  if (position < slots) m.fill(0, 0, position);
  else {
    m.fill(0, 0, slots);
    m[position % slots] = MASKED;
  }
  m[slots] = 0;
  return m;
}

/**
 * At step t a shard gets HF's residual entering its first layer, HF's embedding row (h.0) and each
 * layer's scaled PLE token rows (ple_in.i), and the K/V caches: its own layers' rows of steps < t,
 * and for a donor it reads but does not hold (KV-shared layers whose donor is in an earlier shard)
 * the rows of steps ≤ t, as the runtime has them once the donor's context wrote step t's row. It
 * must give back h.{last+1} (or final), its layers' new K/V rows, and (probes) each layer's mixed
 * per-layer input ple.i and residual.
 */
export async function* gemma4Cases(c: Gemma4Config, entry: GraphEntry, trace: Trace, maxContext: number): AsyncGenerator<GateCase> {
  const H = trace.meta.hidden;
  const kv = kvLayout(c, maxContext);
  const f = (data: Float32Array, dims: number[]): Feed => ({ dtype: 'float32', data, dims });
  for (let p = 0; p < trace.meta.prompts.length; p++) {
    const steps = trace.meta.prompts[p].steps;
    if (entry.kind === LM_HEAD_KIND) {
      yield* lmHeadCases(trace, p);
      continue;
    }
    if (entry.n !== 1) throw new Error(`${entry.name}: gemma4 graphs take one token per call, this one takes ${entry.n}`);
    const layers = Array.from({ length: entry.last! - entry.first! + 1 }, (_, k) => entry.first! + k);
    const own = layers.filter((i) => c.layer[i].kvFrom === i);
    const foreign = [...new Set(layers.map((i) => c.layer[i].kvFrom).filter((d) => !layers.includes(d)))];
    const ownCache = new CacheBuilder(own, kv);
    const donorCache = new CacheBuilder(foreign, kv);
    for (let t = 0; t < steps; t++) {
      if (t >= maxContext) throw new Error(`prompt ${p}: step ${t} is past the graph's ${maxContext} cache slots`);
      await ownCache.fillTo(trace, p, t);
      await donorCache.fillTo(trace, p, t + 1);
      const feeds: Record<string, Feed> = {
        hidden_in: f(await trace.get(p, t, `h.${entry.first}`), [1, 1, H]),
        position: { dtype: 'int32', data: Int32Array.of(t), dims: [1] },
        attn_mask: f(attentionMask(maxContext, 1, t), [1, 1, 1, maxContext + 1]),
        [EMBEDS]: f(await trace.get(p, t, 'h.0'), [1, 1, H]),
      };
      const expected: Record<string, Float32Array> = {};
      for (const i of layers) feeds[pleInput(i)] = f(await trace.get(p, t, `ple_in.${i}`), [1, 1, c.ple]);
      const ring = ringOf(c, maxContext);
      if (ring && entry.inputs.some((t) => t.name === RING_MASK)) feeds[RING_MASK] = f(ringMask(ring, t), [1, 1, 1, ring + 1]);
      if (ring && entry.inputs.some((t) => t.name === RING_SLOT)) feeds[RING_SLOT] = { dtype: 'int32', data: Int32Array.of(t % ring), dims: [1] };
      for (const [cache, ids] of [[ownCache, own], [donorCache, foreign]] as const) {
        for (const i of ids) {
          const shape = [1, c.layer[i].kvHeads, kv.layer(i).ring ?? maxContext, c.layer[i].headDim];
          feeds[pastKv('k', i)] = f(cache.k.get(i)!, shape);
          feeds[pastKv('v', i)] = f(cache.v.get(i)!, shape);
        }
      }
      for (const i of own) {
        expected[newKv('k', i)] = await trace.get(p, t, `k.${i}`);
        expected[newKv('v', i)] = await trace.get(p, t, `v.${i}`);
      }
      for (const [value, probe] of Object.entries(entry.probes)) expected[value] = await trace.get(p, t, probe.name);
      expected.hidden_out = await trace.get(p, t, entry.isLast ? 'final' : `h.${entry.last! + 1}`);
      if (entry.outputs.some((o) => o.name === 'logits')) expected.logits = await trace.get(p, t, 'logits');
      // The run consumed the feeds before this generator resumes: filling the caches in place is safe.
      yield { prompt: p, step: t, feeds, expected };
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
    const patchRows = (width: number) => rowMask(positions.shape[0], width, real);
    const tokens = await trace.getPrompt(i, 'vision.tokens');
    const [L, T] = out.shape;
    const n = tokens.length / T;
    const expected: Record<string, Float32Array> = { [SOFT_TOKENS]: padRows(tokens, L * T) };
    const masks: Record<string, Uint8Array> = { [SOFT_TOKENS]: rowMask(L, T, n) };
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
    const masks: Record<string, Uint8Array> = { [AUDIO_EMBEDS]: rowMask(T, H, n) };
    for (const [value, probe] of Object.entries(entry.probes)) {
      const width = probe.shape[probe.shape.length - 1];
      expected[value] = padRows(await trace.getPrompt(i, probe.name), T * width);
      masks[value] = rowMask(T, width, n);
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

/** A compare mask over `rows` rows of `width` values: the first `keep` rows compared. */
function rowMask(rows: number, width: number, keep: number): Uint8Array {
  const m = new Uint8Array(rows * width);
  m.fill(1, 0, keep * width);
  return m;
}
