// Puts a runnable bundle together: graph files, weight data, the host embedding, tokenizer files,
// and manifest.json describing them with sha256s and the binding of every graph input/output.
// Files are hard-linked when possible (a scratch bundle for a gate costs no copy), else copied.
// A reference export's weights are the checkpoint's own safetensors files (linked into the export):
// a context lists each file its graphs read. The sha256 of a big file (weights, context binary,
// embedding) is the one the stage cache recorded when its entry was committed, not hashed again for
// every gate run's scratch bundle.
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { linkOrCopy } from '../io/files.js';
import { join } from 'node:path';
import { sha256OfFile, type FileDigest } from '../engine/hash.js';
import { META } from '../engine/cache.js';
import type { HexagonArch } from '../arch/table.js';
import type { QuantScheme, Recipe } from '../recipe/schema.js';
import { GRAPHS_JSON, type ExportManifest } from '../export/graphs.js';
import type { MatrixEntry } from '../quant/weights.js';
import { getFamily } from '../families/index.js';
import type { Family } from '../families/types.js';
import { MASKED } from '../families/blocks.js';
import { readSpecialTokens } from './special-tokens.js';
import type { CompiledContext } from '../toolchain/qnn/compile-stage.js';
import { MANIFEST_FORMAT, MANIFEST_VERSION, ManifestSchema, NONDETERMINISTIC_QNN_BINARY, RUNS_WITHOUT_ENCODER, type Manifest } from './manifest.js';

export const MANIFEST = 'manifest.json';
/** A vision bundle's text-only manifest (the graphs without the encoder). */
export const TEXT_MANIFEST = 'manifest.text.json';
const TOKENIZER_FILES = ['tokenizer.json', 'tokenizer_config.json'];

export interface AssembleInput {
  recipe: Pick<Recipe, 'id' | 'family'>;
  arch: Pick<HexagonArch, 'id' | 'socModel' | 'dspArch'>;
  /** Export output holding graphs.json and the graphs it lists. */
  graphsDir: string;
  /** Where embedding.f16.bin lives (the deployable export writes it). */
  embeddingDir: string;
  checkpointDir: string;
  maxNewTokens: number;
  /**
   * A device bundle: the compile stage's output directory and what it compiled. Each context ships
   * as its binary and each graph as its EPContext wrapper, instead of the ONNX graphs and weights.
   */
  compiled?: { dir: string; contexts: CompiledContext[] };
  /**
   * The stage cache entry whose recorded digests cover graphsDir's data files, when graphsDir holds
   * links to them rather than being that entry (the CPU form of an export, written in scratch).
   */
  dataDigestsDir?: string;
}

/** The compile stage's output, as `AssembleInput.compiled` takes it. */
export function readCompiled(compileDir: string): { dir: string; contexts: CompiledContext[] } {
  return { dir: compileDir, contexts: (JSON.parse(readFileSync(join(compileDir, 'compile.json'), 'utf8')) as { contexts: CompiledContext[] }).contexts };
}

/** The digests the stage cache recorded for an entry's files; empty for a directory outside the cache. */
function recordedDigests(dir: string): Record<string, FileDigest> {
  try {
    return (JSON.parse(readFileSync(join(dir, META), 'utf8')) as { files?: Record<string, FileDigest> }).files ?? {};
  } catch {
    return {};
  }
}

