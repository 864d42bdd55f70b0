// The model card (the bundle's README.md), generated from the recipe and the gate outputs of the
// build. Every figure in it was measured in that build; a figure that was not measured is named as
// such (device numbers appear only when the parity gate ran on a device).
import type { HexagonArch } from '../arch/table.js';
import type { Equalize, Recipe, Rescale } from '../recipe/schema.js';
import type { OracleResult } from '../gates/oracle.js';
import type { CompiledContext } from '../toolchain/qnn/compile-stage.js';
import type { Manifest } from './manifest.js';
import { confidenceSection, type Confidence } from './confidence.js';
import { W4_BLOCK } from '../quant/w4.js';
import { mixed, precisionTable, type PrecisionRow } from './precision-map.js';
import { planLines } from './plan-table.js';
import type { DecodeBytesRow } from './decode-bytes.js';
import { sizeText as mb } from '../units.js';
import type { ShardPlan } from '../plan/shards.js';
import type { PixelCheck } from '../gates/pixels.js';
import type { AudioFeatureCheck } from '../gates/audio-features.js';

/** A mismatch as parity.json lists it (src/gates/parity.ts Mismatch). */
export interface ListedMismatch { variant?: string; prompt: number; step: number; hf: { token: number }; runtime: { token: number }; margin: number | null; tie: boolean }

/** What the card reads of parity.json (src/gates/parity.ts paritySummary). */
export interface ParityFacts {
  ok: boolean; target: string; matched: number; total: number; ties: number; maxTies: number; tiesWhy?: string; rule: string;
  variants: Record<string, { matched: number; total: number; ties: number; mismatches: number; tieMargin: number | null; timings: Record<string, number> }>;
  mismatches: { count: number; listed: ListedMismatch[] };
  /** The runtime's image front-end against HF's processor, per image prompt (src/gates/pixels.ts). */
  pixels?: PixelCheck[];
  /** The runtime's audio front-end against HF's feature extractor, per audio prompt (src/gates/audio-features.ts). */
  audioFeatures?: AudioFeatureCheck[];
  /** A vision bundle's text-only manifest, run on the text prompts. */
  textManifest?: { file: string; variants: Record<string, { ok: boolean; total: number; mismatches: number; ties: number }> };
}

export interface CardFacts {
  recipe: { id: string; family: string; source: Recipe['source']; card: Recipe['card'] };
  /** Bytes one decode step moves at a few positions (decode-bytes.ts), as built: float32 state, caches read whole. */
  decodeBytes?: DecodeBytesRow[];
  arch: HexagonArch;
  manifest: Manifest;
  compiled: CompiledContext[];
  oracle: OracleResult;
  parity: ParityFacts;
  tools: Record<string, string>;
  /** The x86 HTP simulator gate, when it ran (tiny twins). */
  emulation?: { ok: boolean; simulator: string; graphs: Record<string, { minCosine: number; top1?: string }>; parity: { matched: number; total: number; ties: number; maxTies: number; tieMargin: number | null; mismatches: { count: number; listed: ListedMismatch[] } } };
  /** Gates the build left out, and why. */
  gatesNotRun?: Record<string, string>;
  /** HF's margins along the traced continuations beside each precision's largest logit error. */
  confidence: Confidence;
  /** Optional graphs the planner left out to stay within the arch's limits (plan.json `dropped`). */
  planDropped?: Array<{ graph: string; why: string }>;
  /** What the plan keeps: contexts and graphs (plan.json), against the arch's limits. */
  planKept?: { contexts: number; graphs?: number };
  /** plan.json: the card prints each context's layers, planned bytes and state (plan-table.ts). */
  plan?: ShardPlan;
  /** The shipped graphs' weight schemes, the per-layer map, and the matrices stored otherwise with why (graphs.json; precision.json under auto). */
  precision?: ShippedPrecision;
  /** The recipe's exact rewrites for this arch (`rescale`, `equalize`): the same function in numbers the hardware holds. */
  rewrites?: { rescale: Rescale[]; equalize: Equalize[] };
}

