// Gemma 4 (E2B/E4B), model_type "gemma4": the text decoder is nested in `text_config`, its weights
// live under `model.language_model.*`; the vision tower is a component of its own when the recipe
// gives images a soft-token budget (gemma4-vision.ts), the audio tower one when it gives clips a
// length budget (gemma4-audio.ts).
// What is special (transformers' modeling_gemma4.py is the reference):
//  - RMSNorm with a plain w (x·rsqrt(mean x²+eps)·w); v_norm has no weight; q_norm/k_norm over head_dim.
//  - Two layer types with their own head_dim and RoPE: sliding (head_dim, θ 1e4, keys within
//    `sliding_window` positions) and full (global_head_dim, "proportional" RoPE: the first
//    head_dim·factor/2 frequencies are 1/θ^(2i/head_dim), the rest 0, over the whole head).
//  - Attention scaling 1.0 (q_norm/k_norm carry the scale).
//  - Per-layer embeddings (PLE): layer i gets ple.i = (rms(proj(e)·H^-½)[i] + rows[i])·2^-½, e the
//    scaled token embedding (h.0), proj per_layer_model_projection, rows the token's
//    embed_tokens_per_layer row (×√P) sliced per layer; after the MLP, h += rms(W_up(gelu(W_gate h)·ple.i)).
//    The host looks the rows up (per-layer-embedding table); the projection runs in every shard
//    (each shard slices its layers' part; the weight is small next to the layers').
//  - Cross-layer KV sharing: the last num_kv_shared_layers layers read the K/V of the last earlier
//    layer of their type (the donor) and compute none. A shard holding the donor uses its new rows
//    directly; a shard without it reads the donor's cache state (kv.<d>.k) AFTER the donor's graph
//    wrote this step's row, and reads that row at its slot (a one-hot MatMul) (the runtime must write state rows
//    before running the next context — the contract the gemma4 host-op keeps).
//  - layer_scalar multiplies each layer's output; GELU-tanh MLP; final logit softcap c·tanh(x/c); tied lm-head.
//  - Sliding layers' caches are rings (position q in slot q mod R) when the window W is shorter than
//    maxContext, with their own mask (attn_mask_sliding, the runtime's ring mask: a row at q sees
//    p > q − W) and, where a shard reads a sliding donor's cache, the ring slots of the call
//    (ring_slot); full layers keep maxContext slots. R = W + N − 1 with N-token prefill: the N rows a
//    call writes then never overwrite a position a row of the call still sees — which matters where a
//    shard reads a donor's ring after the donor's context wrote the call's rows (R = W for decode only).
// Prefill graphs take N tokens per call (AR-N over the caches and rings, the per-layer inputs of N
// tokens), decode graphs one. An image's soft tokens enter at its placeholder tokens as the residual
// and the per-layer projection's input (`embeds`), with the pad token's per-layer rows
// (Gemma4Model.forward; the trace feeds them so: trace_families.steps_gemma4).
import { z } from 'zod';
import { ConfigError, MAX_DIM, MAX_LAYERS, checkElements, parseConfigWith, type Component, type Family, type GraphBindings, type GraphInterface, type GraphWeights, type ImageLayout, type ShardSpec, type TensorIO } from './types.js';
import type { GraphBuilder } from '../onnx/builder.js';
import type { GraphEntry } from './types.js';
import { kvDecoderBindings, type KvLayout } from './kv-decoder.js';
import { cachedAttention, gatedMlp, geluTanh, mergeHeads, rmsNorm, splitHeads, applyRope, ropeGather, MLP_RESCALE } from './blocks.js';

export { geluTanh } from './blocks.js';
import { decoderComponents } from './decoder.js';
import { newKv, pastKv } from './state-io.js';
import { gemma4AudioCases, gemma4Cases, gemma4VisionCases } from './gemma4-gates.js';
import { AUDIO, gemma4AudioBindings, gemma4AudioComponent, parseGemma4AudioTower, type Gemma4AudioTower } from './gemma4-audio.js';
import { GEMMA4_SOFT_TOKEN_BUDGETS, gemma4Patches, gemma4VisionEncoderGraph, parseGemma4VisionConfig, type Gemma4VisionConfig } from './gemma4-vision.js';

const LAYER_TYPES = ['sliding_attention', 'full_attention'] as const;
type LayerType = (typeof LAYER_TYPES)[number];

const Rope = z.object({
  rope_type: z.enum(['default', 'proportional']),
  rope_theta: z.number().positive(),
  partial_rotary_factor: z.number().positive().max(1).optional(),
  factor: z.literal(1).optional(),
}).passthrough();

