// Trace → graph inputs for decoders whose state is a KV cache (Qwen3, Qwen3-VL text): what each
// graph is fed at each traced step (teacher forcing), and what it must give back.
import { attentionMask } from './blocks.js';
import type { Trace } from '../gates/trace.js';
import type { GraphEntry } from './types.js';
import type { GraphBindings } from './types.js';
import type { ManifestGraph } from '../bundle/manifest.js';
import type { CompareMask } from '../gates/compare.js';
import type { Feed, GateCase } from './types.js';
import { LM_HEAD_KIND } from './decoder.js';
import { newKv, parseStateInput, parseStateOutput, pastKv, stateName } from './state-io.js';

/** One layer's KV cache shape: heads and head size may differ from layer to layer (sliding and full layers). */
export interface KvHeads {
  kvHeads: number;
  headDim: number;
  /** A ring cache of this many slots (position q in slot q mod slots); absent: one slot per position up to maxContext. */
  ring?: number;
}

export interface KvLayout {
  maxContext: number;
  layer(i: number): KvHeads;
}

/** Rows of per-step vectors stacked into [1, n, width], zero-padded past the steps given. */
export async function stackRows(trace: Trace, p: number, steps: number[], n: number, what: string, width: number): Promise<Float32Array> {
  const out = new Float32Array(n * width);
  for (let r = 0; r < steps.length; r++) out.set(await trace.get(p, steps[r], what), r * width);
  return out;
}

/** Compared entries of a [outer, n, inner] tensor whose first `valid` of n rows are real. */
export function rowMask(outer: number, n: number, inner: number, valid: number): CompareMask {
  const mask = new Uint8Array(outer * n * inner);
  for (let o = 0; o < outer; o++) mask.fill(1, o * n * inner, (o * n + valid) * inner);
  return mask;
}

/** Per-step [kv, d] rows stacked into [1, kv, n, d], zero-padded past the steps given. */
export async function stackKv(trace: Trace, p: number, steps: number[], n: number, what: string, kv: KvHeads): Promise<Float32Array> {
  const { kvHeads: H, headDim: d } = kv;
  const out = new Float32Array(H * n * d);
  for (let r = 0; r < steps.length; r++) {
    const row = await trace.get(p, steps[r], what);
    for (let h = 0; h < H; h++) out.set(row.subarray(h * d, (h + 1) * d), (h * n + r) * d);
  }
  return out;
}

/**
 * The KV cache as HF had it before step `upTo`: slot t holds step t's row, the rest zeros; a ring
 * cache holds the last `ring` steps' rows, step t at slot t mod ring (as the runtime writes it).
 */
export class CacheBuilder {
  readonly k = new Map<number, Float32Array>();
  readonly v = new Map<number, Float32Array>();
  filled = 0;
  constructor(private readonly layers: number[], private readonly kv: KvLayout) {
    for (const i of layers) {
      const { kvHeads, headDim, ring } = kv.layer(i);
      this.k.set(i, new Float32Array(kvHeads * (ring ?? kv.maxContext) * headDim));
      this.v.set(i, new Float32Array(kvHeads * (ring ?? kv.maxContext) * headDim));
    }
  }

  async fillTo(trace: Trace, p: number, upTo: number): Promise<void> {
    for (; this.filled < upTo; this.filled++) {
      const t = this.filled;
      for (const i of this.layers) {
        const { kvHeads: H, headDim: d, ring } = this.kv.layer(i);
        const C = ring ?? this.kv.maxContext;
        const slot = ring ? t % ring : t;
        for (const [what, cache] of [['k', this.k], ['v', this.v]] as const) {
          const row = await trace.get(p, t, `${what}.${i}`);
          const buf = cache.get(i)!;
          for (let h = 0; h < H; h++) buf.set(row.subarray(h * d, (h + 1) * d), (h * C + slot) * d);
        }
      }
    }
  }
}

/** Calls covering a prompt: decode graphs take every step one by one; prefill graphs take the prompt in chunks. */
export function promptCalls(entry: GraphEntry, promptLen: number, steps: number): Array<{ start: number; valid: number }> {
  const out: Array<{ start: number; valid: number }> = [];
  if (entry.n === 1) for (let t = 0; t < steps; t++) out.push({ start: t, valid: 1 });
  else for (let s = 0; s < promptLen; s += entry.n) out.push({ start: s, valid: Math.min(entry.n, promptLen - s) });
  return out;
}

