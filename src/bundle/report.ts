// The build report: report.md and a static report.html (no scripts, no external assets). It opens
// with a summary card (verdict, gates against thresholds, precision, sizes: summary.ts), then the
// per-layer cosine plot (inline SVG), the gate table (gate-rows.ts), stage timings, cache hits and
// context sizes against the arch ceiling. Everything shown comes from the run record and the gate
// outputs of that build; every cell is written for a person (no objects dumped as JSON).
import type { RunRecord } from '../engine/record.js';
import { formatBytes, mb } from '../units.js';
import type { OracleRow } from '../gates/oracle.js';
import type { ShardPlan } from '../plan/shards.js';
import { errorTable, fmtMargin, type Confidence } from './confidence.js';
import { countsText, type PrecisionRow } from './precision-map.js';
import { gateRows } from './gate-rows.js';
import { summary, type Summary } from './summary.js';
import { recipeOracleThreshold } from './verdict.js';
import { PAGE_CSS } from './page-style.js';

export interface ReportInput {
  record: RunRecord;
  oracleRows?: OracleRow[];
  plan?: ShardPlan;
  /** Compiled context sizes, when a compile stage ran. */
  contexts?: Array<{ name: string; bytes: number }>;
  /** HF's margins along the traced continuations beside each precision's largest logit error (when the trace and oracle ran). */
  confidence?: Confidence;
  /** The shipped graphs' matrices per layer and precision, with why (when the quantize export ran). */
  precision?: PrecisionRow[];
  /** The oracle's threshold per variant; default: the recipe's, as the build used it. */
  oracleThreshold?: (label: string, scheme: string) => number | undefined;
}

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
/** "Nines" of a cosine: 0.999 → 3. Readable on one axis from 0.99 to 0.9999999. */
const nines = (c: number) => -Math.log10(Math.max(1 - c, 1e-12));

interface Table { head: string[]; rows: string[][] }

/** A token's text as a person reads it: in quotes, a newline or tab shown as \n or \t. */
const quoted = (t: string) => `“${t.replace(/\n/g, '\\n').replace(/\t/g, '\\t')}”`;

function tables(input: ReportInput): Array<{ title: string; table: Table }> {
  const r = input.record;
  const out: Array<{ title: string; table: Table }> = [];
  out.push({
    title: 'Gates',
    table: {
      head: ['gate', 'verdict', 'figure', 'threshold', 'detail'],
      rows: gateRows(r, input.oracleThreshold).map((g) => [g.gate, g.verdict, g.figure, g.threshold, g.detail]),
    },
  });
  if (input.confidence) {
    const c = input.confidence;
    const m = c.margins;
    const s = m.smallest;
    out.push({
      title: 'Confidence: Hugging Face fp32 top-1 − top-2 logit margins along the traced greedy continuations',
      table: {
        head: ['steps', 'min', 'p5', 'median', 'max', `below ${fmtMargin(m.fp16_spacing)} (2⁻⁸)`, 'below 0.1', 'smallest at'],
        rows: [[String(m.count), fmtMargin(m.min), fmtMargin(m.p5), fmtMargin(m.p50), fmtMargin(m.max), String(m.below_fp16_spacing), String(m.below_0_1),
          `prompt ${s.prompt} step ${s.step}: ${s.token} ${quoted(s.token_text)} over ${s.runner_up} ${quoted(s.runner_up_text)}`]],
      },
    });
    out.push({ title: 'Confidence: largest logit error per precision, teacher-forced (a margin below twice the error is a near-tie)', table: errorTable(c) });
  }
  if (input.oracleRows?.length) {
    out.push({
      title: 'Oracle gate, per layer (teacher-forced cosine against HF fp32)',
      table: {
        head: ['variant', 'graph', 'layer', 'output', 'min cosine', 'max abs err', 'worst at', 'ok'],
        rows: input.oracleRows.map((x) => [x.variant, x.graph, x.layer, `${x.output} (${x.what})`, x.minCosine.toFixed(7), x.maxAbs.toExponential(2), x.worst, x.ok ? 'pass' : 'FAIL']),
      },
    });
  }
  if (input.precision?.length) {
    const auto = input.precision.some((r) => r.w4Cosine !== undefined);
    out.push({
      title: 'Precision map: the shipped matrices per layer (auto: each layer alone at w4 and as shipped, teacher-forced cosine)',
      table: {
        head: ['layer', 'matrices', ...(auto ? ['alone at w4', 'as shipped'] : []), 'why'],
        rows: input.precision.map((r) => [r.layer === '-' ? 'lm-head' : r.layer, countsText(r.counts), ...(auto ? [r.w4Cosine?.toFixed(5) ?? '-', r.cosine?.toFixed(5) ?? '-'] : []), r.why.join('; ') || '-']),
      },
    });
  }
  if (input.plan) {
    const p = input.plan;
    const rows = p.shards.map((s) => [`shard${s.index} (layers ${s.first}-${s.last})`, mb(s.weightBytes), mb(p.ceilingBytes), `${((100 * s.weightBytes) / p.ceilingBytes).toFixed(0)}%`]);
    if (p.lmHead.placement === 'separate') rows.push(['lm_head', mb(p.lmHead.bytes), mb(p.ceilingBytes), `${((100 * p.lmHead.bytes) / p.ceilingBytes).toFixed(0)}%`]);
    out.push({ title: `Planned weight bytes per context vs the ${p.arch} ceiling`, table: { head: ['context', 'weights (plan)', 'ceiling', 'of ceiling'], rows } });
  }
  if (input.contexts?.length) {
    const ceiling = input.plan?.ceilingBytes;
    out.push({
      title: 'Compiled context binaries',
      table: { head: ['context', 'bytes', 'of ceiling'], rows: input.contexts.map((c) => [c.name, mb(c.bytes), ceiling ? `${((100 * c.bytes) / ceiling).toFixed(0)}%` : '-']) },
    });
  }
  out.push({
    title: 'Stages',
    table: {
      head: ['stage', 'status', 'seconds', 'queued', 'peak RSS', 'peak private', 'peak mapped', 'read through page faults', 'predicted (private + mapped)'],
      rows: r.stages.map((s) => [
        s.name, s.status, s.seconds.toFixed(2), s.queuedSeconds ? s.queuedSeconds.toFixed(2) : '', s.peakRssBytes === null ? '(not run here)' : mb(s.peakRssBytes),
        s.peakPrivateBytes == null ? '' : mb(s.peakPrivateBytes), s.peakMappedBytes == null ? '' : mb(s.peakMappedBytes),
        s.diskReadBytes === undefined ? '' : `${mb(s.diskReadBytes)}${s.evicted ? ' (EVICTED: its working set did not stay in memory)' : ''}`,
        s.predicted ? `${mb(s.predicted.privateBytes)} + ${mb(s.predicted.mappedBytes)}${s.overPrediction ? ' (EXCEEDED)' : ''}` : '',
      ]),
    },
  });
  return out;
}

