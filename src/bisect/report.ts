// forge bisect's report: bisect.json, a terminal summary and bisect.html (static, no scripts, no
// external assets: the build report's style, src/bundle/report.ts) under out/<recipe>/<arch>/bisect/.
// bisect.html opens with the verdict box (verdict-box.ts); its tables fit a laptop screen (long op
// and tensor names wrap) and fixes are shown by the tensors they change, not the recipe's patterns.
// Everything shown comes from the BisectResult of that run.
import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { BisectResult } from './run.js';
import { expertText } from './experts.js';
import type { StepCosine } from './steps.js';
import type { Trial } from './fixes.js';
import type { OpFigure } from './probe.js';
import type { DriftStep } from './drift.js';
import { divergenceText, verdictText } from './runtime.js';
import { flipText } from '../gates/oracle.js';
import { fromText } from './from.js';
import { runDivergenceText } from './runtime-run.js';
import { opText } from './quant-op.js';
import { boundaryText } from './handoff.js';
import { stepText } from './handoff-bisect.js';
import { shortName } from './fixes.js';
import { PAGE_CSS } from '../bundle/page-style.js';
import { fixChanges, fixCost, patternText, verdictBox, type VerdictBox } from './verdict-box.js';

export const BISECT_JSON = 'bisect.json';
export const BISECT_HTML = 'bisect.html';

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
const cos = (c: number | undefined) => (c === undefined ? '-' : c === Infinity ? '-' : c.toFixed(5));

/** The override lines of the chosen fix, as they go into a recipe's `overrides`. */
const cost = (t: Trial) => (t.rescale ? `+${t.addedOps ?? 0} ops` : t.handoff ? `+${t.handoffBytesPerToken} B/token` : `+${t.addedBytes} B`);

/** The probed ops shown: the named op's scope, with the ops just before and after it. */
function probeRows(r: BisectResult): OpFigure[] {
  const p = r.probe;
  if (!p) return [];
  const i = p.first ? p.ops.indexOf(p.first) : 0;
  return p.ops.filter((o, k) => (p.first && o.scope === p.first.scope) || (k >= i - 3 && k <= i + 3));
}
/** Which prompts the builds traced, in one line: the recipe's, or --prompt's quoted. */
export const promptsText = (r: BisectResult) => r.prompts.source === 'recipe'
  ? `the recipe's gates.prompts (${r.prompts.texts.length})`
  : r.prompts.source === '--from'
    ? `the run's prompt ids (${r.prompts.ids!.map((i) => `${i.length} ids`).join(', ')}), decoded ${r.prompts.texts.map((t) => JSON.stringify(t)).join(', ')}`
    : `--prompt ${r.prompts.texts.map((t) => JSON.stringify(t)).join(', ')}`;
const num = (v: number) => (v >= 1e4 || (v !== 0 && v < 1e-3) ? v.toExponential(3) : v.toFixed(3));