const dim = z.number().int().positive().max(MAX_DIM);
const TextConfigSchema = z.object({
  model_type: z.literal('gemma4_text').optional(),
  hidden_size: dim,
  intermediate_size: dim,
  num_hidden_layers: z.number().int().positive().max(MAX_LAYERS),
  num_attention_heads: dim,
  num_key_value_heads: dim,
  num_global_key_value_heads: dim.nullable().optional(),
  head_dim: dim,
  global_head_dim: dim.default(512), // HF's default
  per_layer_config: z.record(z.string(), z.object({ head_dim: dim.optional(), num_key_value_heads: dim.optional() }).passthrough()).optional(),
  vocab_size: dim,
  vocab_size_per_layer_input: dim,
  hidden_size_per_layer_input: dim,
  layer_types: z.array(z.enum(LAYER_TYPES)),
  sliding_window: dim,
  num_kv_shared_layers: z.number().int().nonnegative(),
  final_logit_softcapping: z.number().positive().nullable(),
  rms_norm_eps: z.number().positive(),
  hidden_activation: z.literal('gelu_pytorch_tanh', { message: 'only gelu_pytorch_tanh is supported' }),
  attention_bias: z.literal(false, { message: 'the graphs are built without attention biases' }).default(false),
  attention_k_eq_v: z.literal(false, { message: 'K = V attention (26B/31B) is not supported' }).default(false),
  enable_moe_block: z.literal(false, { message: 'the MoE block (26B-A4B) is not supported' }).default(false),
  use_double_wide_mlp: z.boolean().default(false),
  use_bidirectional_attention: z.union([z.null(), z.literal('none')], { message: 'bidirectional attention is not supported' }).optional(),
  rope_parameters: z.object({ sliding_attention: Rope, full_attention: Rope }),
  tie_word_embeddings: z.boolean().optional(),
  pad_token_id: z.number().int().nonnegative().nullable().optional(),
}).passthrough();

const ConfigSchema = z.object({
  model_type: z.literal('gemma4'),
  text_config: TextConfigSchema,
  vision_config: z.unknown().optional(),
  image_token_id: z.number().int().nonnegative().optional(),
  boi_token_id: z.number().int().nonnegative().optional(),
  eoi_token_id: z.number().int().nonnegative().optional(),
  tie_word_embeddings: z.boolean().optional(),
}).passthrough();

export interface Gemma4Layer {
  type: LayerType;
  heads: number;
  kvHeads: number;
  headDim: number;
  ffn: number;
  /** The layer whose K/V this one reads (itself unless KV-shared). */
  kvFrom: number;
}

export interface Gemma4Config {
  hidden: number;
  layers: number;
  vocab: number;
  eps: number;
  /** Per-layer-embedding width P (the PLE table is [vocab, layers·P]). */
  ple: number;
  slidingWindow: number;
  /** c of the final c·tanh(logits/c); null: none. */
  softcap: number | null;
  tied: boolean;
  layer: Gemma4Layer[];
  /** Per layer type: the inverse frequencies over head_dim/2 (zeros past the rotated ones: proportional RoPE). */
  invFreq: Record<LayerType, Float32Array>;
  /** fp32 √H: HF's fp32 reference scales the embedding by sqrt(H) in the weight dtype (float32 there). */
  embedScale: number;
  pleScale: number;
  /** The vision tower, when the checkpoint has one (null: text only), and the tokens an image is written with. */
  vision: Gemma4VisionConfig | null;
  /** The tokens an image is written with. */
  imageTokens: { image: number; begin: number; end: number } | null;
  /** The pad token, whose per-layer rows HF reads at image and audio tokens (a checkpoint with a tower names it). */
  padToken: number | null;
  /** The audio tower and the tokens a clip is written with (null: no audio_config). */
  audio: Gemma4AudioTower | null;
}

/** HF's inverse frequencies, in float32 like its rope init: default over all of head_dim, proportional over the first factor·d/2. */
export function invFreq(type: 'default' | 'proportional', theta: number, headDim: number, factor = 1): Float32Array {
  const half = headDim / 2;
  const rotated = type === 'proportional' ? Math.floor((factor * headDim) / 2) : half;
  const out = new Float32Array(half);
  for (let i = 0; i < rotated; i++) out[i] = 1 / Math.fround(Math.pow(theta, Math.fround((2 * i) / headDim)));
  return out;
}

