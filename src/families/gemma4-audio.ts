// Gemma 4's audio encoder (the USM conformer, transformers' Gemma4AudioModel) and embed_audio, as one
// static graph over a fixed number of mel frames (the recipe's longest clip) with a frame mask for
// the padded tail:
//   subsampling: 2 × [Conv2d 3×3 stride 2 → LayerNorm over channels → ReLU] (frames masked before
//   each) → Linear to hidden: 4× fewer rows in time, 128 mel bins → 32;
//   each conformer layer: FFN (×residual_weight) → chunked local attention (relative position bias,
//   logit softcap) → light conv (Linear → GLU → causal depthwise conv → RMSNorm → SiLU → Linear) →
//   FFN (×residual_weight) → RMSNorm; every projection but relative_k_proj is a clipped linear whose
//   input and output are clamped to the checkpoint's scalars;
//   output_proj (bias) → embed_audio (scale-free RMSNorm → Linear to the text hidden size).
// The chunked attention is HF's blocked form with static shapes: queries in blocks of `chunk` rows,
// each block's keys/values a constant Gather of the left-padded sequence, the relative term shifted
// by HF's pad/reshape trick, and a mask made in the graph from the frame mask (band × valid keys).
//
// Rows: token t is valid when frame 4t is (HF's output mask, mask[::2][::2]); for a prefix mask of L
// valid frames that is the first ceil(L/4) rows. Valid rows never read padded ones (keys are masked,
// the light conv is causal), so they match HF whatever the padding; the padded rows are not HF's
// (HF strips them) and the host must drop them.
import { z } from 'zod';
import type { GraphBuilder } from '../onnx/builder.js';
import { MASKED, rmsNorm } from './blocks.js';
import { ConfigError, MAX_DIM, MAX_LAYERS, parseConfigWith, type AudioLayout, type Component, type GraphBindings, type GraphEntry, type GraphInterface, type GraphWeights, type TensorIO } from './types.js';

export interface Gemma4AudioConfig {
  hidden: number;
  layers: number;
  heads: number;
  /** Subsampling conv channels [first, second]. */
  channels: [number, number];
  convKernel: number;
  residualWeight: number;
  chunk: number;
  /** HF's attention_context_left: a block's keys start contextLeft − 1 rows back; a row sees distances 0 … contextLeft − 2. */
  contextLeft: number;
  logitCap: number;
  clipped: boolean;
  eps: number;
  gradientClipping: number;
  outDims: number;
}

/** Mel bins of the feature extractor: the subsampling's Linear reads (bins / 4) × channels[1] values. */
export const MEL_BINS = 128;
/** Names of the graph's inputs and output. */
export const AUDIO_FEATURES = 'input_features';
export const AUDIO_MASK = 'input_features_mask';
export const AUDIO_EMBEDS = 'audio_embeds';

const dim = z.number().int().positive().max(MAX_DIM);
// A field the checkpoint leaves out takes Gemma4AudioConfig's default, as transformers does (E4B's values).
const AudioSchema = z.object({
  audio_config: z.object({
    hidden_size: dim.default(1024),
    num_hidden_layers: z.number().int().positive().max(MAX_LAYERS).default(12),
    num_attention_heads: dim.default(8),
    hidden_act: z.literal('silu').default('silu'),
    subsampling_conv_channels: z.tuple([z.literal(MEL_BINS, { message: `must be ${MEL_BINS}: the subsampling's Linear reads (channels[0] / 4) × channels[1] values, which are the ${MEL_BINS / 4} subsampled mel bins only then` }), dim]).default([MEL_BINS, 32]),
    conv_kernel_size: dim.default(5),
    residual_weight: z.number().default(0.5),
    attention_chunk_size: dim.default(12),
    attention_context_left: dim.default(13),
    attention_context_right: z.literal(0, { message: 'must be 0: only causal (left) context is built' }).default(0),
    attention_logit_cap: z.number().positive().default(50),
    use_clipped_linears: z.boolean().default(true),
    rms_norm_eps: z.number().positive().default(1e-6),
    gradient_clipping: z.number().positive().default(1e10),
    output_proj_dims: dim.default(1536),
  }).passthrough(),
}).passthrough();

