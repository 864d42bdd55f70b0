// The nightly's reports: report.md (short enough for a CI job to post as a summary) and a
// self-contained report.html (no scripts, no external assets, like the build report) with one small
// inline SVG trend plot per figure over every nightly.json stored in the out dir's history.
import { formatFigure, type Comparison, type Change } from './compare.js';
import type { ToolchainComparison } from './toolchain-compare.js';
import type { Nightly } from './summary.js';

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
/** "Nines" of a cosine, as in the build report: 0.999 → 3, so a trend near 1 is visible. */
const nines = (c: number) => -Math.log10(Math.max(1 - c, 1e-12));

interface Table { head: string[]; rows: string[][]; flagged?: boolean[] }

function buildsTable(n: Nightly): Table {
  // A queued nightly's builds ran on workers: which one, and whether its job was retried or stalled.
  const queued = n.builds.some((b) => b.queue);
  const worker = (b: Nightly['builds'][number]) => (b.queue ? `${b.queue.worker}${b.queue.attempts > 1 ? ` (attempt ${b.queue.attempts})` : ''}${b.queue.stalled ? ` (stalled ${b.queue.stalled})` : ''}` : '—');
  return {
    head: ['build', 'result', 'stages cached', 'seconds', 'bundle bytes', ...(queued ? ['worker'] : []), 'run record'],
    rows: n.builds.map((b) => [
      b.id, b.ok ? 'ok' : b.infra ? `NOT BUILT (the machines', not the build's): ${b.infra}` : `FAILED: ${b.status}${b.error ? ` — ${b.error}` : ''}`,
      `${b.stages.filter((s) => s.status === 'cached').length}/${b.stages.length}`, b.seconds.toFixed(1),
      formatFigure(b.figures['bundle bytes']), ...(queued ? [worker(b)] : []), b.runRecord ?? '—',
    ]),
    flagged: n.builds.map((b) => !b.ok && !b.infra),
  };
}

const changeRow = (c: Change) => [c.build, c.figure, c.before, c.after, c.flagged ? `REGRESSION: ${c.why ?? ''}` : c.why ?? ''];

function stageTable(n: Nightly, before: Nightly | null): Table {
  const rows: string[][] = [];
  for (const b of n.builds) {
    const prev = new Map((before?.builds.find((p) => p.id === b.id)?.stages ?? []).map((s) => [s.name, s]));
    for (const s of b.stages) {
      const p = prev.get(s.name);
      rows.push([b.id, s.name, p ? `${p.seconds.toFixed(2)} s (${p.status})` : '—', `${s.seconds.toFixed(2)} s (${s.status})`]);
    }
  }
  return { head: ['build', 'stage', 'before', 'after'], rows };
}

/** The tools a reader compares builds by, in this order; any other the builds report follows. */
const TOOL_ORDER = ['toolchain', 'onnxruntime-qnn', 'qairt', 'qairt-sdk', 'onnxruntime', 'onnx', 'transformers', 'torch', 'tokenizers', 'safetensors', 'onnxruntime-node', 'node', 'python-env'];

/** Every build's tool versions, one row per build (a toolchain build's onnxruntime-qnn and QAIRT are its own). */
function toolsTable(n: Nightly): Table {
  const all = new Set(n.builds.flatMap((b) => Object.keys(b.tools)));
  const cols = [...TOOL_ORDER.filter((t) => all.has(t)), ...[...all].filter((t) => !TOOL_ORDER.includes(t)).sort()];
  return { head: ['build', ...cols], rows: n.builds.map((b) => [b.id, ...cols.map((c) => b.tools[c] ?? '—')]) };
}

function toolChanges(cmp: Comparison): string[] {
  return cmp.tools.length ? cmp.tools.map((t) => `${t.build}: ${t.tool} ${t.before} → ${t.after}`) : ['No tool version changed since the previous nightly.'];
}

const toolchainHead = (c: ToolchainComparison) => ['figure', c.base.toolchain, c.other.toolchain, 'change', 'flagged'];
const toolchainTitle = (c: ToolchainComparison) => `${c.group}: ${c.base.toolchain} vs ${c.other.toolchain}`;
const toolchainTools = (c: ToolchainComparison) =>
  c.tools.length ? `Tools that differ: ${c.tools.map((t) => `${t.tool} ${t.base} → ${t.other}`).join(', ')}.` : 'No tool version differs.';
function toolchainTable(c: ToolchainComparison): Table {
  return {
    head: toolchainHead(c),
    rows: c.rows.map((r) => [r.figure, r.base, r.other, r.change, r.flagged ? `BEYOND THRESHOLD: ${r.why ?? ''}` : '']),
    flagged: c.rows.map((r) => r.flagged),
  };
}
/** Said under the section: what its flags mean for the nightly's verdict. */
const toolchainRule = (n: Nightly) => n.thresholds.failOnToolchainDifference
  ? 'Differences beyond the thresholds count as regressions of this nightly (failOnToolchainDifference).'
  : 'Differences beyond the thresholds are flagged here but do not fail the nightly (set thresholds.failOnToolchainDifference to make them); a failed build does.';