/** One polyline per (variant, graph) over layers: the minimum cosine of each layer's residual output. */
export function cosinePlot(rows: OracleRow[]): string {
  const series = new Map<string, Array<[number, number]>>();
  for (const r of rows) {
    if (r.what !== 'residual out') continue;
    const key = `${r.variant} ${r.graph}`;
    series.set(key, [...(series.get(key) ?? []), [Number(r.layer), nines(r.minCosine)]]);
  }
  if (!series.size) return '';
  const W = 640, H = 240, L = 48, B = 28, T = 10;
  const pts = [...series.values()].flat();
  const maxX = Math.max(1, ...pts.map((p) => p[0]));
  const maxY = Math.ceil(Math.max(6, ...pts.map((p) => p[1])));
  const x = (v: number) => L + ((W - L - 10) * v) / maxX;
  const y = (v: number) => T + (H - T - B) * (1 - v / maxY);
  const colors = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b'];
  const lines = [...series.entries()].map(([name, p], i) => {
    const c = colors[i % colors.length];
    const sorted = p.sort((a, b) => a[0] - b[0]);
    return `<polyline fill="none" stroke="${c}" stroke-width="2" points="${sorted.map(([a, b]) => `${x(a).toFixed(1)},${y(b).toFixed(1)}`).join(' ')}"><title>${esc(name)}</title></polyline>`
      + `<text x="${W - 200}" y="${T + 14 * (i + 1)}" fill="${c}" font-size="11">${esc(name)}</text>`;
  });
  const yTicks = Array.from({ length: maxY + 1 }, (_, v) => `<text x="${L - 6}" y="${y(v) + 4}" font-size="10" text-anchor="end">${v}</text><line x1="${L}" x2="${W - 10}" y1="${y(v)}" y2="${y(v)}" stroke="#eee"/>`);
  const xTicks = Array.from({ length: maxX + 1 }, (_, v) => `<text x="${x(v)}" y="${H - B + 14}" font-size="10" text-anchor="middle">${v}</text>`);
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" role="img" aria-label="per-layer cosine">`
    + `${yTicks.join('')}${xTicks.join('')}`
    + `<text x="12" y="${T + (H - B) / 2}" font-size="11" transform="rotate(-90 12 ${T + (H - B) / 2})" text-anchor="middle">nines of cosine (−log10(1−cos))</text>`
    + `<text x="${(W + L) / 2}" y="${H - 2}" font-size="11" text-anchor="middle">layer</text>${lines.join('')}</svg>`;
}

/** The run's time and cache reuse, after the verdict. */
const runFacts = (r: RunRecord) => `${r.seconds.toFixed(1)} s; ${r.stages.filter((s) => s.status === 'cached').length} of ${r.stages.length} stages reused from the cache${digestFacts(r)}`;