export interface ShippedPrecision {
  /** The recipe's layer quant ('auto' included) and the lm-head's. */
  scheme: string;
  lmHeadScheme: string;
  fallbacks: Array<{ tensor: string; scheme: string; why: string; paddedTo?: number }>;
  rows: PrecisionRow[];
  /** Under auto: the threshold, the layers promoted, the layers' bytes as chosen, all w4 and all w8, host parity all w4. */
  auto?: { minCosine: number; promoted: number; layers: number; bytes: { auto: number; w4: number; w8: number }; w4Parity: string };
  /** Under lmHead.quant 'auto': the lm-head alone at w4 (logits cosine, HF's token at agree/steps), its bytes as chosen and at w4, why it was promoted. */
  lmHeadAuto?: { w4Cosine: number; w4Top1: string; bytes: number; w4Bytes: number; why?: string };
  /** 'qdq': the QAIRT converter's QDQ forms (quant/weights.ts); absent: MatMulNBits. */
  form?: 'qdq';
}

/** The recipe's exact rewrites, each with why (forge bisect --apply writes its reason in). */
function rewriteLines(r: NonNullable<CardFacts['rewrites']>): string[] {
  if (!r.rescale.length && !r.equalize.length) return [];
  const why = (w?: string) => (w ? `: ${w.replace(/^forge bisect: /, '')}` : '');
  return [
    '**Exact rewrites** (the same function as the checkpoint, in numbers the hardware holds; recipe `rescale` and `equalize`):',
    ...r.rescale.map((x) => `- ops under \`${x.match}\` rescaled by 2^${Math.log2(x.scale)}${why(x.why)}`),
    ...r.equalize.map((x) => `- experts \`${x.match}\`: channels equalized before quantization${why(x.why)}`),
    '',
  ];
}

/** The precision lines: the scheme, and, when not every matrix is in it, the per-layer map with why. */
function precisionLines(p: ShippedPrecision): string[] {
  if (p.scheme !== 'w4' && p.scheme !== 'auto' && !p.fallbacks.length && !mixed(p.rows) && !p.lmHeadAuto) return [];
  const h = p.lmHeadAuto;
  const head = h
    ? `; the lm-head ${p.lmHeadScheme}, chosen by the gates (lmHead.quant auto: alone at w4 it picks Hugging Face's token at ${h.w4Top1} traced steps, logits cosine ${h.w4Cosine.toFixed(5)}${h.why ? `; ${h.why.replace(/^auto: /, '')}` : ', and host parity holds'}; ${mb(h.bytes)}, ${(h.bytes / h.w4Bytes).toFixed(2)}× its w4 size)`
    : p.lmHeadScheme !== p.scheme ? `; the lm-head ${p.lmHeadScheme} (recipe lmHead.quant)` : ', the lm-head too';
  // W4's QDQ form has met only the stand-in SDK, never a real converter (quant/w4-qdq.ts): the card says so.
  const form = p.form === 'qdq' ? 'blocked DequantizeLinear for the QAIRT converter, checked against a stand-in SDK only, not a real one' : 'MatMulNBits';
  const w4 = `int4 blocks of ${W4_BLOCK}, ${form}`;
  const lines: string[] = [];
  if (p.auto) {
    const a = p.auto;
    const x = (b: number) => (b / a.bytes.w8).toFixed(3);
    lines.push(`**Precision:** auto: every layer matrix starts at w4 (${w4}) and a layer is promoted to w8 (or fp16) while it alone keeps a cosine under ${a.minCosine} against Hugging Face (gates.oracle.autoMinCosine) or while host parity fails by the recipe's rule (all w4: ${a.w4Parity}); ${a.promoted} of ${a.layers} layers promoted${head}. Layer weights ${mb(a.bytes.auto)}: ${x(a.bytes.auto)}× their w8 size (all w4: ${x(a.bytes.w4)}×).`, '');
  } else {
    const count = (n: number, what: string) => (n ? [`${n} ${n === 1 ? 'matrix' : 'matrices'} ${what}`] : []);
    const padded = p.fallbacks.filter((f) => f.paddedTo).length;
    const noted = [...count(p.fallbacks.length - padded, 'otherwise'), ...count(padded, 'zero-padded')].join(', ');
    lines.push(`**Precision:** layer weights ${p.scheme}${p.scheme === 'w4' ? ` (${w4})` : ''}${head}; ${noted ? `${noted}:` : `every ${p.lmHeadScheme !== p.scheme ? 'layer ' : ''}matrix ${p.scheme}.`}`);
    for (const f of p.fallbacks) lines.push(`- \`${f.tensor}\`: ${f.scheme}, ${f.why}`);
    lines.push('');
  }
  if (p.auto || mixed(p.rows)) lines.push('Precision map (matrices per layer; graphs.json in the build lists each one):', '', ...precisionTable(p.rows), '');
  return lines;
}