export function parseGemma4Config(raw: unknown, file: string): Gemma4Config {
  const parsed = parseConfigWith(ConfigSchema, raw, file);
  const t = parsed.text_config;
  const f = (name: string) => `text_config.${name}`;
  const L = t.num_hidden_layers;
  if (t.layer_types.length !== L) throw new ConfigError(file, f('layer_types'), `${t.layer_types.length} entries for ${L} layers`);
  if (t.num_kv_shared_layers >= L) throw new ConfigError(file, f('num_kv_shared_layers'), `${t.num_kv_shared_layers} leaves no layer computing K/V of ${L}`);
  if (t.vocab_size_per_layer_input !== t.vocab_size) throw new ConfigError(file, f('vocab_size_per_layer_input'), `${t.vocab_size_per_layer_input} differs from vocab_size ${t.vocab_size} (the host looks both rows up by the same token)`);
  for (const type of LAYER_TYPES) {
    const r = t.rope_parameters[type];
    if ((type === 'sliding_attention') !== (r.rope_type === 'default')) {
      throw new ConfigError(file, f(`rope_parameters.${type}.rope_type`), `'${r.rope_type}' for ${type} layers is not supported (sliding: default, full: proportional)`);
    }
  }
  const firstShared = L - t.num_kv_shared_layers;
  const layer = t.layer_types.map((type, i): Gemma4Layer => {
    const own = t.per_layer_config?.[String(i)];
    const full = type === 'full_attention';
    const headDim = own?.head_dim ?? (full ? t.global_head_dim : t.head_dim);
    const kvHeads = own?.num_key_value_heads ?? t.num_key_value_heads;
    if (t.num_attention_heads % kvHeads !== 0) throw new ConfigError(file, f(`per_layer_config.${i}.num_key_value_heads`), `${kvHeads} does not divide num_attention_heads ${t.num_attention_heads}`);
    if (headDim % 2 !== 0) throw new ConfigError(file, f(`per_layer_config.${i}.head_dim`), `${headDim} is odd (RoPE pairs dims)`);
    checkElements(file, f('head_dim'), [t.num_attention_heads, headDim, t.hidden_size], 'q_proj');
    let kvFrom = i;
    if (i >= firstShared) {
      kvFrom = t.layer_types.lastIndexOf(type, firstShared - 1);
      if (kvFrom < 0) throw new ConfigError(file, f('num_kv_shared_layers'), `layer ${i} (${type}) shares K/V, but no earlier ${type} layer computes any`);
    }
    const ffn = t.intermediate_size * (t.use_double_wide_mlp && i >= firstShared ? 2 : 1);
    return { type, heads: t.num_attention_heads, kvHeads, headDim, ffn, kvFrom };
  });
  for (const l of layer) {
    const d = layer[l.kvFrom];
    if (d.headDim !== l.headDim || d.kvHeads !== l.kvHeads) throw new ConfigError(file, f('per_layer_config'), 'a KV-shared layer has another head shape than its donor');
  }
  checkElements(file, f('hidden_size_per_layer_input'), [t.vocab_size, L, t.hidden_size_per_layer_input], 'the PLE table');
  checkElements(file, f('vocab_size'), [t.vocab_size, t.hidden_size], 'the embedding');
  const headOf = (type: LayerType) => layer.find((l) => l.type === type)?.headDim ?? 2;
  const rp = t.rope_parameters;
  return {
    hidden: t.hidden_size, layers: L, vocab: t.vocab_size, eps: t.rms_norm_eps, ple: t.hidden_size_per_layer_input,
    slidingWindow: t.sliding_window, softcap: t.final_logit_softcapping, tied: parsed.tie_word_embeddings ?? t.tie_word_embeddings ?? true,
    layer,
    invFreq: {
      sliding_attention: invFreq('default', rp.sliding_attention.rope_theta, headOf('sliding_attention')),
      full_attention: invFreq('proportional', rp.full_attention.rope_theta, headOf('full_attention'), rp.full_attention.partial_rotary_factor ?? 1),
    },
    embedScale: Math.fround(Math.sqrt(t.hidden_size)),
    pleScale: Math.fround(Math.sqrt(t.hidden_size_per_layer_input)),
    ...towers(parsed, file),
  };
}

/** The vision tower's config and image tokens (a config with a vision tower must name its tokens), and the audio tower's. */
function towers(c: z.infer<typeof ConfigSchema>, file: string): Pick<Gemma4Config, 'vision' | 'imageTokens' | 'audio' | 'padToken'> {
  const audio = parseGemma4AudioTower(c, file);
  // Absent: Gemma4TextConfig's default, 0. null: HF has no id to put at media tokens.
  const padToken = c.text_config.pad_token_id === undefined ? 0 : c.text_config.pad_token_id;
  if (audio?.config && padToken === null) throw new ConfigError(file, 'text_config.pad_token_id', 'is null: HF reads the pad token\'s per-layer embedding at audio tokens');
  if (c.vision_config === undefined || c.vision_config === null) return { vision: null, imageTokens: null, audio, padToken };
  const vision = parseGemma4VisionConfig(c.vision_config, file);
  for (const field of ['image_token_id', 'boi_token_id', 'eoi_token_id'] as const) {
    if (c[field] === undefined) throw new ConfigError(file, field, 'is missing: a checkpoint with a vision tower names the tokens an image is written with');
  }
  if (padToken === null) throw new ConfigError(file, 'text_config.pad_token_id', 'is null: HF reads the pad token\'s per-layer embedding at image tokens');
  return { vision, imageTokens: { image: c.image_token_id!, begin: c.boi_token_id!, end: c.eoi_token_id! }, audio, padToken };
}

