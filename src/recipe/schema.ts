// A recipe is data: which checkpoint, which family, how to cut and quantize it per arch, how to gate
// it, and what the card says. Everything here is validated; an invalid recipe names the field path.
import { z } from 'zod';

export const FAMILY_IDS = ['qwen3', 'qwen3_5', 'phimoe', 'gemma4', 'qwen3_vl'] as const;
export type FamilyId = (typeof FAMILY_IDS)[number];

/**
 * Tiny twins oracles/make_twin.py makes, each of a family: one per family under the family's id,
 * and variants of a family's shapes (qwen3_odd: in-features no MatMulNBits block divides, 120 and
 * 150, which the quant forms pad: quant/pad.ts).
 */
export const TWIN_FAMILY = {
  qwen3: 'qwen3', qwen3_5: 'qwen3_5', phimoe: 'phimoe', gemma4: 'gemma4', qwen3_vl: 'qwen3_vl',
  qwen3_odd: 'qwen3',
} as const satisfies Record<string, FamilyId>;
export type TwinId = keyof typeof TWIN_FAMILY;
export const TWIN_IDS = Object.keys(TWIN_FAMILY) as [TwinId, ...TwinId[]];

/** A pinned hub revision: the commit sha (a branch or tag moves). `forge build --revision` takes the same. */
export const RevisionSchema = z
  .string({ error: (iss) => (iss.input === undefined ? 'required: a 40-hex-digit commit sha, or null with "unpinned": "<why>" while it cannot be pinned' : 'a pinned revision is a 40-hex-digit commit sha string') })
  .regex(/^[0-9a-f]{40}$/, 'a pinned revision is a 40-hex-digit commit sha (not a branch or tag)');

/**
 * fetch refuses a checkpoint with a NaN or ±Inf in a tensor forge reads (tensors nothing reads are
 * not checked, and need no leave); this turns that check off, for weights that are read and are
 * non-finite by design, and must say why (the run record and the card repeat it). The gates still
 * refuse non-finite outputs.
 */
const allowNonFinite = z.object({ reason: z.string().trim().min(1, 'say why non-finite weights are allowed') }).strict().optional();

/**
 * A hub checkpoint. `revision` is the commit its weights are fetched at; `null` says it is not pinned
 * yet, and then `unpinned` must say why. Only fetching the weights needs the revision: `forge plan`
 * reads the recorded config, and `forge build --revision <sha>` pins one for that build.
 */
const HubSourceSchema = z.object({
  kind: z.literal('hub'),
  repo: z.string().regex(/^[\w.-]+\/[\w.-]+$/, 'expected <org>/<name>'),
  revision: RevisionSchema.nullable(),
  unpinned: z.string().trim().min(1, 'say why the revision is not pinned').optional(),
  allowNonFinite,
}).strict().superRefine((s, ctx) => {
  if (s.revision === null && s.unpinned === undefined) {
    ctx.addIssue({ code: 'custom', path: ['unpinned'], message: 'a hub source with "revision": null must say why it is not pinned ("unpinned": "<why>")' });
  }
  // Only a valid sha is 'pinned' (a branch name is refused by its own message).
  if (s.unpinned !== undefined && RevisionSchema.safeParse(s.revision).success) {
    ctx.addIssue({ code: 'custom', path: ['unpinned'], message: 'the revision is pinned: drop "unpinned" (it says why a revision is not pinned)' });
  }
});

export const SourceSchema = z.discriminatedUnion('kind', [
  HubSourceSchema,
  z.object({ kind: z.literal('local'), path: z.string().min(1), allowNonFinite }).strict(),
  z.object({ kind: z.literal('tiny'), twin: z.enum(TWIN_IDS), allowNonFinite }).strict(),
]);
export type Source = z.infer<typeof SourceSchema>;
export type HubSource = Extract<Source, { kind: 'hub' }>;

/**
 * A source a build can fetch: a hub source with its revision (the recipe's, or `--revision`'s; then
 * `unpinned` still carries the recipe's reason for not pinning one). See pinnedRecipe (load.ts).
 */
