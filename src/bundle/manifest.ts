// The manifest: the only contract between forge and the C++ runtime. forge writes it; the runtime
// validates it on load (native/src/manifest.cpp) and binds every graph input/output by the role
// written here, never by guessing from names. `manifest.schema.json` is generated from this file
// (`npm run manifest-schema`; a test keeps them in sync).
import { z } from 'zod';

export const MANIFEST_FORMAT = 'forge-bundle';
export const MANIFEST_VERSION = 1;

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

/** Where a graph input comes from, as the host-op sees it. */
const InputSchema = z.discriminatedUnion('bind', [
  z.object({ ...tensor, bind: z.literal('residual') }).strict(), // the running hidden state [1, N, H]
  z.object({ ...tensor, bind: z.literal('positions') }).strict(), // int32 [N]: absolute positions of the N tokens
  z.object({ ...tensor, bind: z.literal('mask') }).strict(), // additive [1, 1, N, C+N]: see `mask` below
  z.object({ ...tensor, bind: z.literal('state'), state: z.string().min(1) }).strict(), // a state buffer, bound in place
]);

/** Where a graph output goes. */
const OutputSchema = z.discriminatedUnion('bind', [
  z.object({ ...tensor, bind: z.literal('residual') }).strict(),
  z.object({ ...tensor, bind: z.literal('logits') }).strict(), // [1, N, V]: the row of the last real token is read
  // New rows of a KV cache, N of them on `axis`, written into the state at the call's positions.
  z.object({ ...tensor, bind: z.literal('state-rows'), state: z.string().min(1), axis: z.number().int().nonnegative() }).strict(),
  // The whole next value of a recurrent state (conv FIFO, delta-rule state): replaces it after the call.
  z.object({ ...tensor, bind: z.literal('state-replace'), state: z.string().min(1) }).strict(),
]);

export const GraphSchema = z.object({
  name: z.string().min(1),
  /** prefill: N tokens per call; decode: 1; lm_head: final-normed hidden → logits. */
  role: z.enum(['prefill', 'decode', 'lm_head']),
  tokens: z.number().int().positive(),
  /** ONNX graph (CPU EP on the host); a device bundle ships only `qnn`. */
  file: relPath.optional(),
  sha256: sha256.optional(),
  /** Compiled QNN context, when the bundle has one for this graph. */
  qnn: z.object({ wrapper: relPath, sha256, binary: relPath }).strict().optional(),
  layers: z.tuple([z.number().int().nonnegative(), z.number().int().nonnegative()]).optional(),
  inputs: z.array(InputSchema).min(1),
  outputs: z.array(OutputSchema).min(1),
  quant: z.object({ weights: z.enum(['fp32', 'fp16', 'w8']), activations: z.literal('float32') }).strict(),
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
}).strict();

export const ManifestSchema = z.object({
  format: z.literal(MANIFEST_FORMAT),
  version: z.literal(MANIFEST_VERSION),
  recipe: z.string().min(1),
  arch: z.object({ id: z.string(), socModel: z.number().int(), dspArch: z.string() }).strict(),
  hostOp: z.enum(['decoder_generate', 'qwen3_5_generate']),
  model: z.object({
    family: z.string(),
    layers: z.number().int().positive(),
    hidden: z.number().int().positive(),
    vocab: z.number().int().positive(),
  }).strict(),
  /** Contexts in execution order: shards (residual threaded through), then the lm-head. */
  contexts: z.array(ContextSchema).min(1),
  state: z.array(z.discriminatedUnion('kind', [
    z.object({
      name: z.string().min(1),
      kind: z.literal('kv-cache'),
      dtype: z.literal('float32'),
      shape,
      /** The axis indexed by absolute position (cache slot). */
      positionAxis: z.number().int().nonnegative(),
    }).strict(),
    // Carried whole from call to call and replaced by a graph output; zeros before the first token.
    z.object({ name: z.string().min(1), kind: z.literal('recurrent'), dtype: z.literal('float32'), shape }).strict(),
  ])),
  hostTables: z.array(z.object({
    name: z.literal('embedding'),
    file: relPath,
    sha256,
    dtype: z.literal('float16'),
    shape: z.tuple([z.number().int().positive(), z.number().int().positive()]),
  }).strict()),
  /** Mask convention: slot j < start visible; new token k visible to row r when k ≤ r and k is real. */
  mask: z.object({ masked: z.number(), layout: z.literal('past-then-new') }).strict(),
  tokenizer: z.object({
    file: relPath,
    sha256,
    config: relPath.optional(),
    bos: z.number().int().nonnegative().nullable(),
    eos: z.array(z.number().int().nonnegative()),
    chatTemplate: z.string().nullable(),
  }).strict(),
  limits: z.object({ maxContext: z.number().int().positive() }).strict(),
  generation: z.object({ maxNewTokens: z.number().int().positive(), greedy: z.literal(true) }).strict(),
}).strict();

export type Manifest = z.infer<typeof ManifestSchema>;
export type ManifestGraph = z.infer<typeof GraphSchema>;

export function manifestJsonSchema(): unknown {
  return z.toJSONSchema(ManifestSchema, { target: 'draft-2020-12' });
}
