// The manifest: the only contract between forge and the C++ runtime. forge writes it; the runtime
// validates it on load (native/src/manifest.cpp) and binds every graph input/output by the role
// written here, never by guessing from names. `manifest.schema.json` is generated from this file
// (`npm run manifest-schema`; a test keeps them in sync).
import { z } from 'zod';

export const MANIFEST_FORMAT = 'forge-bundle';

/** Host-ops that run a manifest without its encoder (a vision bundle's text-only manifest), as the runtime's registry says. */
export const RUNS_WITHOUT_ENCODER = new Set(['qwen3_vl_generate']);
/** v2: open host-op names, components, typed bindings to host tables/routing/encoders, windowed and shared state. */
export const MANIFEST_VERSION = 2;

/** Why a QNN context binary is declared nondeterministic (written into the manifest beside it). */
export const NONDETERMINISTIC_QNN_BINARY =
  'QNN HTP graph prepare is not deterministic (seen with QAIRT 2.51 libHtpPrepare in onnxruntime-qnn 2.7.0): its ' +
  'constant propagation runs on 4 threads and, depending on their timing, leaves the upper lane of ' +
  'the interleaved float16 copies of RMSNorm weights unwritten (heap or pool leftovers); the ' +
  'per-graph hash ids inside the binary follow. Tool options, one CPU, no ASLR and a zeroing ' +
  'allocator did not remove it; giving it those weights as float16 moved the race into the order ' +
  'of the constant blocks. Compared by size and by describeSha256 (the binary\'s graphs, API and ' +
  'SDK versions, target and blob size as QnnSystem reads them); the runtime still checks the real sha256.';

const sha256 = z.string().regex(/^[0-9a-f]{64}$/);
const relPath = z.string().min(1).refine((p) => !p.startsWith('/') && !p.split('/').includes('..'), 'a path inside the bundle');
const dtype = z.enum(['float32', 'float16', 'int8', 'uint8', 'int16', 'uint16', 'int32', 'int64', 'bool']);
const shape = z.array(z.number().int().positive()).min(1);

const tensor = { name: z.string().min(1), dtype, shape };

/**
 * An open name: a host-op, a graph role. The runtime's host-op registry decides which exist and
 * what each runs; the schema only keeps them well-formed.
 */
const identifier = z.string().regex(/^[a-z][a-z0-9_]*$/, 'a lowercase identifier (a-z, 0-9, _)');
const index = z.number().int().nonnegative();

/** Where a graph input comes from, as the host-op sees it. */
const InputSchema = z.discriminatedUnion('bind', [
  z.object({ ...tensor, bind: z.literal('residual') }).strict(), // the running hidden state [1, N, H]
  // int32 [N]: absolute positions of the N tokens; with `window`, their ring slots (position mod window).
  // int32 [3, N]: multimodal RoPE (Qwen3-VL), rows t, h, w: equal for text, (s, s+row, s+col) for an image's tokens.
  z.object({ ...tensor, bind: z.literal('positions'), window: z.number().int().positive().optional() }).strict(),
  // additive [1, 1, N, C+N]: see `mask` below; with `window`, over a ring cache of that many slots
  // ([1, 1, N, window+N]: a slot shows while its position is within the window); `sliding`, when the
  // ring holds more slots than a row sees (window + N - 1 for N-token prefill): a row at q sees p > q - sliding.
  z.object({ ...tensor, bind: z.literal('mask'), window: z.number().int().positive().optional(), sliding: z.number().int().positive().optional() }).strict(),
  z.object({ ...tensor, bind: z.literal('state'), state: z.string().min(1) }).strict(), // a state buffer, bound in place
  // Rows of a host table gathered per call: by token id (per-layer embeddings) or by the selected
  // expert (its int8 rows / scales); `layer` picks the layer's slice, `slot` which of the top-k experts.
  z.object({
    ...tensor, bind: z.literal('host-rows'), table: z.string().min(1), index: z.enum(['token', 'expert']),
    layer: index.optional(), slot: index.optional(),
  }).strict(),
  // The host's top-k weights of the experts selected from the router-logits output of `layer`; no
  // layer: the layer whose router ran last (a graph shared by every layer, PhiMoE's experts).
  z.object({ ...tensor, bind: z.literal('routing-weights'), layer: index.optional() }).strict(),
  // What the previous graph gave as hand-off `handoff` in the same layer step (PhiMoE's normed MoE input).
  z.object({ ...tensor, bind: z.literal('hand-off'), handoff: identifier }).strict(),
  // The output of an encoder component (vision, audio), fed to this graph.
  // `output`: which of the encoder's outputs, when it gives several (Qwen3-VL: image_embeds, deepstack_k);
  // a decoder graph gets its rows at the prompt's image positions, zeros elsewhere.
  z.object({ ...tensor, bind: z.literal('encoder-output'), component: z.string().min(1), output: z.string().min(1).optional() }).strict(),
  z.object({ ...tensor, bind: z.literal('pixels') }).strict(), // a preprocessed image
  z.object({ ...tensor, bind: z.literal('audio-features') }).strict(), // a preprocessed clip: log-mel features and their frame mask
  z.object({ ...tensor, bind: z.literal('audio-samples') }).strict(), // preprocessed audio
]);

