// Qwen3-VL, model_type "qwen3_vl": image → text. What is special:
// - the text decoder is Qwen3's layer (model.language_model.*) with interleaved multimodal RoPE:
//   positions are three rows (t, h, w); frequency j takes h where j % 3 == 1 and j < 3·section[1],
//   w where j % 3 == 2 and j < 3·section[2], t otherwise. Text has t = h = w (plain RoPE); an image's
//   tokens are (s, s+row, s+col) on the merged grid, and the text after it resumes at max + 1;
// - DeepStack: the encoder's features of chosen vision blocks are added to the residual at the image
//   positions after decoder layers 0 … K−1 (zeros at text positions: the host feeds them);
// - the vision encoder (families/qwen-vit.ts) is a component of its own, one graph over a fixed grid
//   (the recipe's `image` size), whose image_embeds replace the embedding rows of the image tokens.
import { z } from 'zod';
import { ConfigError, parseConfigWith, type Component, type Family, type Feed, type GateCase, type GraphEntry, type ImageLayout, type TensorIO } from './types.js';
import type { GraphBuilder } from '../onnx/builder.js';
import type { Trace } from '../gates/trace.js';
import { kvDecoderBindings, kvDecoderCases, type KvLayout } from './kv-decoder.js';
import { ATTENTION_DECODER_FIELDS, attentionDecoderConfig, decoderComponents, denseDecoderShard, lmHeadGraph, type AttentionDecoderConfig, type ShardFrame } from './decoder.js';
import { qwen3Layer } from './qwen3.js';
import { MLP_RESCALE, VALUES_RESCALE } from './blocks.js';
import { deepstackOutput, IMAGE_EMBEDS, PIXELS, visionEncoderGraph, visionGrid, type VisionConfig } from './qwen-vit.js';

const TextSchema = z.object({
  ...ATTENTION_DECODER_FIELDS,
  rope_parameters: z.object({
    rope_theta: z.number().positive(),
    rope_type: z.string().default('default'),
    mrope_section: z.array(z.number().int().nonnegative()).length(3),
    mrope_interleaved: z.boolean().default(false),
  }).passthrough(),
}).passthrough();

const VisionSchema = z.object({
  depth: z.number().int().positive(),
  hidden_size: z.number().int().positive(),
  intermediate_size: z.number().int().positive(),
  num_heads: z.number().int().positive(),
  patch_size: z.number().int().positive(),
  temporal_patch_size: z.number().int().positive(),
  spatial_merge_size: z.number().int().positive(),
  in_channels: z.number().int().positive().default(3),
  out_hidden_size: z.number().int().positive(),
  num_position_embeddings: z.number().int().positive(),
  deepstack_visual_indexes: z.array(z.number().int().nonnegative()),
  hidden_act: z.literal('gelu_pytorch_tanh', { message: 'only gelu_pytorch_tanh is supported' }),
  rope_parameters: z.object({ rope_theta: z.number().positive() }).passthrough().nullish(),
}).passthrough();

const ConfigSchema = z.object({
  model_type: z.literal('qwen3_vl'),
  text_config: TextSchema,
  vision_config: VisionSchema,
  image_token_id: z.number().int().nonnegative(),
  vision_start_token_id: z.number().int().nonnegative(),
  vision_end_token_id: z.number().int().nonnegative(),
  tie_word_embeddings: z.boolean().default(false),
}).passthrough();

export interface Qwen3VLConfig extends AttentionDecoderConfig {
  /** Half-dim frequency counts for t, h, w (interleaved). */
  mropeSection: [number, number, number];
  vision: VisionConfig;
  tokens: { image: number; visionStart: number; visionEnd: number };
}

/** Qwen3-VL's processor normalises each channel as (x/255 − 0.5)/0.5 (its preprocessor_config.json's image_mean and image_std). */
const IMAGE_NORM = [0.5, 0.5, 0.5];

/** HF's default theta for the axial vision RoPE (the config's rope_parameters, when given, wins). */
const VISION_ROPE_THETA = 10_000;

/**
 * transformers >= 5 writes text_config.rope_parameters; the hub's config.json (written by 4.57) has
 * rope_theta beside rope_scaling {rope_type, mrope_section, mrope_interleaved}: read either.
 */