export type PinnedSource = Exclude<Source, { kind: 'hub' }> | (HubSource & { revision: string });

/** The hub revision a build fetches and where it came from (the run record and the card say both). */
export interface BuiltRevision { repo: string; revision: string; from: 'recipe' | '--revision'; unpinned?: string }

export function builtRevision(s: PinnedSource): BuiltRevision | undefined {
  if (s.kind !== 'hub') return undefined;
  // A recipe that pins its revision has no `unpinned` (the schema refuses both): present, --revision gave it.
  return s.unpinned === undefined ? { repo: s.repo, revision: s.revision, from: 'recipe' } : { repo: s.repo, revision: s.revision, from: '--revision', unpinned: s.unpinned };
}

/**
 * Weight precision of the matmuls: w8 = int8 per output row; w4 = int4 blocks of 32 (quant/w4.ts).
 * A matrix whose in-features MatMulNBits' block does not divide is stored zero-padded (quant/pad.ts).
 */
export const QuantSchemeSchema = z.enum(['fp32', 'fp16', 'w8', 'w4']);
export type QuantScheme = z.infer<typeof QuantSchemeSchema>;

/**
 * The layers' weight precision: a scheme, or 'auto' = every matrix starts at w4 and the `precision`
 * stage (quant/auto.ts) promotes to w8 (then fp16) the layers the oracle says cannot take it.
 */
export const LayerQuantSchema = z.enum(['fp32', 'fp16', 'w8', 'w4', 'auto']);
export type LayerQuant = z.infer<typeof LayerQuantSchema>;

/** The scheme a layer's matrices start from (and are stored in, unless promoted or overridden). */
export const baseScheme = (q: LayerQuant): QuantScheme => (q === 'auto' ? 'w4' : q);

/**
 * The lm-head's weight precision: a scheme, or 'auto' = it starts at w4 and the `precision` stage
 * promotes it (w8, then fp16) while the oracle's top-1 or host parity fails, as it does a layer.
 */
export const LmHeadQuantSchema = LayerQuantSchema;
export type LmHeadQuant = LayerQuant;

/** Whether the build runs the `precision` stage: the layers' or the lm-head's precision is the gates' to choose. */
export const choosesPrecision = (s: { quant: LayerQuant; lmHead: { quant: LmHeadQuant } }): boolean => s.quant === 'auto' || s.lmHead.quant === 'auto';

/** A regular expression a recipe line matches names with (whole names: anchored). */
const PatternSchema = z.string().min(1).superRefine((m, ctx) => {
  try {
    new RegExp(`^(?:${m})$`);
  } catch (e) {
    ctx.addIssue({ code: 'custom', message: `not a regular expression: ${(e as Error).message}` });
  }
});

/**
 * A recipe's pin on some matrices' precision: every matmul weight whose tensor name the regular
 * expression matches whole (first matching override wins) is stored in `quant`, whatever the
 * scheme, and `auto` never moves it. One that matches no matrix is refused at plan (a typo).
 */
export const PrecisionOverrideSchema = z.object({
  match: PatternSchema,
  quant: QuantSchemeSchema,
  why: z.string().trim().min(1).optional(),
}).strict();
export type PrecisionOverride = z.infer<typeof PrecisionOverrideSchema>;

/**
 * An exact rewrite of one or more ops that fp16 cannot hold (forge bisect's fix for an overflow on
 * the HTP): `match` is a pattern over the graphs' op scopes (`layers.2/input_layernorm`, as node names
 * show them), `scale` a power of two the op's input is multiplied by and its result corrected for.
 */
export const RescaleSchema = z.object({
  match: PatternSchema,
  scale: z.number().positive().refine((s) => Number.isInteger(Math.log2(s)), 'a power of two (exact in every float format)'),
  why: z.string().trim().min(1).optional(),
}).strict();
export type Rescale = z.infer<typeof RescaleSchema>;