/** Where a graph output goes. */
const OutputSchema = z.discriminatedUnion('bind', [
  z.object({ ...tensor, bind: z.literal('residual') }).strict(),
  z.object({ ...tensor, bind: z.literal('logits') }).strict(), // [1, N, V]: the row of the last real token is read
  // New rows of a KV cache, N of them on `axis`, written into the state at the call's positions.
  z.object({ ...tensor, bind: z.literal('state-rows'), state: z.string().min(1), axis: z.number().int().nonnegative() }).strict(),
  // The whole next value of a recurrent state (conv FIFO, delta-rule state): replaces it after the call.
  z.object({ ...tensor, bind: z.literal('state-replace'), state: z.string().min(1) }).strict(),
  // A layer's router logits: the host takes their top-k to select experts and their weights.
  z.object({ ...tensor, bind: z.literal('router-logits'), layer: index, topK: z.number().int().positive() }).strict(),
  // An encoder's result, kept by the host for the graphs that bind it as encoder-output {component}.
  z.object({ ...tensor, bind: z.literal('encoder-output') }).strict(),
  // Kept by the host for the next graph that takes hand-off `handoff` (and only for it).
  z.object({ ...tensor, bind: z.literal('hand-off'), handoff: identifier }).strict(),
]);

export const GraphSchema = z.object({
  name: z.string().min(1),
  /** The family component this graph is a variant of (a decoder shard, the lm-head, an encoder…). */
  component: z.string().min(1),
  /**
   * Which variant, as the host-op runs it. prefill: N tokens per call; decode: 1; lm_head:
   * final-normed hidden → logits. Open: a host-op may define more (attn_router, experts…).
   */
  role: identifier,
  tokens: z.number().int().positive(),
  /** ONNX graph (CPU EP on the host); a device bundle ships only `qnn`. */
  file: relPath.optional(),
  sha256: sha256.optional(),
  /** Compiled QNN context, when the bundle has one for this graph. */
  qnn: z.object({ wrapper: relPath, sha256, binary: relPath }).strict().optional(),
  layers: z.tuple([z.number().int().nonnegative(), z.number().int().nonnegative()]).optional(),
  inputs: z.array(InputSchema).min(1),
  outputs: z.array(OutputSchema).min(1),
  /** The graph's matmul weights: one precision, or 'mixed' (its context's `precision` lists each matrix). */
  quant: z.object({ weights: z.enum(['fp32', 'fp16', 'w8', 'w4', 'mixed']), activations: z.literal('float32') }).strict(),
}).strict()
  .refine((g) => g.file !== undefined || g.qnn !== undefined, 'a graph needs an ONNX file or a compiled context (qnn)')
  .refine((g) => (g.file === undefined) === (g.sha256 === undefined), "'file' and 'sha256' go together");

/**
 * A file whose bytes differ between builds of identical inputs (a QNN context binary: see
 * NONDETERMINISTIC_QNN_BINARY above). `sha256` is still this file's real hash, checked by
 * the runtime; bundles are compared on `bytes` and on `describeSha256`, the sha256 of the file's own
 * description (graphs, API and SDK versions, target, blob size), which is stable.
 */
export const NondeterministicSchema = z.object({ why: z.string().min(1), describeSha256: sha256 }).strict();

export const ContextSchema = z.object({
  name: z.string().min(1),
  /** Weight files shared by the context's graphs. */
  files: z.array(z.object({ path: relPath, sha256, bytes: z.number().int().nonnegative(), nondeterministic: NondeterministicSchema.optional() }).strict()),
  graphs: z.array(GraphSchema).min(1),
  /**
   * Each matmul weight of the context and the precision it is stored in, with why where it is not
   * its graphs' scheme (a W4 fallback, a recipe override, auto's promotion). For people and tools:
   * the runtime validates its shape and does not otherwise read it.
   */
  precision: z.array(z.object({ tensor: z.string().min(1), weights: z.enum(['fp32', 'fp16', 'w8', 'w4']), why: z.string().min(1).optional() }).strict()).optional(),
}).strict();

