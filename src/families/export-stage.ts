// Stages `export` (float32 reference graphs) and `quantize` (the deployable graphs in the recipe's
// scheme): ONNX built straight from safetensors by the family module, streamed tensor by tensor,
// one data file per context shared by its prefill and decode graphs. Quantizing while streaming
// keeps it to one pass over the weights (see quant/weights.ts for the form). The reference export
// (`inPlace`) writes graphs, not weights: its fp32 graphs read the checkpoint's own tensors through
// hard links to the safetensors files in its output (onnx/linked-data.ts).
import { readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import type { FamilyId, QuantScheme } from '../recipe/schema.js';
import { openCheckpoint, type Checkpoint } from '../io/checkpoint.js';
import { GraphBuilder } from '../onnx/builder.js';
import { ExternalDataWriter } from '../onnx/external.js';
import { CheckpointLinks, type LinkedFile } from '../onnx/linked-data.js';
import { writeModel } from '../onnx/writer.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { F16Copy, WeightStore, type W8Form } from '../quant/weights.js';
import type { ShardPlan } from '../plan/shards.js';
import { getFamily } from './index.js';
import type { Family, GraphInterface } from './types.js';

export interface ExportParams {
  family: FamilyId;
  scheme: QuantScheme;
  lmHeadScheme: QuantScheme;
  maxContext: number;
  prefillLength: number;
  /** The host embedding table is written by the deployable export only. */
  embedding: boolean;
  /** The ONNX form of W8 weights, fixed by the compile toolchain (default 'matmulnbits'). */
  w8Form?: W8Form;
  /**
   * fp32 weights are the checkpoint's own bytes (bf16/f16/f32 as stored, Cast to float in the graph),
   * reached through links to its files in the output, instead of a converted copy. The reference
   * export only: a compile toolchain would get bf16 weights.
   */
  inPlace?: boolean;
}

export interface GraphEntry extends GraphInterface {
  name: string;
  file: string;
  kind: 'shard' | 'lm_head';
  /** Tokens per call. */
  n: number;
  shard?: number;
  first?: number;
  last?: number;
  /** The last shard's hidden_out is final-normed. */
  isLast?: boolean;
}

export interface ContextEntry {
  name: string;
  /** The context's own weight file; absent when every weight is read in place from the checkpoint. */
  data?: string;
  dataBytes: number;
  /** Checkpoint files (links in the export directory, see ExportManifest.linked) the context's graphs read in place. */
  linked?: string[];
  graphs: GraphEntry[];
}

export interface ExportManifest {
  family: FamilyId;
  scheme: QuantScheme;
  lmHeadScheme: QuantScheme;
  w8Form: W8Form;
  maxContext: number;
  contexts: ContextEntry[];
  embedding?: { file: string; dtype: 'float16'; shape: [number, number] };
  /** The checkpoint's files, linked (or, failing that, copied) into the export directory. */
  linked?: LinkedFile[];
}

export const GRAPHS_JSON = 'graphs.json';

/** The host embedding table: the tensor's fp16 form, alone in its file. */
async function writeEmbedding(ckpt: Checkpoint, name: string, shape: [number, number], file: string): Promise<void> {
  const sink = new ExternalDataWriter(file, { align: 1 });
  try {
    await new WeightStore(ckpt, sink).fp16(name, shape);
    await sink.commitAsync();
  } catch (e) {
    sink.abort();
    throw e;
  }
}

/**
 * Graph inputs and outputs are C identifiers: the QAIRT converter rewrites any other name (`a.0` →
 * `a_0`), and the runtime binds by the manifest's names, so a rewritten name would not bind.
 */
export function checkIoNames(graph: string, iface: GraphInterface): void {
  for (const t of [...iface.inputs, ...iface.outputs]) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(t.name)) throw new Error(`${graph}: graph input/output '${t.name}' is not a C identifier ([A-Za-z_][A-Za-z0-9_]*), which every compile toolchain keeps unchanged`);
  }
}

/** Builds every graph of one context into `out`, sharing one data file. */
async function exportContext<C>(
  out: string, name: string, ckpt: Checkpoint, builds: Array<{ graph: string; n: number; kind: GraphEntry['kind']; make: (g: GraphBuilder, store: WeightStore) => Promise<GraphInterface>; meta?: Partial<GraphEntry> }>,
  onTensor: () => void, f16Copy: F16Copy | undefined, w8Form: W8Form, inPlace: CheckpointLinks | undefined,
): Promise<ContextEntry> {
  const data = `${name}.data`;
  const sink = new ExternalDataWriter(join(out, data));
  const store = new WeightStore(ckpt, sink, { onTensor, f16Copy, w8Form, inPlace });
  const built: Array<{ g: GraphBuilder; entry: GraphEntry }> = [];
  try {
    for (const b of builds) {
      const g = new GraphBuilder(b.graph);
      const iface = await b.make(g, store);
      checkIoNames(b.graph, iface);
      built.push({ g, entry: { name: b.graph, file: `${b.graph}.onnx`, kind: b.kind, n: b.n, ...b.meta, ...iface } });
    }
    // Data first, then the models that point into it.
    await sink.commitAsync();
  } catch (e) {
    sink.abort();
    throw e;
  }
  for (const { g, entry } of built) writeModel(g, join(out, entry.file), { externalThreshold: Infinity });
  const files = new Set(built.flatMap(({ g }) => g.initializers().flatMap((i) => (i.external ? [i.external.location] : []))));
  const linked = [...files].filter((f) => f !== data);
  return { name, ...(sink.size ? { data } : {}), dataBytes: sink.size, ...(linked.length ? { linked } : {}), graphs: built.map((b) => b.entry) };
}