/**
 * An exact rebalancing of one expert's channels before it is quantized (forge bisect's fix for an
 * expert W8 cannot hold): `match` is a pattern over `layers.<L>.experts.<E>`; intermediate channel j
 * gets its up-projection row multiplied by a power of two s_j and its down-projection column
 * divided by it, s_j chosen so the down-projection's columns have like ranges (the same function:
 * the expert is linear in its up row). The experts' host tables honour it; nothing else moves.
 */
export const EqualizeSchema = z.object({
  match: PatternSchema,
  why: z.string().trim().min(1).optional(),
}).strict();
export type Equalize = z.infer<typeof EqualizeSchema>;

const layerRange = z
  .tuple([z.number().int().nonnegative(), z.number().int().nonnegative()])
  .refine(([a, b]) => a <= b, 'a layer range is [first, last] with first <= last');

const LmHeadSchema = z.object({
  placement: z.enum(['separate', 'last-shard']),
  quant: LmHeadQuantSchema,
}).strict();

/** Per-arch settings as written in a recipe: every field optional, no defaults (so an arch's own
 *  block overrides only what it names). */
export const ArchSettingsPatchSchema = z.object({
  /** 'auto' plans from bytes and the arch ceiling; a list pins layer ranges [first, last] (inclusive). */
  shards: z.union([z.literal('auto'), z.array(layerRange).min(1)]),
  quant: LayerQuantSchema,
  /** Per-matrix precision pins by tensor-name pattern (PrecisionOverrideSchema), in order. */
  overrides: z.array(PrecisionOverrideSchema),
  /** Exact op rescalings in the shipped graphs (RescaleSchema), for values fp16 cannot hold. */
  rescale: z.array(RescaleSchema),
  /** Experts whose channels are rebalanced before quantization (EqualizeSchema), in the host tables. */
  equalize: z.array(EqualizeSchema),
  lmHead: LmHeadSchema,
  maxContext: z.number().int().positive(),
  /** Tokens per prefill graph call (AR-N); 0 means decode-over-prompt only. */
  prefillLength: z.number().int().nonnegative(),
  /**
   * The dtype of the residual stream between contexts (and host → first context → lm-head):
   * 'auto' lets the oracle gate choose (f16 when the shipped graphs chained with f16 hand-offs keep
   * every greedy decision, f32 otherwise), 'f16' requires it to hold, 'f32' keeps float32.
   */
  handoff: z.enum(['f32', 'f16', 'auto']),
  /**
   * How images reach the vision encoder (families with one; null: no image input): stretched to a
   * fixed height × width (Qwen-VL: the compiled encoder has a static grid), or resized keeping their
   * aspect ratio within a budget of soft tokens (Gemma 4: maxSoftTokens, one of the budgets its
   * processor supports, checked by the family; the encoder takes the grid as an input).
   */
  image: z.union([
    z.object({ height: z.number().int().positive(), width: z.number().int().positive() }).strict(),
    z.object({ maxSoftTokens: z.number().int().positive() }).strict(),
  ]).nullable(),
  /**
   * How long an audio clip may be (families with an audio encoder; null: no audio input). The
   * encoder is compiled for a fixed number of log-mel frames: HF's extractor makes one every 10 ms
   * of 16 kHz audio (Gemma 4: maxSeconds 30 is its processor's cap, 2999 frames, 750 soft tokens);
   * a shorter clip is padded and masked, a longer one is refused.
   */
  audio: z.object({ maxSeconds: z.number().positive() }).strict().nullable(),
}).strict().partial();

export const ARCH_SETTING_DEFAULTS = {
  shards: 'auto',
  quant: 'w8',
  overrides: [],
  rescale: [],
  equalize: [],
  lmHead: { placement: 'separate', quant: 'fp16' },
  maxContext: 512,
  prefillLength: 32,
  handoff: 'f32',
  image: null,
  audio: null,
} as const;

/** The settings one arch builds with: defaults, then the recipe's `default` block, then the arch's. */
export const ArchSettingsSchema = ArchSettingsPatchSchema.required();
export type ArchSettings = z.infer<typeof ArchSettingsSchema>;