function role(file: string, f: CardFacts): string {
  if (file === 'manifest.json') return 'manifest: the runtime contract (graphs, bindings, state, limits)';
  if (file === 'manifest.text.json') return 'the text-only manifest: the same graphs without the image and audio encoders';
  if (file === 'README.md') return 'this model card';
  if (file === 'SHA256SUMS') return 'checksums (`sha256sum -c SHA256SUMS`)';
  if (file.endsWith('_ctx.onnx')) return `EPContext wrapper of graph ${file.replace(/_ctx\.onnx$/, '')}`;
  const table = f.manifest.hostTables.find((t) => t.file === file);
  if (table) return `host ${table.use} table, ${table.dtype} [${table.shape.join(', ')}]`;
  if (file.endsWith('.bin')) return `QNN context binary for ${f.arch.id} (soc_model ${f.arch.socModel})`;
  if (file === f.manifest.tokenizer.file) return 'tokenizer';
  if (file === f.manifest.tokenizer.config) return 'tokenizer config and chat template';
  return '';
}

function source(s: Recipe['source']): string {
  if (s.kind === 'hub') {
    const repo = `[${s.repo}](https://huggingface.co/${s.repo})`;
    if (s.revision === null) return `${repo} at an unpinned revision`; // a build pins one first (pinnedRecipe)
    // The recipe pins no revision (the schema allows `unpinned` only then): `forge build --revision` gave this one.
    if (s.unpinned !== undefined) return `${repo} at revision \`${s.revision}\`, given at build time with \`--revision\` (the recipe pins none: ${s.unpinned.replace(/\.$/, '')})`;
    return `${repo} at revision \`${s.revision}\``;
  }
  if (s.kind === 'tiny') return `a tiny ${s.twin} twin made by forge (oracles/make_twin.py: trained briefly on a fixed corpus until its greedy continuations are confident)`;
  return 'a local checkpoint';
}

/** What a decode step moves, per position: decode on the NPU is bound by these bytes over the memory bandwidth. */
function decodeBytesLines(rows: DecodeBytesRow[]): string[] {
  const out = [
    '**Bytes per decode token** (counted from the plan and the graphs, not measured on a device: every weight of the contexts a step runs, the KV caches and recurrent state it reads and writes, the host-table rows and the graphs\' other inputs and outputs; the caches cross the graph boundary as float32 and are read whole at every position). Decode on the NPU is bound by these bytes:',
    '', '| position | per token | weights | KV caches read | other |', '|---|---|---|---|---|',
  ];
  for (const r of rows) out.push(`| ${r.position} | ${mb(r.bytesPerToken)} | ${mb(r.weights)} | ${mb(r.kvRead)} | ${mb(r.other)} |`);
  return [...out, ''];
}

/** Each listed mismatch with HF's margin there, and whether it was a tie. */
function mismatchLines(listed: ListedMismatch[], count: number): string[] {
  if (!count) return [];
  const out = ['', '| graphs | prompt | step | HF token | runtime token | HF margin | |', '|---|---|---|---|---|---|---|'];
  for (const m of listed) out.push(`| ${m.variant ?? 'shipped'} | ${m.prompt} | ${m.step} | ${m.hf.token} | ${m.runtime.token} | ${m.margin === null ? '-' : m.margin.toExponential(2)} | ${m.tie ? 'tie' : 'mismatch'} |`);
  if (count > listed.length) out.push('', `${count - listed.length} more mismatches are in build/parity.json's count, not listed.`);
  return out;
}