/** The checkpoint's `audio_config` (from the whole config.json); a setting the graph would get wrong is refused, naming the field. */
export function parseGemma4AudioConfig(raw: unknown, file: string): Gemma4AudioConfig {
  const a = parseConfigWith(AudioSchema, raw, file).audio_config;
  const c: Gemma4AudioConfig = {
    hidden: a.hidden_size, layers: a.num_hidden_layers, heads: a.num_attention_heads, channels: [a.subsampling_conv_channels[0], a.subsampling_conv_channels[1]],
    convKernel: a.conv_kernel_size, residualWeight: a.residual_weight, chunk: a.attention_chunk_size, contextLeft: a.attention_context_left,
    logitCap: a.attention_logit_cap, clipped: a.use_clipped_linears, eps: a.rms_norm_eps, gradientClipping: a.gradient_clipping, outDims: a.output_proj_dims,
  };
  if (c.hidden % c.heads !== 0) throw new ConfigError(file, 'audio_config.num_attention_heads', `${c.heads} does not divide hidden_size ${c.hidden}`);
  if (c.hidden % 2 !== 0) throw new ConfigError(file, 'audio_config.hidden_size', `${c.hidden} is odd: the relative position encoding is [sin, cos] halves`);
  // HF's rel_shift wraps a block's row into the next one: past chunk = left context it would read
  // real position rows where the graph reads zeros.
  if (c.chunk > c.contextLeft) throw new ConfigError(file, 'audio_config.attention_chunk_size', `${c.chunk} exceeds attention_context_left ${c.contextLeft}: HF's relative shift then wraps onto position rows this graph does not reproduce`);
  return c;
}

// ---- the audio component of the gemma4 family ------------------------------------------------

/**
 * HF's Gemma4AudioFeatureExtractor defaults (oracles/audio_features.py): 16 kHz, a 20 ms window
 * every 10 ms, shifted back half a window, the waveform padded to a multiple of 128 samples. A
 * checkpoint's preprocessor_config.json that changes them makes the trace's frame count differ from
 * the graph's, which the gate cases refuse.
 */
export const AUDIO_EXTRACTOR = { rate: 16_000, hop: 160, window: 320, padMultiple: 128 } as const;
/** HF's processor caps a clip at 30 s (max_length 480,000 samples; audio_seq_length 750 tokens). */
export const MAX_AUDIO_SECONDS = 30;

/** Mel frames of a clip of `maxSeconds` (padded as the extractor pads it): the encoder's static frame count. */
export function gemma4AudioFrames(maxSeconds: number): number {
  const { rate, hop, window, padMultiple } = AUDIO_EXTRACTOR;
  const samples = Math.ceil(Math.round(maxSeconds * rate) / padMultiple) * padMultiple;
  // A frame reads window + 1 samples of the waveform with window / 2 zeros in front.
  return Math.floor((samples + window / 2 - (window + 1)) / hop) + 1;
}

/**
 * A checkpoint's audio tower as the family keeps it: the encoder's config, or why forge cannot build
 * it (a refusal kept for a recipe that asks for audio: a tower with subsampling channels [8, 4],
 * as the tiny-gemma4 twin's once was, is one HF's own forward cannot run, and the checkpoint's text
 * and images must still build),
 * and the tokens a clip is written with (config.json's audio_token_id, boa_token_id, eoa_token_index;
 * HF's defaults when left out, as transformers reads the file).
 */
export interface Gemma4AudioTower {
  config: Gemma4AudioConfig | null;
  refused?: string;
  tokens: { audio: number; begin: number; end: number };
}