export const ManifestSchema = z.object({
  format: z.literal(MANIFEST_FORMAT),
  version: z.literal(MANIFEST_VERSION),
  recipe: z.string().min(1),
  arch: z.object({ id: z.string(), socModel: z.number().int(), dspArch: z.string() }).strict(),
  /** The runtime host-op that runs the bundle (its registry validates the rest against it). */
  hostOp: identifier,
  model: z.object({
    family: z.string(),
    layers: z.number().int().positive(),
    hidden: z.number().int().positive(),
    vocab: z.number().int().positive(),
  }).strict(),
  /** Contexts in the order the host-op runs them (a decoder: shards, residual threaded through, then the lm-head). */
  contexts: z.array(ContextSchema).min(1),
  state: z.array(z.discriminatedUnion('kind', [
    z.object({
      name: z.string().min(1),
      kind: z.literal('kv-cache'),
      dtype: z.literal('float32'),
      shape,
      /** The axis indexed by absolute position (cache slot). */
      positionAxis: z.number().int().nonnegative(),
      /** A ring cache of this many slots (the position axis is this long, not maxContext). */
      window: z.number().int().positive().optional(),
      /** Carried by graphs of several contexts (e.g. K/V shared across layers); else one context owns it. */
      shared: z.boolean().optional(),
    }).strict(),
    // Carried whole from call to call and replaced by a graph output; zeros before the first token.
    z.object({ name: z.string().min(1), kind: z.literal('recurrent'), dtype: z.literal('float32'), shape, shared: z.boolean().optional() }).strict(),
  ])),
  /** Tables the host reads rows of (never a graph's weights): each a file of `shape` elements of `dtype`. */
  hostTables: z.array(z.object({
    name: z.string().min(1),
    use: z.enum(['embedding', 'per-layer-embedding', 'expert-weights', 'expert-scales', 'patch-embedding', 'position-embedding']),
    file: relPath,
    sha256,
    dtype: z.enum(['float16', 'float32', 'int8', 'bfloat16']),
    shape,
  }).strict()).refine((ts) => new Set(ts.map((t) => t.name)).size === ts.length, 'host table names are unique'),
  /** Mask convention: slot j < start visible; new token k visible to row r when k ≤ r and k is real. */
  mask: z.object({ masked: z.number(), layout: z.literal('past-then-new') }).strict(),
  tokenizer: z.object({
    file: relPath,
    sha256,
    config: relPath.optional(),
    bos: z.number().int().nonnegative().nullable(),
    eos: z.array(z.number().int().nonnegative()),
    /** The checkpoint's chat template (Jinja source), as shipped; the runtime does not read it. */
    chatTemplate: z.string().nullable(),
    /**
     * That template rendered by forge for one user turn with a generation prompt, split around the
     * user's content: `qhx_generate --chat` tokenizes prefix + prompt + suffix (src/bundle/chat-template.ts).
     * null: no template.
     */
    chat: z.object({ prefix: z.string(), suffix: z.string() }).strict().nullable(),
    /** Why the runtime cannot apply chatTemplate (chat is null): it does not wrap the content in fixed text. */
    chatNotApplied: z.string().min(1).optional(),
    /**
     * The template's switches (variables it reads only as booleans, passed by apply_chat_template's
     * keyword arguments, e.g. Qwen3's enable_thinking): the wrap for every combination of them, each
     * given true or false or not given, but none given (that is `chat`). `qhx_generate --chat
     * --chat-option name=value` picks the entry whose options are exactly those given.
     */
    chatOptions: z.array(z.object({
      options: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'a Jinja variable name'), z.boolean()).refine((o) => Object.keys(o).length > 0, 'names at least one switch'),
      prefix: z.string(),
      suffix: z.string(),
    }).strict()).min(1).optional(),
    /** Why the template's switches have no wraps: more than forge renders, or a combination the runtime cannot apply. */
    chatOptionsNotApplied: z.string().min(1).optional(),
  }).strict().superRefine((t, ctx) => {
    if ((t.chatOptions || t.chatOptionsNotApplied) && !t.chat) ctx.addIssue({ code: 'custom', path: [t.chatOptions ? 'chatOptions' : 'chatOptionsNotApplied'], message: 'given without a chat wrap (tokenizer.chat): switches only change a wrap' });
    if (t.chatOptions && t.chatOptionsNotApplied) ctx.addIssue({ code: 'custom', path: ['chatOptionsNotApplied'], message: 'given with chatOptions: it says why there are none' });
    const keys = (t.chatOptions ?? []).map((v) => JSON.stringify(Object.entries(v.options).sort()));
    if (new Set(keys).size !== keys.length) ctx.addIssue({ code: 'custom', path: ['chatOptions'], message: 'each combination of options appears once' });
  }),
  limits: z.object({ maxContext: z.number().int().positive() }).strict(),
  /** Numbers the host-op needs beyond the graphs (PhiMoE: the router's jitter eps, experts, top-k). */
  hostOpParams: z.record(identifier, z.union([z.number(), z.string(), z.boolean()])).optional(),
  generation: z.object({ maxNewTokens: z.number().int().positive(), greedy: z.literal(true) }).strict(),
}).strict().superRefine((m, ctx) => {
  // Every name a binding refers to is declared, as the runtime checks it (native/src/manifest.cpp):
  // forge finds an undeclared table or state when it writes the manifest, not on the device.
  const states = new Set(m.state.map((s) => s.name));
  const tables = new Set(m.hostTables.map((t) => t.name));
  const components = new Set(m.contexts.flatMap((c) => c.graphs.map((g) => g.component)));
  const encoders = new Set(m.contexts.flatMap((c) => c.graphs.filter((g) => g.outputs.some((o) => o.bind === 'encoder-output')).map((g) => g.component)));
  const routed = new Set(m.contexts.flatMap((c) => c.graphs.flatMap((g) => g.outputs.flatMap((o) => (o.bind === 'router-logits' ? [o.layer] : [])))));
  const handed = new Map(m.contexts.flatMap((c) => c.graphs.flatMap((g) => g.outputs.flatMap((o) => (o.bind === 'hand-off' ? [[o.handoff, o] as const] : [])))));
  m.contexts.forEach((c, ci) => c.graphs.forEach((g, gi) => {
    const at = (io: 'inputs' | 'outputs', i: number, field: string) => ['contexts', ci, 'graphs', gi, io, i, field];
    g.inputs.forEach((b, i) => {
      if (b.bind === 'state' && !states.has(b.state)) ctx.addIssue({ code: 'custom', path: at('inputs', i, 'state'), message: `'${b.state}' is not a declared state` });
      if (b.bind === 'host-rows' && !tables.has(b.table)) ctx.addIssue({ code: 'custom', path: at('inputs', i, 'table'), message: `'${b.table}' is not a declared host table` });
      // A text-only manifest of a vision bundle leaves the encoder out: a host-op that runs without
      // it feeds its inputs zeros (native: HostOpSpec::runs_without_encoder).
      const absentOk = b.bind === 'encoder-output' && !components.has(b.component) && RUNS_WITHOUT_ENCODER.has(m.hostOp);
      if (b.bind === 'encoder-output' && !encoders.has(b.component) && !absentOk) {
        const message = components.has(b.component) ? `component '${b.component}' gives no encoder-output` : `'${b.component}' is not a component of this manifest`;
        ctx.addIssue({ code: 'custom', path: at('inputs', i, 'component'), message });
      }
      if (b.bind === 'encoder-output' && b.output !== undefined && encoders.has(b.component)) {
        const given = m.contexts.flatMap((c) => c.graphs.filter((x) => x.component === b.component).flatMap((x) => x.outputs.filter((o) => o.bind === 'encoder-output').map((o) => o.name)));
        if (!given.includes(b.output)) ctx.addIssue({ code: 'custom', path: at('inputs', i, 'output'), message: `component '${b.component}' gives no encoder-output '${b.output}' (it gives ${given.join(', ')})` });
      }
      if (b.bind === 'routing-weights' && (b.layer === undefined ? routed.size === 0 : !routed.has(b.layer))) {
        ctx.addIssue({ code: 'custom', path: at('inputs', i, 'layer'), message: b.layer === undefined ? 'no graph gives router-logits' : `no graph gives router-logits for layer ${b.layer}` });
      }
      if (b.bind === 'hand-off') {
        const o = handed.get(b.handoff);
        if (!o) ctx.addIssue({ code: 'custom', path: at('inputs', i, 'handoff'), message: `no graph gives hand-off '${b.handoff}'` });
        else if (o.dtype !== b.dtype || o.shape.join(',') !== b.shape.join(',')) {
          ctx.addIssue({ code: 'custom', path: at('inputs', i, 'shape'), message: `hand-off '${b.handoff}' is ${o.dtype} [${o.shape}] where it is given, ${b.dtype} [${b.shape}] here` });
        }
      }
    });
    g.outputs.forEach((b, i) => {
      if ((b.bind === 'state-rows' || b.bind === 'state-replace') && !states.has(b.state)) ctx.addIssue({ code: 'custom', path: at('outputs', i, 'state'), message: `'${b.state}' is not a declared state` });
    });
  }));
});

export type Manifest = z.infer<typeof ManifestSchema>;
export type ManifestGraph = z.infer<typeof GraphSchema>;

export function manifestJsonSchema(): unknown {
  return z.toJSONSchema(ManifestSchema, { target: 'draft-2020-12' });
}