export interface ExportProgress {
  log(message: string): void;
  progress(done: number, total: number, label?: string): void;
}

/** Exports every graph of a plan from a checkpoint directory into `out` (the stage's work, callable by benchmarks). */
export async function runExport(p: ExportParams, checkpointDir: string, plan: ShardPlan, out: string, ui: ExportProgress): Promise<ExportManifest> {
  const family = getFamily(p.family) as Family<unknown>;
  const configFile = join(checkpointDir, 'config.json');
  const config = family.parseConfig(JSON.parse(readFileSync(configFile, 'utf8')), configFile);
  const ckpt = await openCheckpoint(checkpointDir);
  const weights = { scheme: p.scheme, lmHeadScheme: p.lmHeadScheme };
  const w8Form = p.w8Form ?? 'matmulnbits';
  let totalTensors = 2;
  for (const s of plan.shards) for (let i = s.first; i <= s.last; i++) totalTensors += family.layerTensors(config, i).length;
  let done = 0;
  const tick = () => ui.progress(++done, totalTensors, 'tensors');
  const links = p.inPlace ? new CheckpointLinks(out, (m) => ui.log(m)) : undefined;
  // A tied fp16 lm-head is the embedding table's bytes: written to both files in one conversion.
  const emb = p.embedding ? family.embedding(config) : undefined;
  const embFile = join(out, 'embedding.f16.bin');
  const embCopy = emb && p.lmHeadScheme === 'fp16' && family.lmHead(config).name === emb.name ? new F16Copy(emb.name, new ExternalDataWriter(embFile, { align: 1 })) : undefined;
  try {
    const contexts: ContextEntry[] = [];
    const lmHeadInside = plan.lmHead.placement === 'last-shard';
    for (const s of plan.shards) {
      const isLast = s.index === plan.shards.length - 1;
      const calls = [...(p.prefillLength > 0 ? [{ graph: 'prefill', n: p.prefillLength }] : []), { graph: 'decode', n: 1 }];
      contexts.push(await exportContext(out, `shard${s.index}`, ckpt, calls.map((c) => ({
        graph: `shard${s.index}.${c.graph}`, n: c.n, kind: 'shard' as const,
        meta: { shard: s.index, first: s.first, last: s.last, isLast },
        make: (g, store) => family.buildShard(g, config, { first: s.first, last: s.last, n: c.n, maxContext: p.maxContext, isLast, lmHeadInside }, { store, ...weights }),
      })), tick, embCopy, w8Form, links));
      const c = contexts[contexts.length - 1];
      ui.log(`shard ${s.index}: layers ${s.first}-${s.last}, ${c.dataBytes} bytes of weights written${c.linked ? `; weights read in place from ${c.linked.join(', ')}` : ''}`);
    }
    if (!lmHeadInside) {
      contexts.push(await exportContext(out, 'lm_head', ckpt, [{
        graph: 'lm_head', n: 1, kind: 'lm_head', make: (g, store) => family.buildLmHead(g, config, { store, ...weights }),
      }], tick, embCopy, w8Form, links));
    }
    const manifest: ExportManifest = { family: p.family, scheme: p.scheme, lmHeadScheme: p.lmHeadScheme, w8Form, maxContext: p.maxContext, contexts };
    if (links?.files().length) manifest.linked = links.files();
    if (emb) {
      const shape = emb.shape as [number, number];
      ckpt.expectShape(emb.name, shape);
      // The lm-head's fp16 store wrote the table too (a bf16 checkpoint's fast path), or it did not.
      if (embCopy?.written) await embCopy.sink.commitAsync();
      else {
        embCopy?.sink.abort();
        await writeEmbedding(ckpt, emb.name, shape, embFile);
      }
      manifest.embedding = { file: 'embedding.f16.bin', dtype: 'float16', shape };
    }
    await writeFile(join(out, GRAPHS_JSON), JSON.stringify(manifest, null, 2));
    return manifest;
  } finally {
    embCopy?.sink.abort(); // no-op once committed
    await ckpt.close();
  }
}

export const stage: StageModule<ExportParams> = {
  name: 'export',
  version: '1',
  async run(ctx) {
    const ref = readCheckpointRef(ctx.inputs.checkpoint);
    const plan = JSON.parse(readFileSync(join(ctx.inputs.plan, 'plan.json'), 'utf8')) as ShardPlan;
    const m = await runExport(ctx.params, ref.absDir, plan, ctx.out, ctx);
    return {
      summary: {
        scheme: m.scheme,
        contexts: m.contexts.map((c) => ({ name: c.name, dataBytes: c.dataBytes, graphs: c.graphs.length })),
        ...(m.linked ? { linked: m.linked.map((f) => ({ file: f.file, bytes: f.bytes, how: f.how })) } : {}),
      },
    };
  },
};