export const PREFIX = 'model.language_model';
const layerPrefix = (i: number) => `${PREFIX}.layers.${i}`;
export const EMBEDDING = `${PREFIX}.embed_tokens.weight`;
export const PLE_TABLE = `${PREFIX}.embed_tokens_per_layer.weight`;
const lmHeadWeight = (c: Gemma4Config) => (c.tied ? EMBEDDING : 'lm_head.weight');

/** Graph inputs beyond the decoder's: the token's embedding (h.0) and each layer's PLE token rows. */
export const EMBEDS = 'embeds';
export const pleInput = (layer: number) => `ple_${layer}`;
/** Ring-cache inputs: the sliding layers' mask over the ring, and the call's slot (position mod window). */
export const RING_MASK = 'attn_mask_sliding';
export const RING_SLOT = 'ring_slot';
/**
 * The slots of a sliding layer's ring cache, or null where the cache keeps every position (the window
 * reaches past maxContext): the window, plus N − 1 for N-token prefill (at most maxContext slots; a
 * ring of maxContext never wraps).
 */
export const ringOf = (c: Gemma4Config, maxContext: number, prefillLength = 0): number | null =>
  (c.slidingWindow < maxContext ? Math.min(c.slidingWindow + Math.max(prefillLength, 1) - 1, maxContext) : null);

/** The ring slots a built graph's sliding caches have (its attn_mask_sliding says, else its sliding caches' shape); null: none read. */
export function ringIn(c: Gemma4Config, entry: Pick<GraphEntry, 'inputs' | 'n'>, maxContext: number): number | null {
  if (c.slidingWindow >= maxContext) return null;
  const mask = entry.inputs.find((t) => t.name === RING_MASK);
  if (mask) return mask.shape[3] - entry.n;
  const past = entry.inputs.find((t) => /^past_k_\d+$/.test(t.name) && c.layer[Number(t.name.slice(7))].type === 'sliding_attention');
  return past ? past.shape[2] : null;
}

/** Host-table names in the manifest. */
export const TABLES = { embedding: 'embedding', ple: 'per_layer_embedding' } as const;
/** The runtime host-op for this family (native/src/gemma4_generate/). */
export const HOST_OP = 'gemma4_split_generate';

/** Each layer's KV cache: its own heads and head size, a ring of `ring` slots for sliding layers; KV-shared layers have none (they read the donor's). */
export const kvLayout = (c: Gemma4Config, maxContext: number, ring: number | null): KvLayout => ({
  maxContext,
  layer: (i) => {
    const slots = c.layer[i].type === 'sliding_attention' ? ring : null;
    return { kvHeads: c.layer[i].kvHeads, headDim: c.layer[i].headDim, ...(slots ? { ring: slots } : {}) };
  },
});

export const gemma4: Family<Gemma4Config> = {
  id: 'gemma4',
  hostOp: HOST_OP,
  parseConfig: parseGemma4Config,
  // A KV-shared layer in a shard without its donor gathers the donor's row of this step from the
  // cache (a slot its mask does not open), which the oracle's cache window would cut: the gate runs
  // the graphs on the whole cache.
  gateWindow: false,
  numLayers: (c) => c.layers,
  hostTables: (c) => [
    { name: TABLES.embedding, use: 'embedding', tensor: EMBEDDING, shape: [c.vocab, c.hidden], dtype: 'float16' },
    { name: TABLES.ple, use: 'per-layer-embedding', tensor: PLE_TABLE, shape: [c.vocab, c.layers * c.ple], dtype: 'float16' },
  ],
  // The tables are the checkpoint's rows (fp16); the host multiplies the rows it feeds by these, as
  // HF's scaled embeddings do (the softcap and the sliding window are inside the graphs).
  // With the vision encoder, what the runtime needs to make an image's encoder input and its block of
  // prompt ids (HF's processor at the recipe's budget; the pad token's per-layer rows at image tokens).
  hostOpParams: (c, layout) => ({
    embed_scale: c.embedScale, per_layer_embed_scale: c.pleScale, per_layer_dim: c.ple,
    ...(layout?.image?.maxSoftTokens && c.vision && c.imageTokens ? {
      image_token_id: c.imageTokens.image, boi_token_id: c.imageTokens.begin, eoi_token_id: c.imageTokens.end, pad_token_id: c.padToken!,
      max_soft_tokens: layout.image.maxSoftTokens, patch_size: c.vision.patch, pooling_kernel_size: c.vision.pooling,
    } : {}),
    // With the audio encoder, the clip's tokens and its budget (the feature extractor is HF's default).
    ...(layout?.audio && c.audio?.config ? {
      audio_token_id: c.audio.tokens.audio, boa_token_id: c.audio.tokens.begin, eoa_token_id: c.audio.tokens.end, pad_token_id: c.padToken!,
      audio_max_seconds: layout.audio.maxSeconds,
    } : {}),
  }),
  components(c, layout) {
    const text = decoderComponents(layout, {
      shard: (g, s, w) => gemma4Shard(g, c, s, w),
      lmHead: (g, w) => gemma4LmHead(g, c, w),
    });
    // A dry build asks every encoder a checkpoint has (and forge can build); a text-only one has none to give.
    const vision = layout.image && !(layout.dry && !c.vision) ? [visionComponent(c, layout.image)] : [];
    const audio = layout.audio && !(layout.dry && !c.audio?.config) ? [gemma4AudioComponent(c.audio, c.hidden, layout.audio)] : [];
    return [...vision, ...audio, ...text];
  },
  gateCases: (c, entry, trace, maxContext) => (entry.kind === VISION ? gemma4VisionCases(entry, trace) : entry.kind === AUDIO ? gemma4AudioCases(entry, trace) : gemma4Cases(c, entry, trace, maxContext)),
  bindings: (c, entry, maxContext) => (entry.kind === VISION ? visionBindings(entry) : entry.kind === AUDIO ? gemma4AudioBindings(entry) : gemma4Bindings(c, entry, maxContext)),
  // The decoder's MLP; no values pair: v_norm follows v_proj and would undo it.
  rescalePairs: [MLP_RESCALE],
};