export function summaryText(r: BisectResult): string {
  const lines = [`forge bisect ${r.recipe} --arch ${r.arch} (target ${r.target}): ${r.message}`, `  prompts:     ${promptsText(r)}`];
  if (r.from) lines.push(`  from:        ${fromText(r.from)}`);
  if (r.run) lines.push(`  the run:     ${runDivergenceText(r.run)}`);
  const f = r.fault;
  if (f) {
    lines.push(`  first miss:  ${f.variant} ${f.graph} ${f.layer !== null ? `layer ${f.layer} ` : ''}${f.output} (${f.what}) ${f.nonFinite ?? (f.top1 ? `top-1 ${f.top1}` : `cosine ${cos(f.cosine)} < ${f.threshold}`)}`);
    lines.push(`  link:        ${f.link}`);
    if (r.layer !== undefined) lines.push(`  layer:       ${r.layer}${r.layer !== f.layer ? ` (where the damage is done; layer ${f.layer} is where the gate is first left)` : ''}`);
    const s = r.steps?.first;
    if (s) lines.push(`  first step:  prompt ${s.prompt} step ${s.step} (${s.output} ${cos(s.cosine)}); ${r.steps!.failing} of ${r.steps!.cases.length} traced steps under ${r.steps!.threshold}`);
  }
  if (r.simulator) lines.push(`  simulator (fp16 ${r.simulator.fp16}, ≥ ${r.simulator.threshold}): ${r.simulator.graphs.map((g) => `${g.graph} ${g.nonFinite ? 'non-finite' : cos(g.minCosine)}${g.ok ? '' : ' ✗'}`).join(', ')}; parity ${r.simulator.parity.ok ? 'ok' : 'fails'} (${r.simulator.parity.rule})`);
  const sf = r.simFault;
  if (sf) lines.push(`  first miss:  ${sf.graph} ${sf.output} on the simulator ${sf.nonFinite ?? `cosine ${cos(sf.cosine)} < ${sf.threshold}`} (the CPU holds)`, `  link:        ${sf.link}`);
  if (r.op) lines.push(`  op:          ${r.op.node} (${r.op.op}), layer ${r.op.layer ?? '-'}: ${r.op.why}`, `  probe:       ${r.probe!.ops.length} op outputs of ${r.probe!.graph}, ${r.probe!.cases.length} cases, ${r.probe!.cached ? 'cached' : `${r.probe!.seconds.toFixed(1)} s`}`);
  const q = r.quantOp;
  if (q) {
    lines.push(`  op:          ${q.drop ? opText(q.drop) : 'none: no op of the layer loses cosine'} (where the cosine drops most)`);
    if (q.firstUnder && q.firstUnder.value !== q.drop?.value) lines.push(`  first under: ${opText(q.firstUnder)} (< ${q.threshold})`);
    lines.push(`  op probe:    layer ${q.layer} alone, fp32 vs ${q.scheme}: ${q.ops.length} ops${q.unpaired ? ` (${q.unpaired} unpaired)` : ''}, ${q.cases} traced cases, ${q.seconds.toFixed(1)} s`);
  } else if (r.quantOpError) lines.push(`  op probe:    failed: ${r.quantOpError}`);
  const d = r.drift;
  if (d?.first) {
    lines.push(`  drift:       first divergent token at prompt ${d.first.prompt} step ${d.first.step}: HF ${d.first.hf.token} (margin ${d.first.hf.margin.toFixed(4)} over ${d.first.hf.runnerUp}), shipped ${d.first.shippedToken} (margin for HF's ${d.first.shippedMargin.toFixed(4)})`);
    lines.push(`  logit diff:  moved ${d.logitDelta!.actual.toFixed(4)}; per layer through the lm-head: ${d.layers!.map((l) => `${l.layer}:${l.contribution.toFixed(4)}`).join(' ')}`);
  } else if (d?.notScanned) lines.push(`  drift:       not scanned: ${d.notScanned}`);
  else if (d) lines.push(`  drift:       none: the chained shipped graphs pick HF's token at all ${d.steps.length} generated steps`);
  for (const [name, x] of [['runtime', r.runtime], ['device', r.device]] as const) {
    if (!x) continue;
    const p = x.parity;
    lines.push(`  ${`${name}:`.padEnd(12)} ${p.target} parity ${p.total - p.mismatches}/${p.total} equal to HF teacher-forced, ${p.holds ? 'holds' : 'fails'}${p.ties ? ` (${p.ties} tie${p.ties === 1 ? '' : 's'})` : ''}`);
    const d = x.divergence;
    if (d) lines.push(`  first step:  ${divergenceText(d, p.target)}`);
  }
  if (r.runtime?.chain) lines.push(`  TS chain:    at that step picks ${r.runtime.chain.shippedToken} (margin for HF's token ${r.runtime.chain.shippedMargin.toFixed(4)})`);
  if (r.runtime?.routing?.length) lines.push(`  routing:     ${r.runtime.routing.map(flipText).join('; ')}`);
  if (r.runtime?.attribution) lines.push(`  logit diff:  per layer through the lm-head (HF's token against the runtime's): ${r.runtime.attribution.layers.map((l) => `${l.layer}:${l.contribution.toFixed(4)}`).join(' ')}`);
  if (r.device?.divergence && !r.device.divergence.nonFinite) lines.push(`  there:       the x86 simulator gave ${verdictText(r.device.simulatorAt)}, the host runtime ${verdictText(r.device.hostAt)}`);
  if (r.device) lines.push(`  note:        ${r.device.note}`);
  if (r.link && !r.fault && !r.simFault) lines.push(`  link:        ${r.link}`);
  const h = r.handoff;
  if (h) {
    lines.push(`  link:        ${h.link} (${h.variant}: the gate chose ${h.choice.dtype}: ${h.choice.why})`);
    if (h.boundary) lines.push(`  hand-off:    ${boundaryText(h.boundary)}`);
    if (h.first) lines.push(`  first step:  ${stepText(h.first)}`);
    for (const b of h.boundaries) lines.push(`    ${b.value.padEnd(8)} ${b.from} → ${b.to}: max |value| ${num(b.maxAbs)} at ${b.maxAt}, past 65504 on ${b.overflowSteps} of ${b.steps} steps`);
  }
  if (r.experts) lines.push(`  experts:     layer ${r.experts.layer}, from the cases that read each (${r.experts.graphs.join(', ')}): ${r.experts.figures.map((f) => expertText(f, r.experts!.threshold)).join('; ')}`);
  if (r.alone) lines.push(`  layers alone at ${r.thresholds.quant}: ${r.alone.map((a) => `${a.layer}:${a.nonFinite ? 'non-finite' : cos(a.cosine)}`).join(' ')}`);
  for (const s of r.suspects ?? []) lines.push(`  suspect:     layer ${s.layer}, ${s.why}`);
  for (const w of r.warnings ?? []) lines.push(`  look at:     ${w.text}`);
  if (r.faulty?.length) lines.push(`  alone under: ${r.faulty.map((l) => `layer ${l}`).join(', ')} (each fails the shipped threshold by itself)`);
  if (r.trials.length) {
    lines.push(`  fixes tried (rebuilt through the ${r.simFault ? 'emulation' : r.runtime?.divergence ? 'parity' : 'oracle'} gate${r.drift?.first ? ', the chain scanned again' : ''}):`);
    for (const t of r.trials) lines.push(`    ${t.ok ? '✓' : '✗'} ${t.label.padEnd(40)} ${cost(t).padStart(10)}  ${r.simFault ? 'simulator' : 'shipped'} min cosine ${cos(t.minCosine)}${t.ok ? '' : `  (${t.stillFails ?? t.error ?? 'failed'})`}`);
  }
  if (r.fixes.length) lines.push(`  ranked by cost: ${r.fixes.map((t, i) => `${i + 1}. ${t.label} (${cost(t)})`).join('; ')}`);
  if (r.chosen) lines.push(`  the fix:     ${fixChanges(r.chosen, r.arch).join('; ')}${r.applied ? ` (written into ${r.applied.file})` : ' (--apply writes it into the recipe)'}`);
  lines.push(`  ${r.seconds.toFixed(1)} s; the oracle build: ${r.build.stages.map((s) => `${s.name} ${s.status}`).join(', ')}`);
  return lines.join('\n');
}