/** A field that was removed: present, it is refused with what replaced it (absent, it is fine). */
function removedField(name: string, replacement: string) {
  return z.undefined({ error: () => `${name} was removed (issue 13): ${replacement}` }).optional();
}

/**
 * Default w4MinCosine, from measurement (docs/precision.md, W4): round-to-nearest W4 moves each twin matrix by
 * ~9.6% of its norm (W8: ~0.6%), and the gate's per-graph minimum over every traced step was 0.8798
 * on tiny-qwen3 (decode, layer 3's K row) and 0.9302 on tiny-qwen3.5, against 0.9995 in W8. 0.85
 * sits under both with a margin; a wrong nibble order or zero point gives unrelated outputs (cosine
 * near 0), far below it. Real checkpoints were not measured: a recipe may set its own.
 */
export const W4_MIN_COSINE = 0.85;

/**
 * Default autoMinCosine: the teacher-forced cosine each layer alone must keep under `auto` (every
 * output of its one-layer graph, HF's inputs fed). See docs/precision.md (auto) for the figures it sits on.
 */
export const AUTO_MIN_COSINE = 0.97;

/**
 * The oracle threshold the shipped graphs of a scheme are held to. `auto` graphs mix w4 and w8
 * layers and are cut into shards (a layer's error reaches the next one in its shard), so they are
 * held to w4's bound; the precision stage held each layer alone to autoMinCosine, and parity holds
 * the whole chain.
 */
export function shippedMinCosine(o: { fp32MinCosine: number; w8MinCosine: number; w4MinCosine: number }, scheme: LayerQuant): number {
  return scheme === 'fp32' ? o.fp32MinCosine : scheme === 'w4' || scheme === 'auto' ? o.w4MinCosine : o.w8MinCosine;
}

/**
 * A prompt with an image (families with a vision encoder): the text after the image, and one of the
 * images oracles/twin_images.py draws (made by code, so no photo is downloaded or committed).
 */
export const ImagePromptSchema = z.object({
  text: z.string().min(1),
  image: z.object({ made: z.string().regex(/^[\w.-]+\.(png|jpg)$/, 'a test image name such as red-circle.png (oracles/twin_images.py)') }).strict(),
}).strict();
export type ImagePrompt = z.infer<typeof ImagePromptSchema>;

/**
 * A prompt with an audio clip (families with an audio encoder): the text after the clip, and one of
 * the clips oracles/twin_audio.py synthesises (made by code: no recording is downloaded or committed).
 */
export const AudioPromptSchema = z.object({
  text: z.string().min(1),
  audio: z.object({ made: z.string().regex(/^[\w.-]+\.wav$/, 'a test clip name such as low-tones.wav (oracles/twin_audio.py)') }).strict(),
}).strict();
export type AudioPrompt = z.infer<typeof AudioPromptSchema>;