const VISION = 'vision';

/** The vision encoder: one graph over the recipe's soft-token budget, in a context of its own. */
function visionComponent(c: Gemma4Config, image: ImageLayout): Component {
  if (!c.vision) throw new Error('the recipe gives an image setting, but this Gemma 4 checkpoint has no vision tower (config.json has no vision_config)');
  const budget = image.maxSoftTokens;
  if (budget === undefined) throw new Error('gemma4 keeps each image\'s aspect ratio within a soft-token budget: the recipe\'s image setting is {"maxSoftTokens": N}, not a fixed height and width');
  if (!(GEMMA4_SOFT_TOKEN_BUDGETS as readonly number[]).includes(budget)) throw new Error(`image maxSoftTokens ${budget}: Gemma 4's image processor supports ${GEMMA4_SOFT_TOKEN_BUDGETS.join(', ')}`);
  const v = c.vision;
  return {
    name: VISION, kind: VISION, weights: 'encoder', entry: {},
    variants: [{ name: '', n: gemma4Patches(v, budget), role: VISION, build: (g, w) => gemma4VisionEncoderGraph(g, v, c.hidden, budget, w) }],
  };
}

/** The encoder's inputs are the host's pre-processed image; its soft tokens are kept for the shards. */
function visionBindings(entry: GraphEntry): GraphBindings {
  return {
    inputs: entry.inputs.map((t) => ({ ...t, bind: 'pixels' as const })),
    outputs: entry.outputs.map((t) => ({ ...t, bind: 'encoder-output' as const })),
    state: [],
  };
}

// ---- graphs -----------------------------------------------------------------------------------

const f32 = 'float32' as const;
const io = (name: string, shape: number[], dtype: TensorIO['dtype'] = f32): TensorIO => ({ name, dtype, shape });

/** c·tanh(x/c): HF's final logit softcap. */
export function softcap(g: GraphBuilder, x: string, c: number): string {
  return g.op('Mul', [g.op('Tanh', [g.op('Div', [x, g.constFloat32([c], [])])]), g.constFloat32([c], [])]);
}

/** cos/sin tables [ctx, d] from inverse frequencies over d/2 (frequencies repeated twice, HF layout); fp32 angles as HF. */
export function ropeTablesFrom(ctx: number, inv: Float32Array): { cos: Float32Array; sin: Float32Array } {
  const half = inv.length;
  const d = 2 * half;
  const cos = new Float32Array(ctx * d);
  const sin = new Float32Array(ctx * d);
  for (let p = 0; p < ctx; p++) {
    for (let i = 0; i < half; i++) {
      const a = Math.fround(p * inv[i]);
      cos[p * d + i] = cos[p * d + i + half] = Math.cos(a);
      sin[p * d + i] = sin[p * d + i + half] = Math.sin(a);
    }
  }
  return { cos, sin };
}