export async function assembleBundle(input: AssembleInput, out: string): Promise<Manifest> {
  mkdirSync(out, { recursive: true });
  const exp = JSON.parse(readFileSync(join(input.graphsDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  const emb = JSON.parse(readFileSync(join(input.embeddingDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  if (!emb.embedding) throw new Error(`${input.embeddingDir} has no host embedding table`);
  const family = getFamily(input.recipe.family) as Family<unknown>;
  const config = family.parseConfig(JSON.parse(readFileSync(join(input.checkpointDir, 'config.json'), 'utf8')), 'config.json');
  const sha = async (f: string) => sha256OfFile(join(out, f));
  const recorded = new Map<string, Record<string, FileDigest>>();
  /** The sha256 of `f`, placed from `dir/src`: what the stage cache recorded for it while the size is the recorded one, else hashed. */
  const placedSha = async (f: string, dir: string, src = f) => {
    if (!recorded.has(dir)) recorded.set(dir, recordedDigests(dir));
    const r = recorded.get(dir)![src];
    return r && r.size === statSync(join(out, f)).size ? r.sha256 : sha(f);
  };

  const contexts: Manifest['contexts'] = [];
  const state = new Map<string, Manifest['state'][number]>();
  for (const c of exp.contexts) {
    const cc = input.compiled?.contexts.find((x) => x.name === c.name);
    if (input.compiled && !cc) throw new Error(`context ${c.name} was not compiled`);
    let files: Manifest['contexts'][number]['files'];
    if (cc) {
      const bin = `${c.name}.bin`;
      linkOrCopy(join(input.compiled!.dir, cc.bin), join(out, bin));
      files = [{ path: bin, bytes: cc.bytes, sha256: await placedSha(bin, input.compiled!.dir, cc.bin), nondeterministic: { why: NONDETERMINISTIC_QNN_BINARY, describeSha256: cc.describeSha256 } }];
    } else {
      files = [];
      for (const f of [...(c.data ? [c.data] : []), ...(c.linked ?? [])]) {
        linkOrCopy(join(input.graphsDir, f), join(out, f));
        files.push({ path: f, bytes: statSync(join(out, f)).size, sha256: await placedSha(f, input.dataDigestsDir ?? input.graphsDir) });
      }
    }
    const graphs: Manifest['contexts'][number]['graphs'] = [];
    for (const g of c.graphs) {
      let graphFiles: { file: string; sha256: string } | { qnn: { wrapper: string; sha256: string; binary: string } };
      if (cc) {
        const w = cc.graphs.find((x) => x.graph === g.name);
        if (!w) throw new Error(`graph ${g.name} has no compiled wrapper`);
        const wrapper = `${g.name}_ctx.onnx`;
        linkOrCopy(join(input.compiled!.dir, w.wrapper), join(out, wrapper));
        graphFiles = { qnn: { wrapper, sha256: await sha(wrapper), binary: files[0].path } };
      } else {
        linkOrCopy(join(input.graphsDir, g.file), join(out, g.file));
        graphFiles = { file: g.file, sha256: await sha(g.file) };
      }
      const b = family.bindings(config, g, exp.maxContext);
      for (const s of b.state) state.set(s.name, s);
      graphs.push({
        name: g.name,
        // Today a context holds one component's variants (a shard's prefill and decode, the lm-head).
        component: c.name,
        role: g.role ?? (g.kind === 'lm_head' ? 'lm_head' : g.n === 1 ? 'decode' : 'prefill'),
        tokens: g.n,
        ...graphFiles,
        ...(g.first !== undefined ? { layers: [g.first, g.last!] as [number, number] } : {}),
        inputs: b.inputs,
        outputs: b.outputs,
        quant: { weights: weightsOf(c.matrices, g.kind === 'lm_head' ? exp.lmHeadScheme : exp.scheme), activations: 'float32' },
      });
    }
    const precision = (c.matrices ?? []).map((m) => ({ tensor: m.tensor, weights: m.scheme, ...(m.why ? { why: m.why } : {}) }));
    contexts.push({ name: c.name, files, graphs, ...(precision.length ? { precision } : {}) });
  }
  // The family's host tables as the deployable export wrote them (the embedding first; Gemma's per-layer embeddings …).
  const uses = new Map(family.hostTables(config).map((t) => [t.name, t.use]));
  const hostTables: Manifest['hostTables'] = [];
  for (const t of emb.hostTables ?? []) {
    linkOrCopy(join(input.embeddingDir, t.file), join(out, t.file));
    const use = uses.get(t.name);
    if (!use) throw new Error(`${input.embeddingDir}: host table '${t.name}' is not one of family ${input.recipe.family}'s`);
    hostTables.push({ name: t.name, use, file: t.file, sha256: await placedSha(t.file, input.embeddingDir), dtype: t.dtype, shape: t.shape });
  }
  // Tables made in the graphs' own scheme (expert rows): from the export whose graphs they feed.
  const made: Manifest['hostTables'] = [];
  for (const t of exp.madeTables ?? []) {
    linkOrCopy(join(input.graphsDir, t.file), join(out, t.file));
    made.push({ name: t.name, use: t.use, file: t.file, sha256: await placedSha(t.file, input.dataDigestsDir ?? input.graphsDir), dtype: t.dtype, shape: t.shape });
  }
  const hostOpParams = family.hostOpParams?.(config, { image: exp.image, audio: exp.audio });
  for (const f of TOKENIZER_FILES) if (existsSync(join(input.checkpointDir, f))) linkOrCopy(join(input.checkpointDir, f), join(out, f));
  const special = readSpecialTokens(input.checkpointDir);
  const [vocab, hidden] = emb.embedding.shape;
  const manifest: Manifest = {
    format: MANIFEST_FORMAT,
    version: MANIFEST_VERSION,
    recipe: input.recipe.id,
    arch: { id: input.arch.id, socModel: input.arch.socModel, dspArch: input.arch.dspArch },
    hostOp: family.hostOp,
    model: { family: input.recipe.family, layers: family.numLayers(config), hidden, vocab },
    contexts,
    state: [...state.values()],
    hostTables: [...hostTables, ...made],
    mask: { masked: MASKED, layout: 'past-then-new' },
    tokenizer: {
      file: 'tokenizer.json',
      sha256: await sha('tokenizer.json'),
      ...(existsSync(join(out, 'tokenizer_config.json')) ? { config: 'tokenizer_config.json' } : {}),
      ...special,
    },
    limits: { maxContext: exp.maxContext },
    generation: { maxNewTokens: input.maxNewTokens, greedy: true },
    ...(hostOpParams ? { hostOpParams } : {}),
  };
  ManifestSchema.parse(manifest); // forge never writes a manifest the runtime would refuse
  writeFileSync(join(out, MANIFEST), JSON.stringify(manifest, null, 2) + '\n');
  // A vision bundle also ships its text-only manifest: the same graphs and weights without the
  // encoder's context, for text prompts on a runtime that need not load the encoder. Where a shard
  // binds an encoder's output (Qwen3-VL's DeepStack), only a host-op that feeds it zeros can run that.
  const encoders = contexts.filter((c) => c.graphs.some((g) => g.outputs.some((o) => o.bind === 'encoder-output')));
  const bindsEncoder = contexts.some((c) => !encoders.includes(c) && c.graphs.some((g) => g.inputs.some((i) => i.bind === 'encoder-output')));
  if (encoders.length && (!bindsEncoder || RUNS_WITHOUT_ENCODER.has(manifest.hostOp))) {
    const text = ManifestSchema.parse({ ...manifest, contexts: contexts.filter((c) => !encoders.includes(c)) });
    writeFileSync(join(out, TEXT_MANIFEST), JSON.stringify(text, null, 2) + '\n');
  }
  return manifest;
}

/** A graph's quant.weights: its context's one matrix precision, 'mixed' when they differ, the scheme when none is recorded. */
function weightsOf(matrices: MatrixEntry[] | undefined, scheme: QuantScheme): Manifest['contexts'][number]['graphs'][number]['quant']['weights'] {
  const kinds = new Set((matrices ?? []).map((m) => m.scheme));
  return kinds.size > 1 ? 'mixed' : kinds.size === 1 ? [...kinds][0] : scheme;
}