/** `wrap`: the columns holding long names (ops, tensors, scopes), which may break anywhere so the table fits the page. */
interface Table { head: string[]; rows: string[][]; wrap?: number[] }

function table({ head, rows, wrap = [] }: Table): string {
  const cls = (c: string, i: number) => [c === '✗' ? 'fail' : '', wrap.includes(i) ? 'name' : ''].filter(Boolean).join(' ');
  return `<table><thead><tr>${head.map((h) => `<th>${esc(h)}</th>`).join('')}</tr></thead><tbody>\n${rows.map((row) => `<tr>${row.map((c, i) => `<td${cls(c, i) ? ` class="${cls(c, i)}"` : ''}>${esc(c)}</td>`).join('')}</tr>`).join('\n')}\n</tbody></table>`;
}

/** Each traced case's cosine (x: case in trace order), the threshold as a line: where the shipped graph leaves it. */
function stepPlot(cases: StepCosine[], threshold: number, first?: StepCosine): string {
  if (!cases.length) return '';
  const W = 640, H = 220, L = 52, B = 28, T = 10;
  const finite = cases.map((c) => Math.max(c.cosine, 0));
  const lo = Math.min(threshold, ...finite) - 0.01, hi = 1;
  const x = (i: number) => L + ((W - L - 10) * i) / Math.max(1, cases.length - 1);
  const y = (v: number) => T + (H - T - B) * (1 - (v - lo) / (hi - lo));
  const dots = cases.map((c, i) => `<circle cx="${x(i).toFixed(1)}" cy="${y(Math.max(c.cosine, 0)).toFixed(1)}" r="2" fill="${c.cosine < threshold ? '#d62728' : '#1f77b4'}"><title>prompt ${c.prompt} step ${c.step}: ${esc(c.output)} ${c.cosine.toFixed(5)}</title></circle>`);
  const fi = first ? cases.indexOf(first) : -1;
  const mark = fi >= 0 ? `<line x1="${x(fi)}" x2="${x(fi)}" y1="${T}" y2="${H - B}" stroke="#d62728" stroke-dasharray="3 3"/><text x="${x(fi) + 4}" y="${T + 12}" font-size="11" fill="#d62728">first: prompt ${first!.prompt} step ${first!.step}</text>` : '';
  const ticks = [lo, (lo + hi) / 2, hi].map((v) => `<text x="${L - 6}" y="${y(v) + 4}" font-size="10" text-anchor="end">${v.toFixed(3)}</text><line x1="${L}" x2="${W - 10}" y1="${y(v)}" y2="${y(v)}" stroke="#eee"/>`);
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" role="img" aria-label="cosine per traced step">${ticks.join('')}`
    + `<line x1="${L}" x2="${W - 10}" y1="${y(threshold)}" y2="${y(threshold)}" stroke="#b00"/><text x="${W - 12}" y="${y(threshold) - 3}" font-size="10" text-anchor="end" fill="#b00">threshold ${threshold}</text>`
    + `${dots.join('')}${mark}<text x="${(W + L) / 2}" y="${H - 4}" font-size="11" text-anchor="middle">traced case (prompt, then step)</text></svg>`;
}