interface ShardIO {
  ctx: number;
  /** Tokens per call. */
  n: number;
  position: string;
  /** The call's ring slot (position mod window), declared when a shard reads a sliding donor's ring. */
  slot: () => string;
  /** Cache slots per layer type (a ring for sliding layers when the window is shorter than ctx). */
  slots: Record<LayerType, number>;
  /**
   * One-hot [1,1,N,slots] of this call's slots in a layer type's cache: a MatMul with it reads the
   * rows the donor's context wrote. Not a Gather on the slot axis: on the HTP simulator that returned
   * another head's numbers for some positions (tiny-gemma4, position 39: cosine 0.73).
   */
  pick: (type: LayerType) => string;
  rope: Partial<Record<LayerType, { cos: string; sin: string }>>;
  mask: Record<LayerType, string>;
  /** The cache inputs declared so far, by layer (a donor's is read by its own and its sharers' attention). */
  past: Map<number, { k: string; v: string }>;
  /** New K/V rows computed in this graph, by layer. */
  fresh: Map<number, { k: string; v: string }>;
  inputs: TensorIO[];
  outputs: TensorIO[];
}

function pastOf(g: GraphBuilder, c: Gemma4Config, d: number, s: ShardIO): { k: string; v: string } {
  let p = s.past.get(d);
  if (!p) {
    const { kvHeads, headDim, type } = c.layer[d];
    const shape = [1, kvHeads, s.slots[type], headDim];
    p = { k: g.input(pastKv('k', d), f32, shape), v: g.input(pastKv('v', d), f32, shape) };
    s.inputs.push(io(p.k, shape), io(p.v, shape));
    s.past.set(d, p);
  }
  return p;
}

/** One decoder layer on x [1,N,H] with its mixed per-layer input ple [1,N,P]; returns h.{i+1}. */
async function gemma4Layer(g: GraphBuilder, c: Gemma4Config, i: number, x: string, ple: string, w: GraphWeights, s: ShardIO): Promise<string> {
  const { hidden: H, eps } = c;
  const { heads, kvHeads, headDim: d, ffn, type, kvFrom } = c.layer[i];
  const p = layerPrefix(i);
  // Ops named as the checkpoint's modules (`layers.3/self_attn.q_norm/Mul` under the caller's
  // `layers.i` scope): forge bisect's probes name them, and recipe `rescale` lines reach the norms.
  const lin = (x: string, name: string, shape: [number, number]) => g.scoped(name, () => w.store.linear(g, x, `${p}.${name}.weight`, shape, w.scheme, s.n));
  const norm = (x: string, name: string, size: number) => w.store.small(g, `${p}.${name}.weight`, [size]).then((wt) => rmsNorm(g, x, wt, eps, name));
  const rope = s.rope[type]!;
  const n = s.n;

  const xn = await norm(x, 'input_layernorm', H);
  const q = applyRope(g, await norm(splitHeads(g, await lin(xn, 'self_attn.q_proj', [heads * d, H]), heads, d, n), 'self_attn.q_norm', d), rope);
  const past = pastOf(g, c, kvFrom, s);
  let kv: { k: string; v: string };
  if (kvFrom === i) {
    const k = applyRope(g, await norm(splitHeads(g, await lin(xn, 'self_attn.k_proj', [kvHeads * d, H]), kvHeads, d, n), 'self_attn.k_norm', d), rope);
    // v_norm: RMSNorm without a weight.
    const v = rmsNorm(g, splitHeads(g, await lin(xn, 'self_attn.v_proj', [kvHeads * d, H]), kvHeads, d, n), g.constFloat32([1], []), eps, 'self_attn.v_norm');
    const row = [1, kvHeads, n, d];
    kv = { k: g.output(k, newKv('k', i), { shape: row }), v: g.output(v, newKv('v', i), { shape: row }) };
    s.outputs.push(io(kv.k, row), io(kv.v, row));
    s.fresh.set(i, kv);
  } else {
    // The donor's rows of this call: computed here, or already written into its cache by the donor's context.
    const fresh = s.fresh.get(kvFrom);
    if (fresh) kv = fresh;
    else {
      const pick = s.pick(type);
      kv = { k: g.op('MatMul', [pick, past.k]), v: g.op('MatMul', [pick, past.v]) };
    }
  }
  const attn = cachedAttention(g, q, kv.k, kv.v, past.k, past.v, s.mask[type], { heads, kvHeads, headDim: d, n, ctx: s.slots[type], scale: 1 });
  const o = await lin(mergeHeads(g, attn, heads, d, n), 'self_attn.o_proj', [H, heads * d]);
  const h1 = g.op('Add', [x, await norm(o, 'post_attention_layernorm', H)]);
  const m = await norm(h1, 'pre_feedforward_layernorm', H);
  const mlp = await gatedMlp(g, m, geluTanh, (x, which, scale) => w.store.linear(g, x, `${p}.mlp.${which}.weight`, which === 'down_proj' ? [H, ffn] : [ffn, H], w.scheme, n, undefined, undefined, scale));
  const h2 = g.op('Add', [h1, await norm(mlp, 'post_feedforward_layernorm', H)]);
  const gated = g.op('Mul', [geluTanh(g, await lin(h2, 'per_layer_input_gate', [c.ple, H])), ple]);
  const h3 = g.op('Add', [h2, await norm(await lin(gated, 'per_layer_projection', [H, c.ple]), 'post_per_layer_input_norm', H)]);
  return g.op('Mul', [h3, await w.store.small(g, `${p}.layer_scalar`, [1])], {}, 1, { outputs: [`h.${i + 1}`] });
}