function withRopeParameters(raw: unknown): unknown {
  const text = (raw as { text_config?: Record<string, unknown> } | null)?.text_config;
  if (!text || text.rope_parameters !== undefined || typeof text.rope_scaling !== 'object' || text.rope_scaling === null) return raw;
  const { rope_scaling: scaling, rope_theta: theta, ...rest } = text;
  return { ...(raw as object), text_config: { ...rest, rope_parameters: { ...(scaling as object), ...(theta !== undefined ? { rope_theta: theta } : {}) } } };
}

export function parseQwen3VLConfig(raw: unknown, file: string): Qwen3VLConfig {
  const c = parseConfigWith(ConfigSchema, withRopeParameters(raw), file);
  const t = c.text_config;
  const text = attentionDecoderConfig(t, c.tie_word_embeddings, file, 'text_config.');
  const section = t.rope_parameters.mrope_section as [number, number, number];
  if (!t.rope_parameters.mrope_interleaved) throw new ConfigError(file, 'text_config.rope_parameters.mrope_interleaved', 'only interleaved multimodal RoPE (Qwen3-VL) is supported');
  if (section[0] + section[1] + section[2] !== text.headDim / 2) {
    throw new ConfigError(file, 'text_config.rope_parameters.mrope_section', `[${section}] sums to ${section[0] + section[1] + section[2]}, not head_dim/2 = ${text.headDim / 2}`);
  }
  const v = c.vision_config;
  if (v.hidden_size % v.num_heads !== 0 || (v.hidden_size / v.num_heads) % 4 !== 0) {
    throw new ConfigError(file, 'vision_config.num_heads', `hidden_size ${v.hidden_size} / num_heads ${v.num_heads} must be a whole head size divisible by 4 (2-D RoPE)`);
  }
  const side = Math.round(Math.sqrt(v.num_position_embeddings));
  if (side * side !== v.num_position_embeddings) throw new ConfigError(file, 'vision_config.num_position_embeddings', `${v.num_position_embeddings} is not a square grid`);
  if (v.out_hidden_size !== text.hidden) throw new ConfigError(file, 'vision_config.out_hidden_size', `${v.out_hidden_size} differs from the text hidden_size ${text.hidden}`);
  const k = v.deepstack_visual_indexes;
  k.forEach((j, i) => { if (j >= v.depth) throw new ConfigError(file, `vision_config.deepstack_visual_indexes.${i}`, `block ${j} is past the vision depth ${v.depth}`); });
  // DeepStack feature i joins the residual after decoder layer i; the last layer's output is the final norm's input.
  if (k.length >= text.layers) throw new ConfigError(file, 'vision_config.deepstack_visual_indexes', `${k.length} DeepStack features need more than ${text.layers} decoder layers`);
  return {
    ...text,
    mropeSection: section,
    vision: {
      depth: v.depth, hidden: v.hidden_size, ffn: v.intermediate_size, heads: v.num_heads, patch: v.patch_size,
      temporal: v.temporal_patch_size, merge: v.spatial_merge_size, channels: v.in_channels, outHidden: v.out_hidden_size,
      positions: v.num_position_embeddings, deepstack: [...k], ropeTheta: v.rope_parameters?.rope_theta ?? VISION_ROPE_THETA,
    },
    tokens: { image: c.image_token_id, visionStart: c.vision_start_token_id, visionEnd: c.vision_end_token_id },
  };
}

const TEXT = 'model.language_model';
const EMBEDDING = `${TEXT}.embed_tokens.weight`;
const VISUAL = 'model.visual';
const VISION = 'vision';
const lmHeadWeight = (c: Qwen3VLConfig) => (c.tied ? EMBEDDING : 'lm_head.weight');
const kvLayout = (c: Qwen3VLConfig, maxContext: number): KvLayout => ({ maxContext, layer: () => ({ kvHeads: c.kvHeads, headDim: c.headDim }) });
const deepstackInput = (layer: number) => `deepstack_${layer}`;

/** Qwen3-VL's encoder has a fixed grid: every image is stretched to the recipe's height × width. */
function stretchSize(image: ImageLayout): { height: number; width: number } {
  if (image.height === undefined || image.width === undefined) throw new Error('qwen3_vl stretches every image to one size (the encoder\'s grid is fixed): the recipe\'s image setting needs "height" and "width", not a soft-token budget');
  return { height: image.height, width: image.width };
}