/** The lm-head at every traced step of prompt `p`: HF's final-normed hidden in, HF's logits out. */
export async function* lmHeadCases(trace: Trace, p: number): AsyncGenerator<GateCase> {
  const H = trace.meta.hidden;
  const prompt = trace.meta.prompts[p];
  // An image's or clip's block: its soft tokens and the token that closes it are placeholders.
  const block = prompt.image ?? prompt.audio;
  const placeholder = (t: number) => block !== undefined && t + 1 >= block.start && t + 1 <= block.start + block.tokens;
  for (let t = 0; t < prompt.steps; t++) {
    yield {
      prompt: p, step: t, feeds: { hidden: { dtype: 'float32', data: await trace.get(p, t, 'final'), dims: [1, 1, H] } }, expected: { logits: await trace.get(p, t, 'logits') },
      ...(placeholder(t) ? { placeholder: true } : {}),
    };
  }
}

/** What a family adds to the KV decoder's teacher-forced calls. */
export interface KvCaseHooks {
  /** The layers whose KV caches the graph reads and writes (default: every layer it holds; Qwen3.5: its full-attention ones, Gemma 4: those not KV-shared). */
  kvLayers?: (layers: number[]) => number[];
  /**
   * A family's own feeds and expected outputs for a call, compared whole (no padding mask): Qwen3.5's
   * conv and recurrent states in (after step start - 1) and out (after the call's last real step);
   * Gemma 4's embedding and per-layer rows, ring mask and slots, and the donors' caches it reads.
   */
  extra?: (call: { prompt: number; start: number; valid: number; layers: number[] }, feeds: Record<string, Feed>, expected: Record<string, Float32Array>) => Promise<void>;
}

export async function* kvDecoderCases(entry: GraphEntry, trace: Trace, kv: KvLayout, hooks: KvCaseHooks = {}): AsyncGenerator<GateCase> {
  const H = trace.meta.hidden;
  const n = entry.n;
  const takes = (name: string) => entry.inputs.some((i) => i.name === name);
  for (let p = 0; p < trace.meta.prompts.length; p++) {
    const prompt = trace.meta.prompts[p];
    if (entry.kind === LM_HEAD_KIND) {
      yield* lmHeadCases(trace, p);
      continue;
    }
    const layers = Array.from({ length: entry.last! - entry.first! + 1 }, (_, k) => entry.first! + k);
    const cached = hooks.kvLayers?.(layers) ?? layers;
    const cache = new CacheBuilder(cached, kv);
    for (const { start, valid } of promptCalls(entry, prompt.prompt_tokens.length, prompt.steps)) {
      if (start + valid > kv.maxContext) throw new Error(`prompt ${p}: step ${start + valid - 1} is past the graph's ${kv.maxContext} cache slots`);
      await cache.fillTo(trace, p, start);
      const steps = Array.from({ length: valid }, (_, r) => start + r);
      const feeds: Record<string, Feed> = { hidden_in: { dtype: 'float32', data: await stackRows(trace, p, steps, n, `h.${entry.first}`, H), dims: [1, n, H] } };
      // A graph without attention over the cache (Qwen3.5's linear-only decode shard) takes neither.
      if (takes('position')) feeds.position = { dtype: 'int32', data: Int32Array.from({ length: n }, (_, r) => Math.min(start + r, kv.maxContext - 1)), dims: [n] };
      if (takes('attn_mask')) feeds.attn_mask = { dtype: 'float32', data: attentionMask(kv.maxContext, n, start, valid), dims: [1, 1, n, kv.maxContext + n] };
      const expected: Record<string, Float32Array> = {};
      for (const i of cached) {
        const l = kv.layer(i);
        const dims = [1, l.kvHeads, l.ring ?? kv.maxContext, l.headDim];
        feeds[pastKv('k', i)] = { dtype: 'float32', data: cache.k.get(i)!, dims };
        feeds[pastKv('v', i)] = { dtype: 'float32', data: cache.v.get(i)!, dims };
        expected[newKv('k', i)] = await stackKv(trace, p, steps, n, `k.${i}`, l);
        expected[newKv('v', i)] = await stackKv(trace, p, steps, n, `v.${i}`, l);
      }
      for (const [value, probe] of Object.entries(entry.probes)) expected[value] = await stackRows(trace, p, steps, n, probe.name, probe.shape[probe.shape.length - 1]);
      expected.hidden_out = await stackRows(trace, p, steps, n, entry.isLast ? 'final' : `h.${entry.last! + 1}`, H);
      if (entry.outputs.some((o) => o.name === 'logits')) expected.logits = await stackRows(trace, p, steps, n, 'logits', trace.meta.vocab);
      // Rows are masked where they are padding; what `extra` adds is compared whole.
      const masks = valid < n ? paddingMasks(expected, cached, n, valid, kv) : undefined;
      await hooks.extra?.({ prompt: p, start, valid, layers }, feeds, expected);
      // The feeds were consumed by the run before this generator resumes, so the cache filling the
      // next call's slots in place is safe.
      yield { prompt: p, step: start, feeds, expected, ...(masks ? { masks } : {}) };
    }
  }
}