/**
 * The per-layer inputs of layers first..last: rms(proj(e)·H^-½) sliced per layer, plus the token's
 * rows, times 2^-½ (HF's project_per_layer_inputs). Returns one [1,N,P] value per layer.
 * The projection [L·P, H] is read for this shard's layers only (rows first·P..(last+1)·P): each
 * output row depends on its weight row alone (W8/W4 scales are per row, or per block within a row),
 * so the slice of the weight gives the same values as slicing the product, and a shard stores
 * (last−first+1)·P rows instead of all L·P (at E4B ~1.1 GB less over the model's shards, W8).
 */
async function perLayerInputs(g: GraphBuilder, c: Gemma4Config, s: ShardSpec, w: GraphWeights, embeds: string, rows: string[]): Promise<string[]> {
  const { hidden: H, layers: L, ple: P } = c;
  const mine = [s.first * P, (s.last + 1) * P] as const;
  // Ops named as the checkpoint's modules (per_layer_model_projection, each layer's
  // per_layer_inputs.i/per_layer_projection_norm): forge bisect names them, rescale lines reach the norms.
  const weight = await g.scoped('per_layer_model_projection', () => w.store.linear(g, embeds, `${PREFIX}.per_layer_model_projection.weight`, [L * P, H], w.scheme, s.n, undefined, mine));
  const proj = g.op('Mul', [weight, g.constFloat32([Math.fround(H ** -0.5)], [])]);
  const normW = await w.store.small(g, `${PREFIX}.per_layer_projection_norm.weight`, [P]);
  const out: string[] = [];
  for (const [k, row] of rows.entries()) {
    const i = s.first + k;
    out.push(await g.scoped(`per_layer_inputs.${i}`, async () => {
      const part = g.op('Slice', [proj, g.constInt64([k * P]), g.constInt64([(k + 1) * P]), g.constInt64([2])]);
      const mixed = g.op('Mul', [g.op('Add', [rmsNorm(g, part, normW, c.eps, 'per_layer_projection_norm'), row]), g.constFloat32([Math.fround(2 ** -0.5)], [])]);
      return g.op('Identity', [mixed], {}, 1, { outputs: [`ple.${i}`] });
    }));
  }
  return out;
}

/**
 * A shard of N tokens per call (N = 1: decode): hidden_in, positions, mask, the embedding rows and
 * PLE rows, each layer's cache (donors' for shared layers).
 */