/** Which of t (0), h (1), w (2) each of the headDim rotary columns takes (interleaved; both halves alike). */
export function mropeAxes(section: [number, number, number], headDim: number): number[] {
  const half = Array.from({ length: headDim / 2 }, (_, j) => (j % 3 === 1 && j < 3 * section[1] ? 1 : j % 3 === 2 && j < 3 * section[2] ? 2 : 0));
  return [...half, ...half];
}

/** The shard frame: positions [3, N] → interleaved RoPE rows; DeepStack inputs after the first layers. */
function frame(c: Qwen3VLConfig, deepstack: boolean): ShardFrame {
  const d = c.headDim;
  return {
    rope(g: GraphBuilder, n: number, tables: { cos: string; sin: string }) {
      const position = g.input('position', 'int32', [3, n]);
      // One table row per axis, then each column from its axis: a one-hot mask summed over the axes (exact).
      const axes = mropeAxes(c.mropeSection, d);
      const onehot = new Float32Array(3 * d);
      axes.forEach((a, j) => { onehot[a * d + j] = 1; });
      const mask = g.initializer('mrope.axes', onehot, [3, 1, d]);
      const pick = (table: string) => g.op('Reshape', [
        g.op('ReduceSum', [g.op('Mul', [g.op('Gather', [table, position], { axis: 0 }), mask]), g.constInt64([0])], { keepdims: 0 }),
        g.constInt64([1, 1, n, d]),
      ]);
      return { input: { name: position, dtype: 'int32', shape: [3, n] }, rope: { cos: pick(tables.cos), sin: pick(tables.sin) } };
    },
    afterLayer(g: GraphBuilder, x: string, layer: number, n: number) {
      if (!deepstack || layer >= c.vision.deepstack.length) return { x, inputs: [] };
      const ds = g.input(deepstackInput(layer), 'float32', [1, n, c.hidden]);
      return { x: g.op('Add', [x, ds], {}, 1, { outputs: [`deepstack.${layer}.added`] }) as string, inputs: [{ name: ds, dtype: 'float32', shape: [1, n, c.hidden] }] };
    },
  };
}

export const qwen3_vl: Family<Qwen3VLConfig> = {
  id: 'qwen3_vl',
  hostOp: 'qwen3_vl_generate',
  parseConfig: parseQwen3VLConfig,
  numLayers: (c) => c.layers,
  hostTables: (c) => [{ name: 'embedding', use: 'embedding', tensor: EMBEDDING, shape: [c.vocab, c.hidden], dtype: 'float16' }],
  components(c, layout) {
    const image = layout.image;
    const text = decoderComponents(layout, {
      shard: (g, s, w) => denseDecoderShard(g, c, s, w, { finalNorm: `${TEXT}.norm.weight`, lmHead: lmHeadWeight(c) },
        (x, layer, io) => qwen3Layer(g, c, `${TEXT}.layers`, layer, x, io, w), frame(c, image !== undefined)),
      lmHead: (g, w) => lmHeadGraph(g, c.hidden, c.vocab, lmHeadWeight(c), w),
    });
    if (!image) return text;
    const stretch = stretchSize(image);
    for (const [field, size] of [['height', stretch.height], ['width', stretch.width]] as const) {
      if (size % (c.vision.patch * c.vision.merge) !== 0) throw new Error(`image ${field} ${size} is not a multiple of patch ${c.vision.patch} × merge ${c.vision.merge}`);
    }
    const vision: Component = {
      name: VISION, kind: VISION, weights: 'encoder', entry: {},
      variants: [{ name: '', n: visionGrid(c.vision, stretch).patches, role: VISION, build: (g, w) => visionEncoderGraph(g, c.vision, stretch, VISUAL, w) }],
    };
    return [vision, ...text];
  },
  // What the runtime needs to turn an image file into the encoder's input and the prompt's tokens.
  hostOpParams: (c, layout) => ({
    image_token_id: c.tokens.image, vision_start_token_id: c.tokens.visionStart, vision_end_token_id: c.tokens.visionEnd,
    mrope_section: c.mropeSection.join(','),
    ...(layout?.image ? {
      image_height: stretchSize(layout.image).height, image_width: stretchSize(layout.image).width, patch_size: c.vision.patch,
      temporal_patch_size: c.vision.temporal, merge_size: c.vision.merge, image_mean: IMAGE_NORM.join(','), image_std: IMAGE_NORM.join(','),
    } : {}),
  }),
  gateCases: (c, entry, trace, maxContext) => (entry.kind === VISION ? visionCases(trace, entry) : shardCases(c, entry, trace, maxContext)),
  bindings(c, entry, maxContext) {
    if (entry.kind === VISION) {
      return {
        inputs: entry.inputs.map((t) => ({ ...t, bind: 'pixels' as const })),
        outputs: entry.outputs.map((t) => ({ ...t, bind: 'encoder-output' as const })),
        state: [],
      };
    }
    return kvDecoderBindings(entry, kvLayout(c, maxContext), undefined, (t) => {
      const m = /^deepstack_(\d+)$/.exec(t.name);
      return m ? { ...t, bind: 'encoder-output', component: VISION, output: deepstackOutput(Number(m[1])) } : undefined;
    });
  },
  // The text decoder's layers are Qwen3's.
  rescalePairs: [MLP_RESCALE, VALUES_RESCALE],
};

