// Stages `export` (float32 reference graphs) and `quantize` (the deployable graphs in the recipe's
// scheme): ONNX built straight from safetensors by the family module, streamed tensor by tensor,
// one data file per component (context) shared by its graphs (a shard's prefill and decode). Quantizing while streaming
// keeps it to one pass over the weights (see quant/weights.ts for the form). The reference export
// (`inPlace`) writes graphs, not weights: its fp32 graphs read the checkpoint's own tensors through
// hard links to the safetensors files in its output (onnx/linked-data.ts).
import { readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import type { Equalize, FamilyId, PrecisionOverride, QuantScheme } from '../recipe/schema.js';
import { PrecisionChooser, PRECISION_JSON, type PrecisionMap } from '../quant/precision.js';
import { openCheckpoint, type Checkpoint } from '../io/checkpoint.js';
import { GraphBuilder, type RescaleRule } from '../onnx/builder.js';
import { ExternalDataWriter } from '../onnx/external.js';
import { CheckpointLinks } from '../onnx/linked-data.js';
import { writeModel } from '../onnx/writer.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { F16Copy, WeightStore, type W8Form } from '../quant/weights.js';
import { W4_QDQ_OPSET } from '../quant/w4-qdq.js';
import type { ShardPlan } from '../plan/shards.js';
import { getFamily } from '../families/index.js';
import type { AudioLayout, Component, Family, GraphVariant, HostTable, ImageLayout } from '../families/types.js';
import { componentTensors } from '../families/tensors.js';
import { checkIoNames, graphName, GRAPHS_JSON, layoutOf, madeTableFile, matrixFallbacks, type ContextEntry, type ExportManifest, type ExportPlan, type GraphEntry } from './graphs.js';

export interface ExportParams {
  family: FamilyId;
  scheme: QuantScheme;
  lmHeadScheme: QuantScheme;
  maxContext: number;
  prefillLength: number;
  /** How images reach the vision encoder (a family with one: a size, or a soft-token budget); absent: the text path only. */
  image?: ImageLayout;
  /** How long an audio clip may be (a family with an audio encoder); absent: no audio encoder. */
  audio?: AudioLayout;
  /** The family's host tables (the embedding …) are written by the deployable export only. */
  hostTables: boolean;
  /** The ONNX form of W8 and W4 weights, fixed by the compile toolchain (default 'matmulnbits'). */
  w8Form?: W8Form;
  /**
   * fp32 weights are the checkpoint's own bytes (bf16/f16/f32 as stored, Cast to float in the graph),
   * reached through links to its files in the output, instead of a converted copy. The reference
   * export only: a compile toolchain would get bf16 weights.
   */
  inPlace?: boolean;
  /** The recipe's per-matrix pins (quant/precision.ts); the auto map, when there is one, is the `precision` input. */
  overrides?: PrecisionOverride[];
  /** The recipe's exact op rescalings (RescaleRule: an op scope pattern and a power of two), the shipped export only. */
  rescale?: RescaleRule[];
  /** The recipe's experts rebalanced before quantization (the made tables honour them), the shipped export only. */
  equalize?: Equalize[];
}

/** A host table: the tensor's fp16 form, alone in its file. */
async function writeHostTable(ckpt: Checkpoint, name: string, shape: number[], file: string): Promise<void> {
  const sink = new ExternalDataWriter(file, { align: 1 });
  try {
    await new WeightStore(ckpt, sink).fp16(name, shape);
    await sink.commitAsync();
  } catch (e) {
    sink.abort();
    throw e;
  }
}

/** Builds every kept graph of one component into `out`, sharing one data file. */
async function exportContext(
  out: string, c: Component, variants: GraphVariant[], ckpt: Checkpoint, schemes: { scheme: QuantScheme; lmHeadScheme: QuantScheme },
  onTensor: () => void, f16Copy: F16Copy | undefined, w8Form: W8Form, inPlace: CheckpointLinks | undefined, precision: PrecisionChooser,
  rescale: readonly RescaleRule[] = [], used: Set<RescaleRule> = new Set(),
): Promise<ContextEntry> {
  const data = `${c.name}.data`;
  const sink = new ExternalDataWriter(join(out, data));
  const store = new WeightStore(ckpt, sink, { onTensor, f16Copy, w8Form, inPlace, precision });
  const scheme = c.weights === 'lmHead' ? schemes.lmHeadScheme : schemes.scheme;
  const built: Array<{ g: GraphBuilder; entry: GraphEntry }> = [];
  try {
    for (const v of variants) {
      const name = graphName(c.name, v.name);
      // W4's QDQ form (int4, blocked DequantizeLinear) exists from opset 21 on: graphs that may hold a
      // w4 matrix (their scheme, a recipe override, auto's map) are built there.
      const g = new GraphBuilder(name, { ...(w8Form === 'qdq' && (scheme === 'w4' || precision.mayChoose('w4')) ? { opsets: { '': W4_QDQ_OPSET } } : {}), rescale });
      const iface = await v.build(g, { store, ...schemes });
      for (const r of rescale) if (!g.unusedRescales().includes(r)) used.add(r);
      checkIoNames(name, iface);
      built.push({ g, entry: { name, file: `${name}.onnx`, component: c.name, kind: c.kind, variant: v.name, n: v.n, ...(v.role ? { role: v.role } : {}), scheme, ...c.entry, ...v.entry, ...iface, ...(Object.keys(g.stateScales).length ? { stateScales: { ...g.stateScales } } : {}) } });
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
  const matrices = store.precisions();
  return { name: c.name, ...(sink.size ? { data } : {}), dataBytes: sink.size, ...(linked.length ? { linked } : {}), graphs: built.map((b) => b.entry), ...(matrices.length ? { matrices } : {}) };
}

export interface ExportProgress {
  log(message: string): void;
  progress(done: number, total: number, label?: string): void;
}

/**
 * Exports every graph of a plan from a checkpoint directory into `out` (the stage's work, callable by
 * benchmarks and by the auto precision stage, which exports one layer per graph). `precision`: the
 * auto map, on top of which the recipe's overrides (p.overrides) apply.
 */
export async function runExport(p: ExportParams, checkpointDir: string, plan: ExportPlan, out: string, ui: ExportProgress, precision?: PrecisionMap): Promise<ExportManifest> {
  const family = getFamily(p.family) as Family<unknown>;
  const configFile = join(checkpointDir, 'config.json');
  const config = family.parseConfig(JSON.parse(readFileSync(configFile, 'utf8')), configFile);
  const ckpt = await openCheckpoint(checkpointDir);
  const schemes = { scheme: p.scheme, lmHeadScheme: p.lmHeadScheme };
  const w8Form = p.w8Form ?? 'matmulnbits';
  const chooser = new PrecisionChooser(p.overrides, precision);
  const dropped = new Set((plan.dropped ?? []).map((d) => d.graph));
  const components = family.components(config, layoutOf(plan, p));
  // What each component reads, from its own builder: the progress total (one tick per stored matmul weight) and the tied-table shortcut.
  const reads = await Promise.all(components.map((c) => componentTensors(c, schemes)));
  const totalTensors = reads.reduce((a, r) => a + r.filter((t) => t.role === 'matmul').length, 0);
  let done = 0;
  const tick = () => ui.progress(++done, totalTensors, 'tensors');
  const links = p.inPlace ? new CheckpointLinks(out, (m) => ui.log(m)) : undefined;
  const tables = p.hostTables ? family.hostTables(config) : [];
  const tableFile = (t: HostTable) => `${t.name}.f16.bin`;
  // A host table that a graph also stores in fp16 (a tied fp16 lm-head) is written to both files in one conversion.
  const f16Read = new Set(reads.flat().filter((t) => t.role === 'matmul' && t.scheme === 'fp16').map((t) => t.name));
  const shared = tables.find((t) => f16Read.has(t.tensor));
  const copy = shared ? new F16Copy(shared.tensor, new ExternalDataWriter(join(out, tableFile(shared)), { align: 1 })) : undefined;
  const usedRescales = new Set<RescaleRule>();
  const made = family.madeTables?.(config, p.scheme, p.equalize);
  // A rule that picks no expert is a typo or a family without experts: said before any graph is written, not ignored.
  const unmatched = p.equalize?.length ? made?.unmatched ?? p.equalize : [];
  try {
    if (unmatched.length) throw new Error(`equalize ${unmatched.map((r) => JSON.stringify(r.match)).join(', ')} match no expert of this ${p.family} model (patterns match "layers.<L>.experts.<E>"; only mixture-of-experts families have experts to equalize)`);
    const contexts: ContextEntry[] = [];
    for (const c of components) {
      const variants = c.variants.filter((v) => !dropped.has(graphName(c.name, v.name)));
      if (!variants.length) continue;
      const ctx = await exportContext(out, c, variants, ckpt, schemes, tick, copy, w8Form, links, chooser, p.rescale, usedRescales);
      contexts.push(ctx);
      const range = c.entry.first !== undefined ? ` (layers ${c.entry.first}-${c.entry.last})` : '';
      ui.log(`${c.name}${range}: ${ctx.graphs.map((g) => g.name).join(', ')}; ${ctx.dataBytes} bytes of weights written${ctx.linked ? `; weights read in place from ${ctx.linked.join(', ')}` : ''}`);
      for (const m of ctx.matrices ?? []) if (m.why) ui.log(`${m.tensor}: ${m.scheme}, ${m.why}`);
    }
    // A rule no op asked for is a typo or a family whose builder cannot rescale that op: said, not ignored.
    const unused = (p.rescale ?? []).filter((r) => !usedRescales.has(r));
    if (unused.length) {
      // Each pattern as the recipe's JSON spells it (a regex's dots escaped, the backslash doubled).
      const json = (scope: string) => JSON.stringify(scope.replace(/\./g, '\\.'));
      const pairs = (family.rescalePairs ?? []).map((x) => `, ${x.pair} as ${json(`layers.2/${x.scope}`)}`).join('');
      throw new Error(`rescale ${unused.map((r) => JSON.stringify(r.match)).join(', ')} match no op this ${p.family} model can rescale (patterns match an op scope: its RMSNorms, as ${json('layers.2/input_layernorm')}${pairs})`);
    }
    const manifest: ExportManifest = { family: p.family, scheme: p.scheme, lmHeadScheme: p.lmHeadScheme, w8Form, maxContext: p.maxContext, ...(p.image ? { image: p.image } : {}), ...(p.audio ? { audio: p.audio } : {}), contexts };
    if (links?.files().length) manifest.linked = links.files();
    if (made?.equalized?.length) ui.log(`equalized before quantization: ${made.equalized.join(', ')}`);
    if (made?.tables.length) {
      await made.write(ckpt, (name) => join(out, madeTableFile(made.tables.find((t) => t.name === name)!)));
      manifest.madeTables = made.tables.map((t) => ({ ...t, file: madeTableFile(t) }));
      ui.log(`made tables: ${made.tables.map((t) => `${t.name} ${t.dtype} [${t.shape.join(', ')}]`).join('; ')}`);
    }
    if (tables.length) {
      manifest.hostTables = [];
      for (const t of tables) {
        ckpt.expectShape(t.tensor, t.shape);
        // The graph's fp16 store wrote the table too (a bf16 checkpoint's fast path), or it did not.
        if (t === shared && copy!.written) await copy!.sink.commitAsync();
        else {
          if (t === shared) copy!.sink.abort();
          await writeHostTable(ckpt, t.tensor, t.shape, join(out, tableFile(t)));
        }
        manifest.hostTables.push({ name: t.name, file: tableFile(t), dtype: t.dtype, shape: t.shape });
      }
      const first = manifest.hostTables[0];
      manifest.embedding = { file: first.file, dtype: first.dtype, shape: first.shape as [number, number] };
    }
    await writeFile(join(out, GRAPHS_JSON), JSON.stringify(manifest, null, 2));
    return manifest;
  } finally {
    copy?.sink.abort(); // no-op once committed
    await ckpt.close();
  }
}

export const stage: StageModule<ExportParams> = {
  name: 'export',
  version: '3',
  async run(ctx) {
    const ref = readCheckpointRef(ctx.inputs.checkpoint);
    const plan = JSON.parse(readFileSync(join(ctx.inputs.plan, 'plan.json'), 'utf8')) as ShardPlan;
    const map = ctx.inputs.precision ? (JSON.parse(readFileSync(join(ctx.inputs.precision, PRECISION_JSON), 'utf8')) as { matrices: PrecisionMap }).matrices : undefined;
    const m = await runExport(ctx.params, ref.absDir, plan, ctx.out, ctx, map);
    return {
      summary: {
        scheme: m.scheme,
        contexts: m.contexts.map((c) => ({ name: c.name, dataBytes: c.dataBytes, graphs: c.graphs.length })),
        // The matrices not in the scheme asked for (a W4 fallback), with why.
        ...(matrixFallbacks(m).length ? { fallbacks: matrixFallbacks(m) } : {}),
        ...(m.linked ? { linked: m.linked.map((f) => ({ file: f.file, bytes: f.bytes, how: f.how })) } : {}),
      },
    };
  },
};