export const GateSettingsSchema = z.object({
  prompts: z.array(z.string().min(1)).min(1),
  /** Prompts with an image, traced after the text prompts (needs the arch settings' `image` size). */
  imagePrompts: z.array(ImagePromptSchema).default([]),
  /** Prompts with an audio clip, traced after the image prompts (needs the arch settings' `audio` budget). */
  audioPrompts: z.array(AudioPromptSchema).default([]),
  oracle: z.object({
    fp32MinCosine: z.number().min(0).max(1).default(0.99999),
    w8MinCosine: z.number().min(0).max(1).default(0.999),
    /** The shipped graphs' threshold when the quant is w4 (docs/precision.md: measured on the twins). */
    w4MinCosine: z.number().min(0).max(1).default(W4_MIN_COSINE),
    /** Under quant 'auto': the cosine every layer alone must keep (quant/auto.ts); its matrices are promoted until it does. */
    autoMinCosine: z.number().min(0).max(1).default(AUTO_MIN_COSINE),
    /** Fraction of traced steps whose logits' argmax must match HF's. */
    minTop1: z.number().min(0).max(1).default(1),
  }).strict().default({ fp32MinCosine: 0.99999, w8MinCosine: 0.999, w4MinCosine: W4_MIN_COSINE, autoMinCosine: AUTO_MIN_COSINE, minTop1: 1 }),
  parity: z.object({
    tokens: z.number().int().positive().default(64),
    /** Fraction of tokens that must match HF greedy, in every variant (fp32 and the shipped precision); 1 means N/N. */
    minMatch: z.number().min(0).max(1).default(1),
    /**
     * Mismatches allowed as ties (HF's own top-1/top-2 margin within what the precision's measured
     * logit error can move; src/gates/parity.ts), per variant and target. More than 0 needs the
     * reason in `tiesWhy`, printed with the gate's figures and on the card.
     */
    maxTies: z.number().int().min(0).default(0),
    tiesWhy: z.string().min(1).optional(),
    w8MinMatch: removedField('w8MinMatch', 'every variant is gated at minMatch; name near-ties with maxTies and tiesWhy'),
    w8Why: removedField('w8Why', 'a reason for allowed ties goes in tiesWhy (with maxTies)'),
  }).strict()
    .refine((p) => p.maxTies === 0 || p.tiesWhy !== undefined, { message: 'a maxTies above 0 needs tiesWhy: the reason this recipe accepts near-ties', path: ['tiesWhy'] })
    .default({ tokens: 64, minMatch: 1, maxTies: 0 }),
  /**
   * Run the compiled contexts on the x86 HTP simulator (teacher-forced cosine and parity). It takes
   * 50–300 ms a graph call even for a tiny twin, so only small recipes ask for it.
   */
  emulation: z.boolean().default(false),
}).strict();

export const CardSchema = z.object({
  title: z.string().min(1),
  license: z.string().min(1),
  caveats: z.array(z.string()).default([]),
}).strict();

/**
 * Where the recorded config's values were copied from when not from the pinned revision itself (an
 * unpinned recipe must say): a file at a commit of a repository, and what the copy is.
 */
export const ConfigSourceSchema = z.object({
  repo: z.string().min(1),
  path: z.string().min(1),
  commit: z.string().regex(/^[0-9a-f]{40}$/, 'a 40-hex-digit commit sha'),
  note: z.string().trim().min(1),
}).strict();

export const RecipeSchema = z.object({
  id: z.string().regex(/^[a-z0-9][a-z0-9.\-]*$/, 'lower-case letters, digits, dots and dashes'),
  family: z.enum(FAMILY_IDS),
  modalities: z.array(z.enum(['text', 'image', 'audio'])).min(1),
  source: SourceSchema,
  /**
   * The model's config.json (the fields the family reads), recorded so `forge plan` works offline
   * and a fetched checkpoint that differs is refused. Optional for tiny twins (made here).
   */
  config: z.record(z.string(), z.unknown()).optional(),
  configSource: ConfigSourceSchema.optional(),
  arch: z.object({
    default: ArchSettingsPatchSchema.default({}),
  }).catchall(ArchSettingsPatchSchema).default({ default: {} }),
  gates: GateSettingsSchema,
  card: CardSchema,
}).strict().superRefine((r, ctx) => {
  if (r.source.kind === 'tiny' && TWIN_FAMILY[r.source.twin] !== r.family) {
    ctx.addIssue({ code: 'custom', path: ['source', 'twin'], message: `the twin ${r.source.twin} is of family ${TWIN_FAMILY[r.source.twin]}, not the recipe's ${r.family}` });
  }
  if (r.source.kind === 'hub' && r.source.revision === null && r.config === undefined) {
    ctx.addIssue({ code: 'custom', path: ['config'], message: 'an unpinned hub recipe must record the model config: forge plan reads it, and a checkpoint fetched with --revision is checked against it' });
  }
  if (r.source.kind === 'hub' && r.source.revision === null && r.configSource === undefined) {
    ctx.addIssue({ code: 'custom', path: ['configSource'], message: 'an unpinned hub recipe must say where its recorded config was copied from (repo, path, commit, note)' });
  }
});

export type Recipe = z.infer<typeof RecipeSchema>;
/** A recipe a build can fetch (its hub revision known). */
export type PinnedRecipe = Recipe & { source: PinnedSource };