/** Along one prompt's generated steps: HF's margin and the shipped chain's margin for HF's token (negative: it picks another). */
function marginPlot(steps: DriftStep[], first: DriftStep): string {
  const W = 640, H = 220, L = 52, B = 28, T = 10;
  const vals = steps.flatMap((s) => [s.hf.margin, s.shippedMargin]);
  const lo = Math.min(0, ...vals), hi = Math.max(...vals);
  const x = (i: number) => L + ((W - L - 10) * i) / Math.max(1, steps.length - 1);
  const y = (v: number) => T + (H - T - B) * (1 - (v - lo) / (hi - lo || 1));
  const line = (get: (s: DriftStep) => number, color: string) => `<polyline fill="none" stroke="${color}" points="${steps.map((s, i) => `${x(i).toFixed(1)},${y(get(s)).toFixed(1)}`).join(' ')}"/>`;
  const fi = steps.findIndex((s) => s.prompt === first.prompt && s.step === first.step);
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" role="img" aria-label="margins along the continuation">`
    + `<line x1="${L}" x2="${W - 10}" y1="${y(0)}" y2="${y(0)}" stroke="#999"/>${line((s) => s.hf.margin, '#1f77b4')}${line((s) => s.shippedMargin, '#d62728')}`
    + `<line x1="${x(fi)}" x2="${x(fi)}" y1="${T}" y2="${H - B}" stroke="#d62728" stroke-dasharray="3 3"/><text x="${x(fi) + 4}" y="${T + 12}" font-size="11" fill="#d62728">first divergent: step ${first.step}</text>`
    + `<text x="${L}" y="${H - 4}" font-size="11">blue: HF's margin; red: the shipped chain's margin for HF's token (${lo.toFixed(2)} … ${hi.toFixed(2)})</text></svg>`;
}