/** How an image reaches the model (a bundle with a vision encoder), and the front-end's figures against HF's processor. */
/** The chat template's switches `--chat-option` sets (tokenizer.chatOptions), or why the runtime offers none. */
function chatOptionLines(t: Manifest['tokenizer']): string[] {
  if (t.chatOptionsNotApplied) return [`The chat template reads switches the runtime does not offer (${t.chatOptionsNotApplied.replace(/\.$/, '')}): \`--chat\` gives the wrap with none passed; for another, feed the ids transformers' \`apply_chat_template\` gives with \`--prompt-ids\`.`, ''];
  if (!t.chatOptions) return [];
  const names = [...new Set(t.chatOptions.flatMap((v) => Object.keys(v.options)))].sort();
  return [
    `**Chat options:** ${names.map((n) => `\`${n}\``).join(', ')}. \`--chat --chat-option ${names[0]}=false\` (true or false; repeatable, one per option) gives the ids transformers' \`apply_chat_template(..., ${names[0]}=False)\` gives: forge rendered the template for every combination (\`tokenizer.chatOptions\`); an option not given is not passed, as when the keyword is left out.`,
    '',
  ];
}

function imageLines(f: CardFacts): string[] {
  const p = f.manifest.hostOpParams ?? {};
  const budget = p.max_soft_tokens;
  if (p.image_height === undefined && budget === undefined) return [];
  const vision = f.manifest.contexts.flatMap((c) => c.graphs).find((g) => g.inputs.some((i) => i.bind === 'pixels'));
  const tokens = vision?.outputs[0]?.shape[0];
  const how = budget !== undefined
    ? `resizes it, keeping its aspect ratio, to the largest sides that are multiples of ${Number(p.patch_size) * Number(p.pooling_kernel_size)} pixels within ${budget} soft tokens (${budget}·${p.pooling_kernel_size}² patches, as Hugging Face's Gemma 4 processor does), rescales it to [0, 1] and cuts it into ${p.patch_size}-pixel patches with their positions in C++; the encoder runs once per image and gives one soft token per ${p.pooling_kernel_size}×${p.pooling_kernel_size} patches (a wide or tall image gives fewer than ${budget}), which take the place of the image tokens between \`<start_of_image>\` and \`<end_of_image>\` in the prompt.`
    : `stretches it to ${p.image_width}×${p.image_height} (the vision encoder's grid is fixed when the bundle is built; the aspect ratio is not kept), normalises it and cuts it into ${p.patch_size}-pixel patches in C++; the encoder runs once per image${tokens ? ` and gives ${tokens} image tokens` : ''}, which take the place of the image placeholder tokens in the prompt.`;
  const lines = ['## Images', '', `An image is passed to the runtime as a file (\`--image photo.jpg\`, JPEG or PNG). The runtime decodes it, ${how}`, ''];
  const checks = f.parity.pixels ?? [];
  if (!checks.length) return [...lines, '**Pre-processing against Hugging Face: not measured** (the recipe traces no image prompt).', ''];
  const resized = budget !== undefined ? 'resized' : 'stretched';
  lines.push(`**Pre-processing against Hugging Face's processor** (the same file through both; HF ${resized} with PIL's bicubic first${budget !== undefined ? '; the patch positions are equal' : ''}):`, '', '| image | cosine | max abs error | mean abs error |', '|---|---|---|---|');
  for (const c of checks) lines.push(`| \`${c.image}\` | ${c.cosine.toFixed(7)} | ${c.maxAbs.toExponential(2)} | ${c.meanAbs.toExponential(2)} |`);
  // Times vary run to run: they stay in build/parity.json, so the card is the same for the same inputs.
  lines.push('', `Pixel values lie in ${budget !== undefined ? '[0, 1]' : '[−1, 1]'}; where the file is not already the encoder's size, the differences come from the two resamplers (the runtime's against PIL's bicubic). Pre-processing times per image are in build/parity.json.`, '');
  return lines;
}