/** What `forge nightly` does not do yet (issue 18): said in every report, not only in docs/nightly.md. */
export const HOW_IT_RUNS = 'Runs the builds one after another on this machine, or with --queue as jobs for `forge worker`s on any number of machines; the stage cache is local, a shared directory, or S3 with --cache (each worker its own --cache); the GitHub workflow .github/workflows/nightly.yml runs one job per build and reports with --from-results.';

function headline(n: Nightly, cmp: Comparison): string {
  const failed = n.builds.filter((b) => !b.ok && !b.infra).length;
  const notBuilt = n.builds.filter((b) => b.infra).length;
  const figs = cmp.regressions.filter((c) => c.figure !== 'build').length;
  if (!failed && !figs) return notBuilt ? `incomplete: ${notBuilt} of ${n.builds.length} builds not built (the machines failed, not the builds), no regression` : `ok: ${n.builds.length} builds, no regression`;
  return `REGRESSION: ${failed ? `${failed} failed build${failed > 1 ? 's' : ''}` : ''}${failed && figs ? ', ' : ''}${figs ? `${figs} regressed figure${figs > 1 ? 's' : ''}` : ''}`;
}

function intro(n: Nightly): string {
  return `Started ${n.startedAt}, ${n.seconds.toFixed(1)} s; matrix ${n.matrix}. ${n.comparedWith ? `Compared with ${n.comparedWith}.` : 'No earlier nightly to compare with: every figure is new.'}`;
}

function mdTable(t: Table): string[] {
  const cell = (c: string) => c.replace(/\|/g, '\\|').replace(/\n/g, ' ');
  return [`| ${t.head.join(' | ')} |`, `|${t.head.map(() => '---').join('|')}|`, ...t.rows.map((r) => `| ${r.map(cell).join(' | ')} |`), ''];
}

export function nightlyMarkdown(n: Nightly, before: Nightly | null, cmp: Comparison): string {
  const head = ['build', 'figure', 'before', 'after', 'why'];
  const parts = [`# forge nightly${n.name ? `: ${n.name}` : ''}`, '', `**${headline(n, cmp)}**`, '', intro(n), ''];
  parts.push('## Regressions', '');
  if (cmp.regressions.length) parts.push(...mdTable({ head, rows: cmp.regressions.map(changeRow) }));
  else parts.push('None.', '');
  parts.push('## Builds', '', ...mdTable(buildsTable(n)));
  if (cmp.dropped.length) parts.push(`Not in this matrix any more (not compared): ${cmp.dropped.join(', ')}.`, '');
  parts.push('## Figures', '', ...mdTable({ head, rows: cmp.changes.filter((c) => c.figure !== 'build').map(changeRow) }));
  if (cmp.toolchains.length) {
    parts.push('## Toolchain comparison', '', toolchainRule(n), '');
    for (const c of cmp.toolchains) parts.push(`### ${toolchainTitle(c)}`, '', toolchainTools(c), '', ...mdTable(toolchainTable(c)));
  }
  parts.push('## Stage times (shown, not flagged)', '', ...mdTable(stageTable(n, before)));
  parts.push('## Tool versions', '', ...mdTable(toolsTable(n)), ...toolChanges(cmp).map((l) => `- ${l}`), '', `_${HOW_IT_RUNS}_`, '');
  return parts.join('\n');
}

const fmtAxis = (v: number) => (Number.isInteger(v) ? String(v) : v.toPrecision(7));

/**
 * A small plot of one figure over the stored nightlies (oldest left, this run the last point, in
 * red when it regressed). Cosines are plotted as nines; a dashed line marks a cosine's threshold.
 */
export function trendPlot(label: string, points: Array<{ at: string; value: number }>, opts: { cosine?: boolean; threshold?: number; flagged?: boolean } = {}): string {
  if (!points.length) return '';
  const W = 220, H = 56, L = 4, R = 4, T = 6, B = 6;
  const tf = (v: number) => (opts.cosine ? nines(v) : v);
  const ys = points.map((p) => tf(p.value));
  const th = opts.threshold !== undefined ? tf(opts.threshold) : undefined;
  let lo = Math.min(...ys, ...(th !== undefined ? [th] : []));
  let hi = Math.max(...ys, ...(th !== undefined ? [th] : []));
  if (hi - lo < 1e-12) { lo -= 1; hi += 1; } // a flat series sits in the middle
  const x = (i: number) => L + (points.length === 1 ? (W - L - R) / 2 : ((W - L - R) * i) / (points.length - 1));
  const y = (v: number) => T + (H - T - B) * (1 - (v - lo) / (hi - lo));
  const line = points.length > 1 ? `<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="${ys.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(' ')}"/>` : '';
  const dots = ys.map((v, i) => {
    const last = i === ys.length - 1;
    return `<circle cx="${x(i).toFixed(1)}" cy="${y(v).toFixed(1)}" r="${last ? 3 : 2}" fill="${last && opts.flagged ? '#b00' : '#1f77b4'}"><title>${esc(`${points[i].at}: ${points[i].value}`)}</title></circle>`;
  });
  const thLine = th !== undefined ? `<line x1="${L}" x2="${W - R}" y1="${y(th).toFixed(1)}" y2="${y(th).toFixed(1)}" stroke="#b00" stroke-dasharray="3 2"/>` : '';
  // The range in the figure's own units (not nines), so a flat-looking line still says what it spans.
  const raw = points.map((p) => p.value);
  const [top, bottom] = [Math.max(...raw), Math.min(...raw)];
  const range = `<text x="${L + 2}" y="${T + 3}" font-size="9" fill="#666">${esc(fmtAxis(top))}</text>`
    + (bottom !== top ? `<text x="${L + 2}" y="${H - 1}" font-size="9" fill="#666">${esc(fmtAxis(bottom))}</text>` : '');
  return `<svg xmlns="http://www.w3.org/2000/svg" class="trend" width="${W}" height="${H}" role="img" aria-label="${esc(`trend: ${label}`)}">`
    + `<rect x="0" y="0" width="${W}" height="${H}" fill="#fafafa"/>${thLine}${line}${dots.join('')}${range}</svg>`;
}