/** Masks for a chunk whose last n - valid rows are padding: rows [1, n, width] (residuals, probes, logits), K/V rows [1, kv, n, d]. */
function paddingMasks(expected: Record<string, Float32Array>, layers: number[], n: number, valid: number, kv: KvLayout): Record<string, CompareMask> {
  const masks: Record<string, CompareMask> = {};
  for (const [name, rows] of Object.entries(expected)) masks[name] = rowMask(1, n, rows.length / n, valid);
  for (const i of layers) {
    const l = kv.layer(i);
    masks[newKv('k', i)] = masks[newKv('v', i)] = rowMask(l.kvHeads, n, l.headDim, valid);
  }
  return masks;
}

/**
 * The state layout of a KV-cache decoder: how each graph input/output binds for the runtime.
 * `extra` binds a family's own inputs (Qwen3-VL's DeepStack features). `recurrentShape` adds whole-tensor recurrent states (`<kind>_state_i` → `<kind>.i`, replaced
 * after each call) for hybrids such as Qwen3.5; without it they have no binding.
 */
export function kvDecoderBindings(entry: GraphEntry, kv: KvLayout, recurrentShape?: (kind: string, layer: number) => number[], extra?: (t: GraphEntry['inputs'][number]) => ManifestGraph['inputs'][number] | undefined): GraphBindings {
  const state: GraphBindings['state'] = [];
  const cacheShape = (i: number) => [1, kv.layer(i).kvHeads, kv.layer(i).ring ?? kv.maxContext, kv.layer(i).headDim];
  const inputs = entry.inputs.map((t): ManifestGraph['inputs'][number] => {
    const io = parseStateInput(t.name);
    if (io && (!io.recurrent || recurrentShape)) {
      const name = stateName(io);
      state.push(io.recurrent
        ? { name, kind: 'recurrent', dtype: 'float32', shape: recurrentShape!(io.kind, io.layer) }
        : { name, kind: 'kv-cache', dtype: 'float32', shape: cacheShape(io.layer), positionAxis: 2, ...(kv.layer(io.layer).ring ? { window: kv.layer(io.layer).ring } : {}) });
      return { ...t, bind: 'state', state: name };
    }
    const own = extra?.(t);
    if (own) return own;
    if (t.name === 'hidden_in' || t.name === 'hidden') return { ...t, bind: 'residual' };
    if (t.name === 'position') return { ...t, bind: 'positions' };
    if (t.name === 'attn_mask') return { ...t, bind: 'mask' };
    throw new Error(`${entry.name}: input ${t.name} has no binding`);
  });
  const outputs = entry.outputs.map((t): ManifestGraph['outputs'][number] => {
    const io = parseStateOutput(t.name);
    if (io && !io.recurrent) return { ...t, bind: 'state-rows', state: stateName(io), axis: 2 };
    if (io && recurrentShape) return { ...t, bind: 'state-replace', state: stateName(io) };
    if (t.name === 'hidden_out') return { ...t, bind: 'residual' };
    if (t.name === 'logits') return { ...t, bind: 'logits' };
    throw new Error(`${entry.name}: output ${t.name} has no binding`);
  });
  return { inputs, outputs, state };
}