/** How an audio clip reaches the model (a bundle with an audio encoder), and the front-end's figures against HF's extractor. */
function audioLines(f: CardFacts): string[] {
  const p = f.manifest.hostOpParams ?? {};
  if (p.audio_max_seconds === undefined) return [];
  const lines = ['## Audio', '', `An audio clip is passed to the runtime as a file (\`--audio clip.wav\`: WAV, FLAC or OGG, any rate, mono or not) of at most ${p.audio_max_seconds} s. The runtime decodes it, averages its channels, resamples it to 16 kHz and computes Hugging Face's Gemma 4 log-mel features (20 ms frames every 10 ms, 128 mel bins) in C++, padded to the encoder's length; the audio encoder runs once per clip and gives one soft token per 40 ms of audio, which take the place of the audio tokens between \`<start_of_audio>\` and \`<end_of_audio>\` in the prompt.`, ''];
  const checks = f.parity.audioFeatures ?? [];
  if (!checks.length) return [...lines, '**Pre-processing against Hugging Face: not measured** (the recipe traces no audio prompt).', ''];
  lines.push("**Pre-processing against Hugging Face's feature extractor** (the same clip through both; the clip's own frames, and the frame masks equal):", '', '| clip | frames | cosine | max abs error |', '|---|---|---|---|');
  for (const c of checks) lines.push(`| \`${c.clip}\` | ${c.frames} | ${c.cosine.toFixed(7)} | ${c.maxAbs.toExponential(2)} |${c.ok ? '' : ' FAIL'}`);
  lines.push('', 'Pre-processing times per clip are in build/parity.json.', '');
  return lines;
}