function htmlTable(t: Table, id: string, extra?: string[]): string {
  const rows = t.rows.map((r, i) => {
    const cls = t.flagged?.[i] ? ' class="regression"' : '';
    return `<tr${cls}>${r.map((c) => `<td>${esc(c)}</td>`).join('')}${extra ? `<td>${extra[i]}</td>` : ''}</tr>`;
  });
  return `<table id="${id}"><thead><tr>${t.head.map((h) => `<th>${esc(h)}</th>`).join('')}${extra ? '<th>trend</th>' : ''}</tr></thead><tbody>\n${rows.join('\n')}\n</tbody></table>`;
}

/** `history`: every stored nightly of the out dir, oldest first, this one last. */
export function nightlyHtml(n: Nightly, before: Nightly | null, cmp: Comparison, history: Nightly[]): string {
  const head = ['build', 'figure', 'before', 'after', 'why'];
  const regressions = cmp.regressions.length
    ? htmlTable({ head, rows: cmp.regressions.map(changeRow), flagged: cmp.regressions.map(() => true) }, 'regressions')
    : '<p id="regressions">None.</p>';
  const figureRows = cmp.changes.filter((c) => c.figure !== 'build');
  const plots = figureRows.map((c) => {
    const points = history.flatMap((h) => {
      const f = h.builds.find((b) => b.id === c.build)?.figures[c.figure];
      return f ? [{ at: h.startedAt, value: f.value }] : [];
    });
    const now = n.builds.find((b) => b.id === c.build)?.figures[c.figure];
    return trendPlot(`${c.build} ${c.figure}`, points, { cosine: c.kind === 'cosine', threshold: now?.threshold, flagged: c.flagged });
  });
  const figures = htmlTable({ head, rows: figureRows.map(changeRow), flagged: figureRows.map((c) => c.flagged) }, 'figures', plots);
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>forge nightly${n.name ? `: ${esc(n.name)}` : ''}</title>
<style>body{font-family:sans-serif;margin:2em;max-width:90em}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.2em .5em;font-size:.9em}tr.regression td{color:#b00;font-weight:bold}.ok{color:#070}.bad{color:#b00}svg.trend{display:block}</style>
</head><body>
<h1>forge nightly${n.name ? `: ${esc(n.name)}` : ''}</h1>
<p id="result" class="${cmp.regressions.length ? 'bad' : 'ok'}">${esc(headline(n, cmp))}</p>
<p>${esc(intro(n))} Trend plots: ${history.length} stored nightl${history.length === 1 ? 'y' : 'ies'}, oldest left; cosines as nines (−log10(1−cos)), the dashed line the recipe threshold.</p>
<h2>Regressions</h2>
${regressions}
<h2>Builds</h2>
${htmlTable(buildsTable(n), 'builds')}
${cmp.dropped.length ? `<p>Not in this matrix any more (not compared): ${esc(cmp.dropped.join(', '))}.</p>` : ''}
<h2>Figures</h2>
${figures}
${cmp.toolchains.length ? `<h2>Toolchain comparison</h2>\n<p>${esc(toolchainRule(n))}</p>\n${cmp.toolchains.map((c, i) => `<h3>${esc(toolchainTitle(c))}</h3>\n<p>${esc(toolchainTools(c))}</p>\n${htmlTable(toolchainTable(c), `toolchain-${i}`)}`).join('\n')}` : ''}
<h2>Stage times (shown, not flagged)</h2>
${htmlTable(stageTable(n, before), 'stages')}
<h2>Tool versions</h2>
${htmlTable(toolsTable(n), 'tools')}
<ul id="tool-changes">${toolChanges(cmp).map((l) => `<li>${esc(l)}</li>`).join('')}</ul>
<p><em>${esc(HOW_IT_RUNS)}</em></p>
</body></html>
`;
}