const AudioTokensSchema = z.object({
  audio_token_id: z.number().int().nonnegative().default(258_881),
  boa_token_id: z.number().int().nonnegative().default(256_000),
  eoa_token_index: z.number().int().nonnegative().default(258_883),
}).passthrough();

/** The whole config.json's audio tower; null without an audio_config. */
export function parseGemma4AudioTower(raw: unknown, file: string): Gemma4AudioTower | null {
  const r = raw as { audio_config?: unknown };
  if (r?.audio_config === undefined || r.audio_config === null) return null;
  const t = parseConfigWith(AudioTokensSchema, raw, file);
  const tokens = { audio: t.audio_token_id, begin: t.boa_token_id, end: t.eoa_token_index };
  try {
    return { config: parseGemma4AudioConfig(raw, file), tokens };
  } catch (e) {
    if (e instanceof ConfigError) return { config: null, refused: e.message, tokens };
    throw e;
  }
}

export const AUDIO = 'audio';

/** The audio encoder: one graph over the recipe's longest clip (n: its mel frames), in a context of its own. */
export function gemma4AudioComponent(tower: Gemma4AudioTower | null, textHidden: number, audio: AudioLayout): Component {
  if (!tower) throw new Error('the recipe gives an audio setting (arch setting "audio"), but this Gemma 4 checkpoint has no audio tower (config.json has no audio_config)');
  if (!tower.config) throw new Error(`the recipe gives an audio setting (arch setting "audio"), but this checkpoint's audio tower cannot be built: ${tower.refused}`);
  if (audio.maxSeconds > MAX_AUDIO_SECONDS) throw new Error(`arch setting audio.maxSeconds ${audio.maxSeconds}: Gemma 4's processor takes clips of at most ${MAX_AUDIO_SECONDS} s`);
  const a = tower.config;
  const frames = gemma4AudioFrames(audio.maxSeconds);
  return {
    name: AUDIO, kind: AUDIO, weights: 'encoder', entry: {},
    variants: [{ name: '', n: frames, role: AUDIO, build: (g, w) => gemma4AudioEncoderGraph(g, a, textHidden, frames, w) }],
  };
}

/** The encoder's inputs are the host's preprocessed clip (log-mel features and their mask); its soft tokens are kept for the shards. */
export function gemma4AudioBindings(entry: GraphEntry): GraphBindings {
  return {
    inputs: entry.inputs.map((t) => ({ ...t, bind: 'audio-features' as const })),
    outputs: entry.outputs.map((t) => ({ ...t, bind: 'encoder-output' as const })),
    state: [],
  };
}

/** The fixed shapes of an encoder over `frames` mel frames: tokens out, attention blocks and their context. */
export function audioShapes(a: Pick<Gemma4AudioConfig, 'chunk' | 'contextLeft'>, frames: number) {
  const half = Math.ceil(frames / 2);
  const tokens = Math.ceil(half / 2);
  const past = a.contextLeft - 1;
  const blocks = Math.ceil(tokens / a.chunk);
  // HF's Gemma4AudioRelPositionalEncoding: distances context/2 … 0.
  const positions = Math.floor((a.chunk + past) / 2) + 1;
  return { half, tokens, past, blocks, context: a.chunk + past, positions };
}

/** HF's relative position table [positions, hidden]: rows for distances positions−1 … 0, [sin…, cos…], in float32 as torch computes it. */
export function relativePositions(hidden: number, positions: number): Float32Array {
  const n = hidden / 2;
  const step = Math.fround(Math.log(10000) / Math.max(n - 1, 1));
  const inv = Array.from({ length: n }, (_, i) => Math.fround(Math.exp(Math.fround(i * -step))));
  const out = new Float32Array(positions * hidden);
  for (let r = 0; r < positions; r++) {
    const p = positions - 1 - r;
    for (let i = 0; i < n; i++) {
      const t = Math.fround(p * inv[i]);
      out[r * hidden + i] = Math.sin(t);
      out[r * hidden + n + i] = Math.cos(t);
    }
  }
  return out;
}