/** The encoder at each image prompt: HF's pixel_values in, its merged tokens, DeepStack features and block outputs out. */
async function* visionCases(trace: Trace, entry: GraphEntry): AsyncGenerator<GateCase> {
  // An encoder no image reached is not gated: said, not passed.
  if (!trace.meta.prompts.some((p) => p.image)) throw new Error(`${entry.name}: the trace holds no image prompt, so the vision encoder cannot be gated: give the recipe gates.imagePrompts`);
  for (let p = 0; p < trace.meta.prompts.length; p++) {
    if (!trace.meta.prompts[p].image) continue;
    const pixels = entry.inputs.find((t) => t.name === PIXELS)!;
    const expected: Record<string, Float32Array> = {};
    for (const o of entry.outputs) expected[o.name] = await trace.getPrompt(p, o.name === IMAGE_EMBEDS ? 'vision.merged' : `vision.deepstack.${o.name.slice('deepstack_'.length)}`);
    for (const [value, probe] of Object.entries(entry.probes)) expected[value] = await trace.getPrompt(p, probe.name);
    yield { prompt: p, step: 0, feeds: { [PIXELS]: { dtype: 'float32', data: await trace.getPrompt(p, 'pixels'), dims: pixels.shape } }, expected };
  }
}

/**
 * A decoder shard's cases as for Qwen3, with the positions HF used (trace `mrope`, three rows per
 * step) and, for the shards holding the first layers, the DeepStack rows of the image tokens.
 */
async function* shardCases(c: Qwen3VLConfig, entry: GraphEntry, trace: Trace, maxContext: number): AsyncGenerator<GateCase> {
  const ds = entry.inputs.filter((t) => /^deepstack_\d+$/.test(t.name));
  const hasPositions = entry.inputs.some((t) => t.name === 'position');
  const H = c.hidden;
  const n = entry.n;
  for await (const k of kvDecoderCases(entry, trace, kvLayout(c, maxContext))) {
    if (!hasPositions) { yield k; continue; }
    const prompt = trace.meta.prompts[k.prompt];
    const valid = n === 1 ? 1 : Math.min(n, prompt.prompt_tokens.length - k.step);
    const pos = new Int32Array(3 * n);
    for (let r = 0; r < n; r++) {
      // Padding rows repeat the last real row's positions, one further each (masked anyway).
      const row = await trace.get(k.prompt, k.step + Math.min(r, valid - 1), 'mrope');
      for (let a = 0; a < 3; a++) pos[a * n + r] = Math.min(row[a] + Math.max(0, r - valid + 1), maxContext - 1);
    }
    const feeds: Record<string, Feed> = { ...k.feeds, position: { dtype: 'int32', data: pos, dims: [3, n] } };
    for (const t of ds) {
      const layer = Number(t.name.slice('deepstack_'.length));
      const rows = new Float32Array(n * H);
      const img = prompt.image;
      if (img) {
        const feature = await trace.getPrompt(k.prompt, `vision.deepstack.${layer}`);
        for (let r = 0; r < valid; r++) {
          const at = k.step + r - img.start;
          if (at >= 0 && at < img.tokens) rows.set(feature.subarray(at * H, (at + 1) * H), r * H);
        }
      }
      feeds[t.name] = { dtype: 'float32', data: rows, dims: [1, n, H] };
    }
    yield { ...k, feeds };
  }
}
