// Stage `bundle`: what the user ships, flat, ready for `adb push`: manifest.json, the QNN context
// binaries with their _ctx.onnx wrappers, the host embedding table, tokenizer files, the model card
// (README.md) and SHA256SUMS; the graphs ship as compiled contexts only, never the ONNX weights too.
// It runs only after every gate passed (its inputs), and writes nothing that varies between builds
// of the same inputs: no timestamps, no absolute paths.
import { readFileSync, statSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import type { ArchSettings, FamilyId, Recipe } from '../recipe/schema.js';
import { getFamily } from '../families/index.js';
import { AS_BUILT } from './decode-traffic.js';
import { cardPositions, decodeRow, decodeSteps, type DecodeBytesRow } from './decode-bytes.js';
import type { PrecisionMap } from '../quant/precision.js';
import { top1Text } from '../gates/top1.js';
import { getArch } from '../arch/table.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { listFiles, sha256OfFile } from '../engine/hash.js';
import { assembleBundle, readCompiled } from './assemble.js';
import { modelCard, type CardFacts, type ShippedPrecision } from './card.js';
import { buildConfidence } from './confidence.js';
import { readTraceMeta } from '../gates/trace.js';
import type { OracleResult } from '../gates/oracle.js';
import type { Manifest } from './manifest.js';
import type { ShardPlan } from '../plan/shards.js';
import { GRAPHS_JSON, matrixFallbacks, type ExportManifest } from '../export/graphs.js';
import { exportMatrices, precisionRows } from './precision-map.js';
import { PRECISION_JSON } from '../quant/precision.js';
import { parityText, type PrecisionResult } from '../quant/auto.js';

export interface BundleParams {
  recipe: { id: string; family: FamilyId; source: Recipe['source']; card: Recipe['card'] };
  arch: string;
  maxNewTokens: number;
  /** Gates the pipeline left out, and why: the card says so. */
  gatesNotRun?: Record<string, string>;
  /** The arch's settings the build used: the card's bytes per decode token are counted from them. */
  settings: ArchSettings;
}

export const SUMS = 'SHA256SUMS';

/** Every file the manifest names, with the sha256 it records. */
function manifestHashes(m: Manifest): Map<string, string> {
  const known = new Map<string, string>();
  for (const c of m.contexts) {
    for (const f of c.files) known.set(f.path, f.sha256);
    for (const g of c.graphs) {
      if (g.file && g.sha256) known.set(g.file, g.sha256);
      if (g.qnn) known.set(g.qnn.wrapper, g.qnn.sha256);
    }
  }
  for (const t of m.hostTables) known.set(t.file, t.sha256);
  known.set(m.tokenizer.file, m.tokenizer.sha256);
  return known;
}

function emulationFacts(e: any): NonNullable<CardFacts['emulation']> {
  const sim = e.simulator;
  return {
    ok: e.ok,
    simulator: `x86 HTP simulator (soc_model ${sim.socModel}, ${sim.dspArch}, QAIRT ${sim.qairt}${sim.fp16 ? ', fp16 activations' : ''})`,
    graphs: e.oracle.graphs,
    parity: {
      matched: e.parity.matched, total: e.parity.total, ties: e.parity.ties, maxTies: e.thresholds.maxTies, tieMargin: e.parity.tieMargin,
      mismatches: { count: e.parity.mismatchCount, listed: e.parity.mismatches },
    },
  };
}

/** The shipped graphs' schemes and per-layer map (graphs.json `matrices`; precision.json under auto). */
export function shippedPrecision(quantizeDir: string, precisionDir?: string): ShippedPrecision {
  const exp = JSON.parse(readFileSync(join(quantizeDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  const auto = precisionDir ? (JSON.parse(readFileSync(join(precisionDir, PRECISION_JSON), 'utf8')) as PrecisionResult) : undefined;
  const rows = precisionRows(exportMatrices(exp), auto);
  const form = exp.w8Form === 'qdq' ? { form: 'qdq' as const } : {};
  if (!auto) return { scheme: exp.scheme, lmHeadScheme: exp.lmHeadScheme, fallbacks: matrixFallbacks(exp), rows, ...form };
  const h = auto.lmHead;
  return {
    scheme: auto.layers.length ? 'auto' : exp.scheme, lmHeadScheme: h?.scheme ?? exp.lmHeadScheme, fallbacks: matrixFallbacks(exp), rows, ...form,
    ...(auto.layers.length ? {
      auto: {
        minCosine: auto.minCosine, promoted: auto.layers.filter((l) => l.scheme !== 'w4').length, layers: auto.layers.length,
        bytes: auto.layerBytes,
        w4Parity: parityText(auto.parity.w4),
      },
    } : {}),
    ...(h ? { lmHeadAuto: { w4Cosine: h.w4Cosine, w4Top1: top1Text(h.w4Top1), bytes: h.bytes, w4Bytes: h.w4Bytes, ...(h.why ? { why: h.why } : {}) } } : {}),
  };
}

/** The card's bytes per decode token at its positions, for the build's own settings and auto's map. */
async function decodeBytes(p: BundleParams, plan: ShardPlan, checkpointDir: string, precisionDir?: string): Promise<DecodeBytesRow[]> {
  const family = getFamily(p.recipe.family);
  const file = join(checkpointDir, 'config.json');
  const config = family.parseConfig(JSON.parse(readFileSync(file, 'utf8')), file);
  const map = precisionDir ? (JSON.parse(readFileSync(join(precisionDir, PRECISION_JSON), 'utf8')) as { matrices: PrecisionMap }).matrices : undefined;
  const at = await decodeSteps(family, config, getArch(p.arch), p.settings, AS_BUILT, map, plan);
  return cardPositions(p.settings.maxContext).map((position) => decodeRow(position, at(position)));
}

export const stage: StageModule<BundleParams> = {
  name: 'bundle',
  version: '2',
  async run(ctx) {
    const p = ctx.params;
    const arch = getArch(p.arch);
    const compiledOutput = readCompiled(ctx.inputs.compile);
    const compiled = compiledOutput.contexts;
    const manifest = await assembleBundle({
      recipe: p.recipe, arch, graphsDir: ctx.inputs.quantize, embeddingDir: ctx.inputs.quantize,
      checkpointDir: readCheckpointRef(ctx.inputs.checkpoint).absDir, maxNewTokens: p.maxNewTokens,
      compiled: compiledOutput,
    }, ctx.out);

    const oracle = JSON.parse(readFileSync(join(ctx.inputs.oracle, 'oracle.json'), 'utf8')) as OracleResult;
    const emulation = ctx.inputs.emulation ? JSON.parse(readFileSync(join(ctx.inputs.emulation, 'emulation.json'), 'utf8')) : undefined;
    const plan = JSON.parse(readFileSync(join(ctx.inputs.plan, 'plan.json'), 'utf8')) as ShardPlan;
    const facts: CardFacts = {
      recipe: p.recipe, arch, manifest, compiled, oracle,
      parity: JSON.parse(readFileSync(join(ctx.inputs.parity, 'parity.json'), 'utf8')),
      tools: ctx.tools,
      ...(p.gatesNotRun ? { gatesNotRun: p.gatesNotRun } : {}),
      ...(emulation ? { emulation: emulationFacts(emulation) } : {}),
      confidence: buildConfidence(readTraceMeta(ctx.inputs.trace), oracle, emulation),
      planDropped: plan.dropped ?? [],
      planKept: { contexts: plan.contexts, graphs: plan.graphs },
      plan,
      precision: shippedPrecision(ctx.inputs.quantize, ctx.inputs.precision),
      rewrites: { rescale: p.settings.rescale, equalize: p.settings.equalize },
      decodeBytes: await decodeBytes(p, plan, readCheckpointRef(ctx.inputs.checkpoint).absDir, ctx.inputs.precision),
    };
    const files = await listFiles(ctx.out);
    const sizes = Object.fromEntries(files.map((f) => [f, statSync(join(ctx.out, f)).size]));
    await writeFile(join(ctx.out, 'README.md'), modelCard(facts, sizes));
    const all = [...files, 'README.md'].sort();
    // The manifest already holds the sha256 of every file it names (the multi-GB ones among them),
    // computed from these very files by assembleBundle: hash only the rest.
    const known = manifestHashes(manifest);
    const sums = await Promise.all(all.map(async (f) => `${known.get(f) ?? (await sha256OfFile(join(ctx.out, f)))}  ${f}`));
    await writeFile(join(ctx.out, SUMS), sums.join('\n') + '\n');
    return { summary: { files: all.length + 1, bytes: Object.values(sizes).reduce((a, b) => a + b, 0), decodeBytesPerToken: Object.fromEntries(facts.decodeBytes!.map((r) => [String(r.position), r.bytesPerToken])) } };
  },
};