/**
 * 1 where query row c of a block may see context slot j, else 0: [chunk, context]. Slot j is row
 * c − j + past behind; HF's sliding_window_mask_function((past, 0)) keeps distances 0 … past − 1, so
 * the oldest slot of the context is never seen.
 */
export function bandMask(chunk: number, past: number): Float32Array {
  const context = chunk + past;
  const m = new Float32Array(chunk * context);
  for (let c = 0; c < chunk; c++) for (let j = 0; j < context; j++) { const d = c - j + past; m[c * context + j] = d >= 0 && d < past ? 1 : 0; }
  return m;
}

/**
 * The encoder and embed_audio: input_features [frames, 128] f32 and input_features_mask [frames] f32
 * (1 valid, 0 padding) → audio_embeds [frames/4 (rounded up twice), textHidden]. Probes: audio.embed
 * (after the subsampling), audio.layer.i, audio.encoder (output_proj), audio.tokens (the output).
 */
export async function gemma4AudioEncoderGraph(g: GraphBuilder, a: Gemma4AudioConfig, textHidden: number, frames: number, w: GraphWeights): Promise<GraphInterface> {
  const f32 = 'float32' as const;
  const H = a.hidden;
  const nh = a.heads;
  const hd = H / nh;
  const { half: T1, tokens: T, past: P, blocks: B, context: S, positions: NP } = audioShapes(a, frames);
  const C = a.chunk;
  const Tp = B * C;
  const prefix = 'model.audio_tower';
  const i64 = (v: number[]) => g.constInt64(v);
  const scalar = (v: number) => g.constFloat32([v], []);
  const small = (name: string, shape: number[], transform?: (x: Float32Array) => Float32Array) => w.store.small(g, name, shape, transform);
  const probes: Record<string, TensorIO> = {};
  const named = (value: string, name: string, width: number) => {
    const out = g.op('Identity', [value], {}, 1, { outputs: [name] });
    probes[out] = { name, dtype: f32, shape: [T, width] };
    return out;
  };
  /** Clamp to a checkpoint scalar pair; an infinite side is left out (fp16 has no room for it). */
  const clampTo = async (x: string, base: string, side: 'input' | 'output') => {
    let lo = -Infinity, hi = Infinity;
    const min = await small(`${base}.${side}_min`, [], (v) => { lo = v[0]; return v; });
    const max = await small(`${base}.${side}_max`, [], (v) => { hi = v[0]; return v; });
    if (Number.isFinite(lo)) x = g.op('Max', [x, min]);
    if (Number.isFinite(hi)) x = g.op('Min', [x, max]);
    return x;
  };
  /** Gemma4ClippableLinear: clamp in → Linear (no bias) → clamp out. x [1, n, in]. */
  const clippedLinear = async (x: string, base: string, out: number, inDim: number, n = T) => {
    if (a.clipped) x = await clampTo(x, base, 'input');
    let y = await w.store.linear(g, x, `${base}.linear.weight`, [out, inDim], w.scheme, n);
    if (a.clipped) y = await clampTo(y, base, 'output');
    return y;
  };
  // HF's gradient clipping clamps at ±gradient_clipping (default 1e10): a no-op for any
  // value fp16 can hold, so it is built only when it could cut one.
  const gradClip = (x: string) => (a.gradientClipping < 65504 ? g.op('Clip', [x, scalar(-a.gradientClipping), scalar(a.gradientClipping)]) : x);
  // Named by its path inside the layer (scope `audio.layers.3/feed_forward1.pre_layer_norm`): a recipe's
  // rescale rule (fp16 overflow of x·x on the HTP) can address it.
  const norm = async (x: string, name: string, eps: number) => rmsNorm(g, x, await small(`${name}.weight`, [H]), eps, name.replace(/^model\.audio_tower\.layers\.\d+\./, ''));
  const silu = (x: string) => g.op('Mul', [x, g.op('Sigmoid', [x])]);

  const features = g.input(AUDIO_FEATURES, f32, [frames, MEL_BINS]);
  const mask = g.input(AUDIO_MASK, f32, [frames]);

  // ---- subsampling: NCHW convs, LayerNorm over channels in NHWC, frames masked before each conv.
  const x = await g.scoped('audio.subsample', async () => {
    const sub = `${prefix}.subsample_conv_projection`;
    const [c0, c1] = a.channels;
    const conv = async (x4: string, layer: string, cin: number, cout: number) => {
      const wConv = await small(`${sub}.${layer}.conv.weight`, [cout, cin, 3, 3]);
      const y = g.op('Conv', [x4, wConv], { kernel_shape: [3, 3], strides: [2, 2], pads: [1, 1, 1, 1] });
      const nhwc = g.op('Transpose', [y], { perm: [0, 2, 3, 1] });
      const ln = g.op('LayerNormalization', [nhwc, await small(`${sub}.${layer}.norm.weight`, [cout]), g.constFloat32(new Array(cout).fill(0), [cout])], { axis: -1, epsilon: a.eps });
      return g.op('Relu', [ln]); // [1, rows, bins, cout]
    };
    const masked0 = g.op('Mul', [features, g.op('Reshape', [mask, i64([frames, 1])])]);
    const h0 = await conv(g.op('Reshape', [masked0, i64([1, 1, frames, MEL_BINS])]), 'layer0', 1, c0);
    const mask1 = g.op('Slice', [mask, i64([0]), i64([frames]), i64([0]), i64([2])]); // HF's mask[::2]
    const masked1 = g.op('Mul', [h0, g.op('Reshape', [mask1, i64([1, T1, 1, 1])])]);
    const h1 = await conv(g.op('Transpose', [masked1], { perm: [0, 3, 1, 2] }), 'layer1', c0, c1); // [1, T, bins/4, c1]
    const flat = g.op('Reshape', [h1, i64([1, T, (MEL_BINS / 4) * c1])]);
    const y = await w.store.linear(g, flat, `${sub}.input_proj_linear.weight`, [H, (MEL_BINS / 4) * c1], w.scheme, T);
    return named(y, 'audio.embed', H);
  });

  // ---- attention constants: the additive mask [B, C, S] from the frame mask, shared by every layer.
  const contextRows = new BigInt64Array(B * S); // block b, slot j → row b·C + j of the sequence left-padded by P
  for (let b = 0; b < B; b++) for (let j = 0; j < S; j++) contextRows[b * S + j] = BigInt(b * C + j);
  const rowsIdx = g.initializer('audio.context_rows', contextRows, [B * S], 'int64');
  const padRows = P + Tp - T; // rows the gather reads past either end of the T real ones
  const attnMask = await g.scoped('audio.mask', async () => {
    const tokenValid = g.op('Slice', [mask, i64([0]), i64([frames]), i64([0]), i64([4])]); // HF's mask[::2][::2]: [T]
    const padded = g.op('Pad', [tokenValid, i64([P, Tp - T])], { mode: 'constant' });
    const keyValid = g.op('Reshape', [g.op('Gather', [padded, rowsIdx], { axis: 0 }), i64([B, 1, S])]);
    const allowed = g.op('Mul', [keyValid, g.initializer('audio.band', bandMask(C, P), [1, C, S])]);
    // 0 where visible, MASKED (finite in fp16) where not: HF fills -1e9, the same after softmax.
    return g.op('Mul', [g.op('Sub', [scalar(1), allowed]), scalar(MASKED)]);
  });
  const positionTable = g.initializer('audio.relative_positions', relativePositions(H, NP), [1, NP, H]);

  const feedForward = async (h: string, base: string) => {
    let y = await norm(gradClip(h), `${base}.pre_layer_norm`, 1e-6);
    y = silu(await clippedLinear(y, `${base}.ffw_layer_1`, 4 * H, H));
    y = gradClip(await clippedLinear(y, `${base}.ffw_layer_2`, H, 4 * H));
    y = await norm(y, `${base}.post_layer_norm`, 1e-6);
    return g.op('Add', [h, g.op('Mul', [y, scalar(a.residualWeight)])]);
  };

  const attention = async (h: string, base: string) => {
    const qScale = Math.pow(hd, -0.5) / Math.log(2);
    const kScale = Math.log(1 + Math.E) / Math.log(2);
    // q·q_scale·softplus(per_dim_scale): one constant per head dim.
    const perDim = await small(`${base}.per_dim_scale`, [hd], (v) => v.map((s) => qScale * (Math.max(s, 0) + Math.log1p(Math.exp(-Math.abs(s))))));
    const q = g.op('Mul', [g.op('Reshape', [await clippedLinear(h, `${base}.q_proj`, H, H), i64([T, nh, hd])]), perDim]);
    const k = g.op('Mul', [g.op('Reshape', [await clippedLinear(h, `${base}.k_proj`, H, H), i64([T, nh, hd])]), scalar(kScale)]);
    const v = g.op('Reshape', [await clippedLinear(h, `${base}.v_proj`, H, H), i64([T, nh, hd])]);
    // Queries in blocks: [nh, B, C, hd]. Keys/values: each block's S context rows, [nh, B, S, hd].
    const qb = g.op('Transpose', [g.op('Reshape', [g.op('Pad', [q, i64([0, 0, 0, Tp - T, 0, 0])], { mode: 'constant' }), i64([B, C, nh, hd])])], { perm: [2, 0, 1, 3] });
    const context = (t: string) => {
      const padded = g.op('Pad', [t, i64([P, 0, 0, padRows - P, 0, 0])], { mode: 'constant' });
      return g.op('Reshape', [g.op('Gather', [padded, rowsIdx], { axis: 0 }), i64([B, S, nh, hd])]);
    };
    const kc = g.op('Transpose', [context(k)], { perm: [2, 0, 3, 1] }); // [nh, B, hd, S]
    const vc = g.op('Transpose', [context(v)], { perm: [2, 0, 1, 3] }); // [nh, B, S, hd]
    const ac = g.op('MatMul', [qb, kc]);
    // The relative term: queries · relative keys [nh, hd, NP], then HF's rel_shift (pad to S+1, flatten, drop the tail).
    const relK = await w.store.linear(g, positionTable, `${base}.relative_k_proj.weight`, [H, H], w.scheme, NP);
    const relKT = g.op('Transpose', [g.op('Reshape', [relK, i64([NP, nh, hd])])], { perm: [1, 2, 0] });
    const bd0 = g.op('MatMul', [g.op('Reshape', [qb, i64([nh, Tp, hd])]), relKT]); // [nh, Tp, NP]
    const bdPad = g.op('Pad', [g.op('Reshape', [bd0, i64([nh, B, C, NP])]), i64([0, 0, 0, 0, 0, 0, 0, S + 1 - NP])], { mode: 'constant' });
    const bdFlat = g.op('Slice', [g.op('Reshape', [bdPad, i64([nh, B, C * (S + 1)])]), i64([0]), i64([C * S]), i64([2])]);
    const logits = g.op('Add', [ac, g.op('Reshape', [bdFlat, i64([nh, B, C, S])])]);
    const capped = g.op('Mul', [g.op('Tanh', [g.op('Mul', [logits, scalar(1 / a.logitCap)])]), scalar(a.logitCap)]);
    const probs = g.op('Softmax', [g.op('Add', [capped, attnMask])], { axis: -1 });
    const o = g.op('Transpose', [g.op('MatMul', [probs, vc])], { perm: [1, 2, 0, 3] }); // [B, C, nh, hd]
    const rows = g.op('Slice', [g.op('Reshape', [o, i64([Tp, H])]), i64([0]), i64([T]), i64([0])]);
    return clippedLinear(g.op('Reshape', [rows, i64([1, T, H])]), `${base}.post`, H, H);
  };

  const lightConv = async (h: string, base: string) => {
    const K = a.convKernel;
    const y = await clippedLinear(await norm(h, `${base}.pre_layer_norm`, a.eps), `${base}.linear_start`, 2 * H, H);
    const [value, gate] = g.op('Split', [y], { axis: -1 }, 2);
    const glu = g.op('Reshape', [g.op('Mul', [value, g.op('Sigmoid', [gate])]), i64([T, H])]);
    // Causal depthwise conv as K shifted rows × taps (no Conv1d layout changes): out[t] = Σ_k w[k]·x[t−(K−1)+k].
    // The conv's weight [H, 1, K] as taps [K, H] (a constant the compiler folds).
    const taps = g.op('Transpose', [g.op('Reshape', [await small(`${base}.depthwise_conv1d.weight`, [H, 1, K]), i64([H, K])])], { perm: [1, 0] });
    const padded = g.op('Pad', [glu, i64([K - 1, 0, 0, 0])], { mode: 'constant' });
    let acc = '';
    for (let k = 0; k < K; k++) {
      const rows = g.op('Slice', [padded, i64([k]), i64([k + T]), i64([0])]);
      const tap = g.op('Slice', [taps, i64([k]), i64([k + 1]), i64([0])]);
      const term = g.op('Mul', [rows, g.op('Reshape', [tap, i64([1, H])])]);
      acc = acc ? g.op('Add', [acc, term]) : term;
    }
    let z = await norm(gradClip(g.op('Reshape', [acc, i64([1, T, H])])), `${base}.conv_norm`, a.eps);
    z = await clippedLinear(silu(z), `${base}.linear_end`, H, H);
    return g.op('Add', [h, z]);
  };

  let hidden = x;
  for (let i = 0; i < a.layers; i++) {
    const base = `${prefix}.layers.${i}`;
    hidden = await g.scoped(`audio.layers.${i}`, async () => {
      const h1 = await feedForward(hidden, `${base}.feed_forward1`);
      const att = await attention(await norm(gradClip(h1), `${base}.norm_pre_attn`, 1e-6), `${base}.self_attn`);
      const h2 = g.op('Add', [h1, await norm(gradClip(att), `${base}.norm_post_attn`, 1e-6)]);
      const lc = await lightConv(h2, `${base}.lconv1d`);
      const h3 = await feedForward(lc, `${base}.feed_forward2`);
      return named(await norm(gradClip(h3), `${base}.norm_out`, 1e-6), `audio.layer.${i}`, H);
    });
  }

  const out = await g.scoped('audio.embed_audio', async () => {
    const enc = await w.store.linear(g, hidden, `${prefix}.output_proj.weight`, [a.outDims, H], w.scheme, T, await small(`${prefix}.output_proj.bias`, [a.outDims]));
    const encoded = named(enc, 'audio.encoder', a.outDims);
    const normed = rmsNorm(g, encoded, scalar(1), a.eps);
    const tokens = await w.store.linear(g, normed, 'model.embed_audio.embedding_projection.weight', [textHidden, a.outDims], w.scheme, T);
    return named(tokens, 'audio.tokens', textHidden);
  });
  const embeds = g.output(g.op('Reshape', [out, i64([T, textHidden])]), AUDIO_EMBEDS, { shape: [T, textHidden] });
  return {
    inputs: [{ name: features, dtype: f32, shape: [frames, MEL_BINS] }, { name: mask, dtype: f32, shape: [frames] }],
    outputs: [{ name: embeds, dtype: f32, shape: [T, textHidden] }],
    probes,
  };
}