export async function gemma4Shard(g: GraphBuilder, c: Gemma4Config, s: ShardSpec, w: GraphWeights): Promise<GraphInterface> {
  const { hidden: H, ple: P } = c;
  const { n, maxContext: ctx } = s;
  const x0 = g.input('hidden_in', f32, [1, n, H]);
  const position = g.input('position', 'int32', [n]);
  const mask = g.input('attn_mask', f32, [1, 1, n, ctx + n]);
  const embeds = g.input(EMBEDS, f32, [1, n, H]);
  const layers = Array.from({ length: s.last - s.first + 1 }, (_, k) => s.first + k);
  const rows = layers.map((i) => g.input(pleInput(i), f32, [1, n, P]));
  const inputs = [io(x0, [1, n, H]), io(position, [n], 'int32'), io(mask, [1, 1, n, ctx + n]), io(embeds, [1, n, H]), ...rows.map((r) => io(r, [1, n, P]))];
  const ring = ringOf(c, ctx, s.prefillLength ?? 0);
  let slot: string | undefined;
  const picks = new Map<number, string>();
  const sio: ShardIO = {
    ctx, n, position, rope: {}, mask: { full_attention: mask, sliding_attention: mask }, past: new Map(), fresh: new Map(), inputs, outputs: [],
    slots: { full_attention: ctx, sliding_attention: ring ?? ctx },
    slot: () => {
      if (!slot) {
        slot = g.input(RING_SLOT, 'int32', [n]);
        inputs.push(io(slot, [n], 'int32'));
      }
      return slot;
    },
    // By slot count: a ring's one-hot rows are at the ring slots, a full cache's at the positions
    // (the two layer types share one when there is no ring).
    pick: (type) => {
      const slots = sio.slots[type];
      let hot = picks.get(slots);
      if (!hot) {
        const index = g.initializer(`slot_index.${slots}`, Int32Array.from({ length: slots }, (_, j) => j), [1, slots], 'int32');
        const at = g.op('Reshape', [type === 'sliding_attention' && ring ? sio.slot() : position, g.constInt64([n, 1])]);
        hot = g.op('Reshape', [g.op('Cast', [g.op('Equal', [index, at])], { to: 1 }), g.constInt64([1, 1, n, slots])]);
        picks.set(slots, hot);
      }
      return hot;
    },
  };
  const types = new Set(layers.map((i) => c.layer[i].type));
  for (const type of types) {
    const inv = c.invFreq[type];
    const t = ropeTablesFrom(ctx, inv);
    const d = inv.length * 2;
    sio.rope[type] = ropeGather(g, position, { cos: g.initializer(`rope.${type}.cos`, t.cos, [ctx, d]), sin: g.initializer(`rope.${type}.sin`, t.sin, [ctx, d]) }, n, d);
  }
  // Without a ring every cached position is inside the window (ctx ≤ window): the full mask serves.
  if (ring && layers.some((i) => c.layer[c.layer[i].kvFrom].type === 'sliding_attention')) {
    sio.mask.sliding_attention = g.input(RING_MASK, f32, [1, 1, n, ring + n]);
    inputs.push(io(sio.mask.sliding_attention, [1, 1, n, ring + n]));
  }
  const ple = await perLayerInputs(g, c, s, w, embeds, rows);
  const probes: Record<string, TensorIO> = {};
  let x = x0;
  for (const [k, i] of layers.entries()) {
    probes[ple[k]] = io(`ple.${i}`, [1, n, P]);
    x = await g.scoped(`layers.${i}`, () => gemma4Layer(g, c, i, x, ple[k], w, sio));
    if (i < s.last || s.isLast) probes[x] = io(`h.${i + 1}`, [1, n, H]);
  }
  if (s.isLast) x = rmsNorm(g, x, await w.store.small(g, `${PREFIX}.norm.weight`, [H]), c.eps, 'final_norm');
  const hiddenOut = g.output(x, 'hidden_out', { shape: [1, n, H] });
  const outputs = [io(hiddenOut, [1, n, H]), ...sio.outputs];
  if (s.isLast && s.lmHeadInside) outputs.push(io(await logits(g, c, hiddenOut, w, n), [1, n, c.vocab]));
  return { inputs: sio.inputs, outputs, probes };
}

async function logits(g: GraphBuilder, c: Gemma4Config, x: string, w: GraphWeights, n = 1): Promise<string> {
  const raw = await w.store.linear(g, x, lmHeadWeight(c), [c.vocab, c.hidden], w.lmHeadScheme, n);
  return g.output(c.softcap ? softcap(g, raw, c.softcap) : raw, 'logits', { shape: [1, n, c.vocab] });
}

/** Final-normed hidden [1,1,H] → softcapped logits [1,1,V]. */
async function gemma4LmHead(g: GraphBuilder, c: Gemma4Config, w: GraphWeights): Promise<GraphInterface> {
  const x = g.input('hidden', f32, [1, 1, c.hidden]);
  return { inputs: [io(x, [1, 1, c.hidden])], outputs: [io(await logits(g, c, x, w), [1, 1, c.vocab])], probes: {} };
}

// ---- bindings ---------------------------------------------------------------------------------

/**
 * The decoder's bindings plus: the embedding row and each layer's PLE rows from the host tables; a
 * donor's cache read by a shard that does not write it is the same state, marked shared.
 */
function gemma4Bindings(c: Gemma4Config, entry: GraphEntry, maxContext: number): GraphBindings {
  const ring = ringIn(c, entry, maxContext);
  const extra = new Set([EMBEDS, RING_MASK, RING_SLOT, ...Array.from({ length: c.layers }, (_, i) => pleInput(i))]);
  const plain = kvDecoderBindings({ ...entry, inputs: entry.inputs.filter((t) => !extra.has(t.name)) }, kvLayout(c, maxContext, ring));
  const inputs = entry.inputs.map((t) => {
    if (t.name === EMBEDS) return { ...t, bind: 'host-rows' as const, table: TABLES.embedding, index: 'token' as const };
    if (t.name === RING_MASK) return { ...t, bind: 'mask' as const, window: ring!, sliding: c.slidingWindow };
    if (t.name === RING_SLOT) return { ...t, bind: 'positions' as const, window: ring! };
    const m = /^ple_(\d+)$/.exec(t.name);
    if (m) return { ...t, bind: 'host-rows' as const, table: TABLES.ple, index: 'token' as const, layer: Number(m[1]) };
    return plain.inputs.find((b) => b.name === t.name)!;
  });
  const donors = new Set(c.layer.filter((l, i) => l.kvFrom !== i).map((l) => l.kvFrom));
  const state = plain.state.map((st) => {
    const layer = Number(/^kv\.(\d+)\./.exec(st.name)?.[1]);
    return donors.has(layer) ? { ...st, shared: true } : st;
  });
  return { inputs, outputs: plain.outputs, state };
}