/** The named layer op by op (quantization link): every paired op in graph order, the one where the cosine drops marked. */
function quantOpHtml(q: NonNullable<BisectResult['quantOp']>): string[] {
  const drop = (o: { cosine: number; inputsCosine: number }) => o.inputsCosine - o.cosine;
  return [`<h2 id="quant-op">Op by op: layer ${q.layer}, fp32 vs ${esc(q.scheme)}</h2>`,
    `<p>Layer ${q.layer} exported alone at fp32 and at the shipped precision, every op's output made a graph output, both fed HF's inputs for the layer on ${q.cases} traced cases; per op the smallest cosine of the shipped output with the fp32 one, and the lowest of its inputs' (a graph input is HF's: 1). A quantized matrix's error enters at its matmul and every later op carries it: the op named is where the cosine drops most below its inputs'${q.drop ? `: <b>${esc(opText(q.drop))}</b>` : ' (none drops)'}.${q.unpaired ? ` ${q.unpaired} ops of the shipped graph have no fp32 counterpart and are not shown.` : ''}</p>`,
    table({
      head: ['node', 'op', 'matrix', 'fp32 node', "inputs' cosine", 'cosine', 'drop', ''],
      rows: q.ops.map((o) => [o.node, o.op, o.matrix ? (o.layer !== null ? shortName(o.matrix, o.layer) : o.matrix) : '', o.fp32Node, cos(o.inputsCosine), cos(o.cosine), drop(o) > 0 ? drop(o).toFixed(5) : '-', o.value === q.drop?.value ? '✗' : o.cosine < q.threshold ? 'under' : '']),
      wrap: [0, 2, 3],
    })];
}