export function modelCard(f: CardFacts, sizes: Record<string, number>): string {
  const { recipe, arch, manifest } = f;
  const lines: string[] = [];
  lines.push(`# ${recipe.card.title} — ${arch.id} (${arch.soc}, ${arch.marketingName})`, '');
  lines.push(`Built by forge from ${source(recipe.source)}, recipe \`${recipe.id}\`, family \`${recipe.family}\`, host-op \`${manifest.hostOp}\`.`, '');
  if (recipe.source.allowNonFinite) lines.push(`**NaN/Inf weight check: not run** — the recipe allows non-finite weights: ${recipe.source.allowNonFinite.reason}.`, '');
  lines.push(`**Arch-pinned:** the context binaries are compiled for soc_model ${arch.socModel} (${arch.dspArch}); they do not load on another Hexagon arch. Max context ${manifest.limits.maxContext} tokens. License: ${recipe.card.license}.`, '');
  // One line per reason: the planner drops graphs for the same limit together.
  const byWhy = new Map<string, string[]>();
  for (const d of f.planDropped ?? []) byWhy.set(d.why, [...(byWhy.get(d.why) ?? []), d.graph]);
  for (const [why, graphs] of byWhy) lines.push(`**Planner:** left out ${graphs.length} graph(s) for ${arch.id} (${graphs.map((g) => `\`${g}\``).join(', ')}): ${why}.`, '');
  // Said when nothing was left out too: the same recipe may lose graphs on another arch.
  if (f.planKept?.graphs !== undefined) {
    lines.push(`**Planner:** ${f.planKept.graphs} graphs in ${f.planKept.contexts} contexts, within ${arch.id}'s limits of ${arch.maxGraphsPerProcess} graphs per process and ${arch.maxContexts} contexts (arch table)${byWhy.size ? '' : '; nothing left out'}.`, '');
  }
  if (f.plan) lines.push(...planLines(f.plan, manifest));
  if (f.precision) lines.push(...precisionLines(f.precision));
  if (f.rewrites) lines.push(...rewriteLines(f.rewrites));
  if (f.decodeBytes?.length) lines.push(...decodeBytesLines(f.decodeBytes));
  lines.push('## Files', '', '| file | bytes | role |', '|---|---|---|');
  for (const file of [...Object.keys(sizes), 'README.md', 'SHA256SUMS'].filter((x, i, a) => a.indexOf(x) === i).sort()) {
    lines.push(`| \`${file}\` | ${sizes[file] !== undefined ? mb(sizes[file]) : '-'} | ${role(file, f)} |`);
  }
  lines.push('', '## Run it', '', 'From this folder, with the runner and the QNN and ONNX Runtime libraries beside it:', '', '```sh');
  lines.push(`adb push . /data/local/tmp/${recipe.id}`);
  lines.push(`adb shell "cd /data/local/tmp/${recipe.id} && LD_LIBRARY_PATH=\\$PWD ADSP_LIBRARY_PATH=\\$PWD \\`);
  // A model with a chat template is asked as its users do: the prompt wrapped in one user turn.
  const chat = Boolean(manifest.tokenizer.chat);
  lines.push(`  ./qhx_generate manifest.json libQnnHtp.so libQnnSystem.so . ${manifest.generation.maxNewTokens} ${chat ? "'What is the capital of France?' --chat" : "'The capital of France is'"}"`);
  lines.push('```', '', 'The runner and the QNN/ORT libraries are not part of the bundle; see forge\'s docs/DEVICE.md.', '');
  lines.push(chat
    ? '`--chat` wraps the prompt in the model\'s chat template as one user turn with the assistant\'s generation prompt (rendered by forge into the manifest\'s `tokenizer.chat`: the token ids transformers\' `apply_chat_template` gives); without it the prompt is plain text. `--print-prompt-ids` prints the ids fed, for `--prompt-ids` to repeat exactly.'
    : manifest.tokenizer.chatNotApplied
      ? `The runtime cannot apply the model's chat template (${manifest.tokenizer.chatNotApplied.replace(/\.$/, '')}): the prompt above is plain text; feed the ids transformers' \`apply_chat_template\` gives with \`--prompt-ids\` to ask as its users do. \`--print-prompt-ids\` prints the ids fed.`
      : 'The model has no chat template: the prompt is plain text. `--print-prompt-ids` prints the ids fed, for `--prompt-ids` to repeat exactly.', '');
  if (chat) lines.push(...chatOptionLines(manifest.tokenizer));
  lines.push(...imageLines(f), ...audioLines(f));
  lines.push('## Gates, as measured in this build', '');
  lines.push(`**Oracle** (teacher-forced against Hugging Face fp32, onnxruntime CPU): ${f.oracle.ok ? 'pass' : 'FAIL'}.`, '');
  lines.push('| graphs | min cosine | top-1 |', '|---|---|---|');
  for (const [g, e] of Object.entries(f.oracle.graphs)) lines.push(`| ${g} | ${e.minCosine.toFixed(7)} | ${e.top1 ?? '-'} |`);
  const handoff = f.oracle.handoff?.quantize;
  if (handoff) lines.push('', `**Residual hand-off** between contexts (shard → shard → lm-head), chosen by the oracle gate: ${handoff.dtype}. ${handoff.why}.`);
  lines.push('', `**Parity** (greedy on \`${f.parity.target}\`, teacher-forced on Hugging Face's tokens): ${f.parity.ok ? 'pass' : 'FAIL'}. Rule: ${f.parity.rule}.`, '');
  const onDevice = f.parity.target.startsWith('adb:');
  // Host timings vary run to run and say nothing about a phone: they stay in build/report.md, so the
  // card (and the bundle) is the same for the same inputs. Device timings are the point of a device run.
  lines.push(onDevice ? '| graphs | tokens equal to HF | ties (allowed) | tie margin | start-up ms | prefill ms | ms/token | host overhead ms/token |' : '| graphs | tokens equal to HF | ties (allowed) | tie margin |', onDevice ? '|---|---|---|---|---|---|---|---|' : '|---|---|---|---|');
  for (const [v, r] of Object.entries(f.parity.variants)) {
    const name = v === 'quantize' ? `shipped (${f.precision?.scheme ?? manifest.contexts[0].graphs[0].quant.weights})` : 'fp32 reference';
    const held = `${r.total - r.mismatches}/${r.total}`;
    const ties = `${r.ties} (${f.parity.maxTies})`;
    const margin = r.tieMargin === null ? 'none measured' : r.tieMargin.toExponential(2);
    lines.push(onDevice
      ? `| ${name} | ${held} | ${ties} | ${margin} | ${r.timings.load_ms.toFixed(0)} | ${r.timings.prefill_ms.toFixed(2)} | ${r.timings.decode_ms_per_token.toFixed(3)} | ${r.timings.host_overhead_ms_per_token.toFixed(4)} |`
      : `| ${name} | ${held} | ${ties} | ${margin} |`);
  }
  lines.push(...mismatchLines(f.parity.mismatches.listed, f.parity.mismatches.count));
  const text = f.parity.textManifest;
  if (text) {
    const each = Object.entries(text.variants).map(([v, r]) => `${v === 'quantize' ? 'shipped' : 'fp32 reference'} ${r.total - r.mismatches}/${r.total} equal to HF${r.ties ? ` (${r.ties} ties)` : ''}`);
    lines.push('', `**Text-only manifest** (\`${text.file}\`: the same graphs without the image and audio encoders) on the text prompts: ${each.join(', ')}${Object.values(text.variants).every((r) => r.ok) ? '' : ' — FAIL'}.`);
  }
  if (f.parity.tiesWhy) lines.push('', `This recipe allows up to ${f.parity.maxTies} tie${f.parity.maxTies === 1 ? '' : 's'} per variant: ${f.parity.tiesWhy}.`);
  lines.push('', onDevice
    ? `Timings measured on the device ${f.parity.target.slice(4)}.`
    : 'Parity ran on the host CPU (ONNX Runtime CPU EP on the ONNX graphs), not on a phone: **no device figure was measured for this bundle.**', '');
  for (const [gate, why] of Object.entries(f.gatesNotRun ?? {})) lines.push(`**${gate[0].toUpperCase()}${gate.slice(1)}: not run** — ${why}.`, '');
  if (f.emulation) {
    const ep = f.emulation.parity;
    lines.push(`**Emulation** (the shipped graphs compiled as separate, not weight-shared, contexts — the simulator cannot load shared ones — on the ${f.emulation.simulator}): ${f.emulation.ok ? 'pass' : 'FAIL'}; parity (teacher-forced) ${ep.total - ep.mismatches.count}/${ep.total} equal to HF, ${ep.ties} ties (${ep.maxTies} allowed; tie margin ${ep.tieMargin === null ? 'none measured' : `${ep.tieMargin.toExponential(2)}, twice the larger of the simulator's lm-head logit error and the shipped graphs' chained one on the CPU`}).`);
    lines.push(...mismatchLines(ep.mismatches.listed, ep.mismatches.count), '');
    lines.push('| graph | min cosine vs HF | top-1 |', '|---|---|---|');
    for (const [g, e] of Object.entries(f.emulation.graphs)) lines.push(`| ${g} | ${e.minCosine.toFixed(7)} | ${e.top1 ?? '-'} |`);
    lines.push('');
  }
  lines.push('**Compiled contexts**', '', '| context | bytes | of the per-context ceiling | reported target |', '|---|---|---|---|');
  for (const c of f.compiled) lines.push(`| ${c.name} | ${mb(c.bytes)} | ${((100 * c.bytes) / arch.contextCeilingBytes).toFixed(1)}% | soc_model ${c.target.socModel}, ${c.target.dspArch} |`);
  const qairt = f.compiled[0]?.qairtVersion;
  lines.push('', ...confidenceSection(f.confidence));
  lines.push('## Toolchain', '', ...Object.entries(f.tools).sort().map(([k, v]) => `- ${k} ${v}`), ...(qairt ? [f.compiled[0].toolchain === 'qairt' ? `- compiled with the QAIRT SDK ${qairt} (command-line tools)` : `- QAIRT (inside onnxruntime-qnn) ${qairt}`] : []), '');
  lines.push('## Caveats', '');
  for (const c of recipe.card.caveats) lines.push(`- ${c}`);
  lines.push('- Activations run in fp16 on the HTP (`enable_htp_fp16_precision`); the oracle and parity gates above ran the same graphs in float32 on the CPU.');
  return lines.join('\n') + '\n';
}
