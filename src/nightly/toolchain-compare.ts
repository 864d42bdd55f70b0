// The toolchain comparison: when one nightly builds the same recipe × arch with two (or more)
// compile toolchains, each figure side by side and what changed. The base of a group is its build
// on the main environment (no toolchain pin), else its first build in matrix order. A difference
// beyond the matrix's thresholds is flagged in the section with the same rules as a regression
// against the previous nightly (compare.ts), but counts as a regression of the nightly only when
// the matrix says so (thresholds.failOnToolchainDifference): what a candidate toolchain does worse
// is a finding about the toolchain, not a change to forge. A toolchain build that failed is a
// failed build of the nightly either way.
import { formatFigure, regression, type Change } from './compare.js';
import type { Thresholds } from './matrix.js';
import type { BuildSummary, Figure } from './summary.js';

export interface ToolchainRow {
  figure: string;
  kind: Figure['kind'] | 'status';
  base: string;
  other: string;
  /** The difference as a reader wants it: a cosine's delta, a size's %, a time's ratio; '' when equal. */
  change: string;
  flagged: boolean;
  why?: string;
}

export interface ToolchainComparison {
  /** recipe/arch */
  group: string;
  base: { id: string; toolchain: string };
  other: { id: string; toolchain: string };
  /** Tool versions that differ between the two builds (onnxruntime-qnn, qairt, the toolchain itself). */
  tools: Array<{ tool: string; base: string; other: string }>;
  rows: ToolchainRow[];
}

/** How a build's toolchain is named in the section: its pin, or the main environment's. */
export const toolchainLabel = (b: BuildSummary) => b.toolchain ?? `default (onnxruntime-qnn ${b.tools['onnxruntime-qnn'] ?? '?'})`;

function change(base: Figure | undefined, other: Figure | undefined): string {
  if (!base || !other) return base ? 'not measured' : other ? 'new' : '';
  if (base.value === other.value && base.total === other.total) return '';
  const d = other.value - base.value;
  const sign = d > 0 ? '+' : '';
  switch (other.kind) {
    case 'cosine': return `${sign}${d.toExponential(2)}`;
    case 'matched': return `${base.value}/${base.total ?? '?'} → ${other.value}/${other.total ?? '?'}`;
    case 'bytes': return base.value > 0 ? `${sign}${(100 * d / base.value).toFixed(2)}%` : `${sign}${d}`;
    case 'seconds':
    case 'ms': return base.value > 0 ? `${(other.value / base.value).toFixed(2)}×` : `${sign}${d.toFixed(3)}`;
  }
}

function compareTwo(group: string, base: BuildSummary, other: BuildSummary, t: Thresholds): ToolchainComparison {
  const status = (b: BuildSummary) => (b.ok ? 'ok' : `${b.status}: ${b.error ?? ''}`);
  const rows: ToolchainRow[] = [{
    figure: 'build', kind: 'status', base: status(base), other: status(other), change: base.ok === other.ok ? '' : other.ok ? 'fixed' : 'fails',
    flagged: !other.ok, ...(!other.ok ? { why: 'the build failed' } : {}),
  }];
  const names = [...Object.keys(base.figures), ...Object.keys(other.figures).filter((n) => !(n in base.figures))];
  for (const name of names) {
    const [b, o] = [base.figures[name], other.figures[name]];
    // A whole-build time compares caches more than toolchains (one build reuses the other's stages).
    if (name === 'build seconds') continue;
    const why = o ? regression(name, b, o, t) : null;
    rows.push({ figure: name, kind: (o ?? b).kind, base: formatFigure(b), other: formatFigure(o), change: change(b, o), flagged: why !== null, ...(why ? { why } : {}) });
  }
  const tools = [...new Set([...Object.keys(base.tools), ...Object.keys(other.tools)])].sort()
    .filter((k) => base.tools[k] !== other.tools[k])
    .map((tool) => ({ tool, base: base.tools[tool] ?? '—', other: other.tools[tool] ?? '—' }));
  return { group, base: { id: base.id, toolchain: toolchainLabel(base) }, other: { id: other.id, toolchain: toolchainLabel(other) }, tools, rows };
}

/** Every recipe × arch built with more than one toolchain, each other build against the group's base. */
export function compareToolchains(builds: BuildSummary[], t: Thresholds): ToolchainComparison[] {
  const groups = new Map<string, BuildSummary[]>();
  for (const b of builds) {
    const key = `${b.recipe}/${b.arch}`;
    groups.set(key, [...(groups.get(key) ?? []), b]);
  }
  const out: ToolchainComparison[] = [];
  for (const [group, bs] of groups) {
    if (bs.length < 2) continue;
    const base = bs.find((b) => !b.toolchain) ?? bs[0];
    for (const other of bs) if (other !== base) out.push(compareTwo(group, base, other, t));
  }
  return out;
}

/**
 * The flagged figure rows, as regressions of the nightly, when the matrix counts toolchain
 * differences (failOnToolchainDifference). The failed-build row is left out: compare.ts flags a
 * failed build already.
 */
export function toolchainRegressions(cmp: ToolchainComparison[], t: Thresholds): Change[] {
  if (!t.failOnToolchainDifference) return [];
  return cmp.flatMap((c) => c.rows.filter((r) => r.flagged && r.kind !== 'status').map((r) => ({
    build: c.other.id, figure: `${r.figure} (vs ${c.base.toolchain})`, kind: r.kind as Figure['kind'], before: r.base, after: r.other, flagged: true,
    why: `${r.why ?? ''}; toolchain ${c.other.toolchain} against ${c.base.toolchain}`,
  })));
}