export function bisectHtml(r: BisectResult): string {
  const parts: string[] = [];
  const f = r.fault;
  if (f) {
    parts.push('<h2>First miss</h2>', table({
      head: ['link', 'variant', 'graph', 'layer', 'output', 'cosine', 'threshold', 'worst at', 'first step under'],
      rows: [[f.link, f.variant, f.graph, f.layer === null ? '-' : String(f.layer), `${f.output} (${f.what})`, f.nonFinite ?? (f.top1 ? `top-1 ${f.top1}` : cos(f.cosine)), String(f.threshold), f.worst,
        r.steps?.first ? `prompt ${r.steps.first.prompt} step ${r.steps.first.step} (${r.steps.first.output} ${cos(r.steps.first.cosine)})` : '-']],
      wrap: [4, 7, 8],
    }));
  }
  if (r.steps) parts.push(`<h2>Per traced step: ${esc(r.steps.graph)}, ${esc(r.steps.outputs.join(', '))}</h2>`, `<p>${r.steps.failing} of ${r.steps.cases.length} steps under ${r.steps.threshold}.</p>`, stepPlot(r.steps.cases, r.steps.threshold, r.steps.first));
  if (r.simulator) {
    parts.push('<h2>On the x86 HTP simulator</h2>', `<p>The compiled graphs teacher-forced against HF (fp16 ${r.simulator.fp16}, threshold ${r.simulator.threshold}); parity ${r.simulator.parity.ok ? 'holds' : 'fails'}: ${esc(r.simulator.parity.rule)}.</p>`, table({
      head: ['graph', 'min cosine', 'top-1', 'non-finite', ''],
      rows: r.simulator.graphs.map((g) => [g.graph, cos(g.minCosine), g.top1 ?? '-', g.nonFinite ?? '-', g.ok ? '✓' : '✗']),
    }));
  }
  if (r.simFault) {
    const sf = r.simFault;
    parts.push('<h2>First miss on the simulator</h2>', table({ head: ['link', 'graph', 'output', 'cosine', 'threshold', 'worst at'], rows: [[sf.link, sf.graph, sf.output, sf.nonFinite ?? cos(sf.cosine), String(sf.threshold), sf.worst]], wrap: [2, 5] }));
  }
  if (r.op && r.probe) {
    parts.push(`<h2 id="op">Op by op: ${esc(r.op.node)}</h2>`, `<p>A probe variant of ${esc(r.probe.graph)} (every scoped op's output made a graph output) compiled for the simulator and run beside the CPU on ${r.probe.cases.length} traced cases. Named: <b>${esc(r.op.node)}</b> (${esc(r.op.op)}), layer ${r.op.layer ?? '-'}: ${esc(r.op.why)}.</p>`, table({
      head: ['node', 'op', 'inputs max |v| (CPU)', 'max |v| (CPU)', 'max finite |v| (simulator)', 'non-finite', 'at 65504', 'cosine', ''],
      rows: probeRows(r).map((o) => [o.node, o.op, num(o.inputMaxAbs), num(o.cpuMaxAbs), num(o.simMaxAbs), String(o.simNonFinite), String(o.simSaturated), cos(o.cosine), o === r.probe!.first || o.node === r.op!.node ? '✗' : '']),
      wrap: [0],
    }));
  }
  if (r.experts) {
    const x = r.experts, threshold = x.threshold;
    parts.push(`<h2 id="experts">Layer ${x.layer}'s experts</h2>`, `<p>The experts graph runs every layer with the experts the router chose; its cases of layer ${x.layer} (${esc(x.graphs.join(', '))}), one per decode step (a token's two experts together) and per prefill chunk and expert (one expert alone). An expert the shipped precision cannot hold fails every case that reads it; its partners only some.</p>`, table({
      head: ['expert', 'cases that read it', `under ${threshold}`, 'alone', 'alone under', 'lowest cosine', ''],
      rows: x.figures.map((f, i) => [String(f.expert), String(f.cases), String(f.failing), String(f.alone), String(f.aloneFailing), cos(f.minCosine), i === 0 && f.failing ? '✗' : '']),
    }));
  }
  if (r.quantOp) parts.push(...quantOpHtml(r.quantOp));
  else if (r.quantOpError) parts.push('<h2 id="quant-op">Op by op</h2>', `<p class="bad">The op probe failed: ${esc(r.quantOpError)}</p>`);
  const h = r.handoff;
  if (h) {
    parts.push('<h2 id="handoff">Residual hand-offs between contexts</h2>', `<p>Link <b>${h.link}</b>: every graph holds teacher-forced, but the recipe requires f16 hand-offs and the gate refused them for ${esc(h.variant)} (${esc(h.choice.why)}). The shipped one-token graphs chained with float32 and with f16 hand-offs: ${h.boundary ? `the hand-off named is <b>${esc(boundaryText(h.boundary))}</b>` : esc(h.unnamed ?? '')}${h.first ? `; the f16 chain first leaves HF at ${esc(stepText(h.first))}` : ''}.</p>`, table({
      head: ['hand-off', 'from', 'to', 'after layer', 'max |value| (float32 chain)', 'at', 'steps past 65504', ''],
      rows: h.boundaries.map((b) => [b.value, b.from, b.to, b.afterLayer === null ? '-' : String(b.afterLayer), num(b.maxAbs), b.maxAt, `${b.overflowSteps} of ${b.steps}`, b.value === h.boundary?.value ? '✗' : '']),
      wrap: [5],
    }));
  }
  if (r.drift?.first) {
    const d = r.drift, f = d.first!;
    parts.push('<h2 id="drift">Free-running drift</h2>', `<p>The shipped decode graphs chained on the CPU (each shard feeding the next, then the lm-head), fed HF's tokens: until the first step where its choice differs, that is the free-running chain. First divergent token: prompt ${f.prompt} step ${f.step}, HF picks ${f.hf.token} by ${f.hf.margin.toFixed(4)} over ${f.hf.runnerUp}; the shipped chain picks ${f.shippedToken}.</p>`,
      marginPlot(d.steps.filter((x) => x.prompt === f.prompt), f),
      `<p>logit[${f.hf.token}] − logit[${f.shippedToken}] moved ${d.logitDelta!.actual.toFixed(4)}. Direct logit attribution: a residual error through the final norm (linearised at HF's residual) and the difference of the two tokens' lm-head rows. Per layer, its own error (the layer alone at the shipped precision, fed HF's inputs: where the error is made, the ranking) and its increment along the chain (its input's error carried, summing to ${d.logitDelta!.attributed.toFixed(4)}):</p>`,
      table({ head: ['layer', 'own (alone)', 'along the chain', ''], rows: d.layers!.map((l) => [String(l.layer), l.contribution.toFixed(5), l.carried === undefined ? '-' : l.carried.toFixed(5), l.contribution < 0 ? 'away from HF\'s token' : 'toward it']) }));
  }
  for (const [title, x] of [['The native runtime on this CPU', r.runtime], ['The device', r.device]] as const) {
    if (!x) continue;
    const d = x.divergence;
    parts.push(`<h2>${title}</h2>`, `<p>The parity gate on ${esc(x.parity.target)}: the runtime teacher-forced on HF's greedy tokens with its own KV cache and host code; ${x.parity.matched}/${x.parity.total} before the first mismatch, ${x.parity.mismatches} mismatches, ${x.parity.ties} ties: ${x.parity.holds ? 'holds' : 'fails'}.</p>`,
      ...(d ? [`<p>${esc(divergenceText(d, x.parity.target))}.</p>`] : []));
  }
  if (r.device) parts.push(`<p>${esc(r.device.note)}.</p>`);
  const alone = new Map((r.alone ?? []).map((a) => [a.layer, a]));
  if (r.layers.length) parts.push('<h2>Per layer along the chain</h2>', `<p>Smallest cosine over each layer's outputs (residual, K/V rows), teacher-forced per graph: fp32 export (threshold ${r.thresholds.fp32}) and shipped ${esc(r.thresholds.quant)} (threshold ${r.thresholds.shipped})${r.alone ? '; and the layer exported and gated alone at the shipped precision, fed HF\'s inputs' : ''}.</p>`, table({
    head: ['layer', 'fp32', 'shipped', 'shipped worst output', ...(r.alone ? ['shipped, layer alone'] : []), ''],
    rows: r.layers.map((l) => {
      const bad = (l.fp32 ?? 1) < r.thresholds.fp32 || (l.shipped ?? 1) < r.thresholds.shipped;
      const a = alone.get(l.layer);
      return [String(l.layer), l.fp32 === undefined ? '-' : l.fp32.toFixed(7), cos(l.shipped), l.shippedWorst ?? '-', ...(r.alone ? [a ? (a.nonFinite ? 'non-finite' : cos(a.cosine)) : '-'] : []), bad ? '✗' : '✓'];
    }),
  }));
  if (r.suspects?.length) parts.push('<h2>Suspects</h2>', `<ul>${r.suspects.map((s) => `<li>layer ${s.layer}: ${esc(s.why)}</li>`).join('')}</ul>`);
  if (r.trials.length) {
    parts.push('<h2 id="fixes">Fixes tried</h2>', '<p>Each rebuilt through the gate that failed (oracle, or emulation for an fp16 fix) with the recipe\'s cached stages and the change below; ranked among those that restore it by cost: weight bytes added, then ops added, then hand-off bytes per token.</p>', table({
      head: ['rank', 'fix', 'changes', 'cost', r.simulator ? 'simulator min cosine' : 'shipped min cosine', 'gate', 'still fails at', 'seconds'],
      rows: r.trials.map((t) => [t.ok ? String(r.fixes.findIndex((x) => x.label === t.label) + 1) : '-', t.label, fixChanges(t, r.arch).join('; '), fixCost(t), cos(t.minCosine), t.ok ? '✓' : '✗', t.stillFails ?? t.error ?? '', t.seconds.toFixed(1)]),
      wrap: [1, 2, 6],
    }));
  }
  if (r.chosen) {
    // The tensors the fix moves, by name; the recipe's override lines (escaped patterns) are in bisect.json and summary.txt.
    const c = r.chosen;
    parts.push('<h2 id="override">The fix for the recipe</h2>', table({
      head: ['changes', 'from', 'to'],
      rows: [
        ...c.tensors.map((x) => [x.name, x.from, x.to]),
        ...(c.rescale ?? []).map((x) => [`ops under ${patternText(x.match)}`, 'as exported', `rescaled by 2^${Math.log2(x.scale)}${x.why ? ` (${x.why.replace(/^forge bisect: /, '')})` : ''}`]),
        ...(c.equalize ?? []).map((x) => [`expert ${patternText(x.match)}`, 'as in the checkpoint', `channels equalized${x.why ? ` (${x.why.replace(/^forge bisect: /, '')})` : ''}`]),
        ...(c.handoff ? [[`residual hand-off on ${r.arch}`, 'f16', c.handoff]] : []),
      ],
      wrap: [0, 2],
    }), `<p>${r.applied ? `Written into ${esc(r.applied.file)}.` : 'Not written: <code>forge bisect --apply</code> puts it into the recipe.'}</p>`);
  }
  parts.push('<h2>Oracle build</h2>', table({ head: ['stage', 'status', 'seconds'], rows: r.build.stages.map((s) => [s.name, s.status, s.seconds.toFixed(1)]) }));
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width"><title>forge bisect: ${esc(r.recipe)} ${esc(r.arch)}</title>
<style>${CSS}</style>
</head><body>
<h1>forge bisect: ${esc(r.recipe)} for ${esc(r.arch)} (target ${esc(r.target)})</h1>
${boxHtml(verdictBox(r))}
<p id="finding"><b>The finding in full</b> (${r.seconds.toFixed(1)} s): ${esc(r.message)}</p>
<p id="prompts">Traced prompts: ${r.prompts.source === 'recipe' ? `the recipe's gates.prompts (${r.prompts.texts.length})` : r.prompts.source === '--from' ? "the run's prompt ids, as given (shown decoded)" : '--prompt'}:</p>
<ol>${r.prompts.texts.map((t, i) => `<li>${esc(t)}${r.prompts.ids?.[i] ? ` <small>(ids ${esc(r.prompts.ids[i].join(' '))})</small>` : ''}</li>`).join('')}</ol>
${r.from ? `<p id="from">Started from ${esc(fromText(r.from))}.</p>\n` : ''}${r.run ? `<p id="run">The run against HF: ${esc(runDivergenceText(r.run))}.</p>\n` : ''}${parts.join('\n')}
</body></html>
`;
}

// The box's rows: the finding's name, then the value, which may break anywhere (op and file names).
const CSS = `${PAGE_CSS}.facts th{width:9em;white-space:nowrap}.facts td{overflow-wrap:anywhere}#finding{color:#444;font-size:.9em}`;

/** The verdict box: the word, the link and layer, then a row per finding (`th` the name, `td` the value). */
function boxHtml(b: VerdictBox): string {
  return `<section id="verdict" class="card ${b.tone}">
<p class="headline"><span class="verdict">${b.word}</span> ${esc(b.headline)}</p>
<table class="facts"><tbody>
${b.rows.map(([k, v]) => `<tr><th>${esc(k)}</th><td>${esc(v)}</td></tr>`).join('\n')}
</tbody></table>
</section>`;
}

/** Replaces `dir` whole (written beside, then renamed): bisect.json, bisect.html, summary.txt. */
export function writeBisectOutput(dir: string, r: BisectResult): void {
  mkdirSync(dirname(dir), { recursive: true });
  const staging = `${dir}.staging-${process.pid}`;
  rmSync(staging, { recursive: true, force: true });
  mkdirSync(staging);
  writeFileSync(join(staging, BISECT_JSON), JSON.stringify(r, null, 2) + '\n');
  writeFileSync(join(staging, BISECT_HTML), bisectHtml(r));
  writeFileSync(join(staging, 'summary.txt'), summaryText(r) + '\n');
  rmSync(dir, { recursive: true, force: true });
  renameSync(staging, dir);
}