/** The local checkpoint's digest, when it read anything: its seconds are in no stage's. */
const digestFacts = (r: RunRecord) => {
  const d = r.checkpointDigest;
  return d && d.hashedFiles ? `; the local checkpoint's content digest read ${d.hashedFiles} of ${d.files} files (${formatBytes(d.hashedBytes)}) in ${d.seconds.toFixed(1)} s` : '';
};

function cardMarkdown(s: Summary, r: RunRecord): string[] {
  const lines = [`**${s.verdict}**: ${s.headline} (${runFacts(r)})`, ''];
  if (s.gates.length) {
    lines.push('| gate | verdict | figures against thresholds |', '|---|---|---|');
    for (const g of s.gates) lines.push(`| ${g.name} | ${g.verdict} | ${g.text.replace(/\|/g, '\\|')} |`);
    lines.push('');
  }
  if (s.precision.length) lines.push(`- Precision: ${s.precision.join('; ')}`);
  if (s.sizes.length) lines.push(`- Size: ${s.sizes.join('; ')}`);
  return [...lines, ''];
}

function cardHtml(s: Summary, r: RunRecord): string {
  const cls = s.verdict === 'PASS' ? 'pass' : s.verdict === 'PARTIAL' ? 'partial' : 'fail';
  const gates = s.gates.map((g) => `<tr><td>${esc(g.name)}</td><td class="${g.verdict === 'FAIL' ? 'fail' : g.verdict === 'pass' ? 'ok' : ''}">${esc(g.verdict)}</td><td>${esc(g.text)}</td></tr>`).join('\n');
  const facts = [['Precision', s.precision], ['Size', s.sizes]].filter(([, v]) => v.length).map(([k, v]) => `<p><b>${k}:</b> ${esc((v as string[]).join('; '))}</p>`);
  return `<section id="summary" class="card ${cls}">
<p class="headline"><span class="verdict">${s.verdict}</span> ${esc(s.headline)} <span class="muted">(${esc(runFacts(r))})</span></p>
${s.gates.length ? `<table class="gates"><thead><tr><th>gate</th><th>verdict</th><th>figures against thresholds</th></tr></thead><tbody>\n${gates}\n</tbody></table>` : ''}
${facts.join('\n')}
</section>`;
}

/** The recipe's oracle thresholds are read once per report (the card and the gate table both show them). */
const withThresholds = (input: ReportInput): ReportInput => ({ ...input, oracleThreshold: input.oracleThreshold ?? recipeOracleThreshold(input.record.recipe) });

export function reportMarkdown(given: ReportInput): string {
  const input = withThresholds(given);
  const r = input.record;
  const parts = [`# forge build report: ${r.recipe} for ${r.arch}`, '', ...cardMarkdown(summary(input), r)];
  for (const { title, table } of tables(input)) {
    parts.push(`## ${title}`, '', `| ${table.head.join(' | ')} |`, `|${table.head.map(() => '---').join('|')}|`);
    for (const row of table.rows) parts.push(`| ${row.map((c) => c.replace(/\|/g, '\\|')).join(' | ')} |`);
    parts.push('');
  }
  parts.push('## Tools', '', ...Object.entries(r.tools).map(([k, v]) => `- ${k} ${v}`), '');
  return parts.join('\n');
}

export function reportHtml(given: ReportInput): string {
  const input = withThresholds(given);
  const r = input.record;
  const body = tables(input).map(({ title, table }) => {
    const id = title.toLowerCase().startsWith('gates') ? ' id="gates"' : title.toLowerCase().startsWith('oracle') ? ' id="oracle"' : '';
    const rows = table.rows.map((row) => `<tr>${row.map((c) => `<td${c === 'FAIL' ? ' class="fail"' : c === 'pass' ? ' class="ok"' : ''}>${esc(c)}</td>`).join('')}</tr>`).join('\n');
    return `<h2>${esc(title)}</h2>\n<table${id}><thead><tr>${table.head.map((h) => `<th>${esc(h)}</th>`).join('')}</tr></thead><tbody>\n${rows}\n</tbody></table>`;
  });
  const plot = input.oracleRows ? cosinePlot(input.oracleRows) : '';
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width"><title>forge report: ${esc(r.recipe)} ${esc(r.arch)}</title>
<style>${PAGE_CSS}</style>
</head><body>
<h1>forge build report: ${esc(r.recipe)} for ${esc(r.arch)}</h1>
${cardHtml(summary(input), r)}
${plot ? `<h2>Per-layer cosine</h2>\n${plot}` : ''}
${body.join('\n')}
<h2>Tools</h2><ul>${Object.entries(r.tools).map(([k, v]) => `<li>${esc(k)} ${esc(v)}</li>`).join('')}</ul>
</body></html>
`;
}
