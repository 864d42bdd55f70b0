// The regression rules: each build's figures against the previous nightly's, one row per figure,
// flagged when it crosses a rule of the matrix's thresholds. A failed build is always flagged;
// timings only when the matrix asks (maxSlowdown), since they are noise on a shared machine. A build
// the farm's machines could not run (`infra`) is not the build's failure: shown, not flagged.
import type { Thresholds } from './matrix.js';
import { compareToolchains, toolchainRegressions, type ToolchainComparison } from './toolchain-compare.js';
import type { BuildSummary, Figure, Nightly } from './summary.js';

export interface Change {
  build: string;
  figure: string;
  kind: Figure['kind'] | 'status';
  /** Display strings: '—' where the figure did not exist on that side. */
  before: string;
  after: string;
  flagged: boolean;
  /** Why it is flagged, or what changed when it is not (e.g. 'new'). */
  why?: string;
}

export interface Comparison {
  /** Every figure of every build of this nightly (and figures that disappeared), in build order. */
  changes: Change[];
  regressions: Change[];
  /** Builds of the previous nightly that this matrix does not have: shown, not flagged. */
  dropped: string[];
  /** Tool versions that changed, per build: shown, not flagged (what a new toolchain did is in the figures). */
  tools: Array<{ build: string; tool: string; before: string; after: string }>;
  /** Builds of one recipe × arch with different toolchains, side by side (toolchain-compare.ts). */
  toolchains: ToolchainComparison[];
}

const group = (n: number) => Math.round(n).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ',');

export function formatFigure(f: Figure | undefined): string {
  if (!f) return '—';
  switch (f.kind) {
    case 'cosine': return f.value.toFixed(7);
    case 'matched': return `${f.value}/${f.total ?? '?'}`;
    case 'bytes': return group(f.value);
    case 'seconds': return `${f.value.toFixed(1)} s`;
    case 'ms': return `${f.value.toFixed(3)} ms`;
  }
}

/** Why `after` is a regression against `before` under the thresholds, or null. */
export function regression(name: string, before: Figure | undefined, after: Figure, t: Thresholds): string | null {
  switch (after.kind) {
    case 'cosine':
      if (after.threshold !== undefined && after.value < after.threshold) return `below the recipe threshold ${after.threshold}`;
      if (before && before.value - after.value > t.maxCosineDrop) return `fell by ${(before.value - after.value).toPrecision(3)} (tolerance ${t.maxCosineDrop})`;
      return null;
    case 'matched': {
      if (!before) return null;
      const frac = (f: Figure) => f.value / (f.total || 1);
      return frac(after) < frac(before) ? `fell from ${formatFigure(before)} to ${formatFigure(after)}` : null;
    }
    case 'bytes': {
      if (!before || before.value <= 0) return null;
      const limit = name === 'bundle bytes' ? t.maxBundleGrowth : t.maxContextGrowth;
      const growth = after.value / before.value - 1;
      return growth > limit ? `grew by ${(100 * growth).toFixed(1)}% (tolerance ${(100 * limit).toFixed(1)}%)` : null;
    }
    case 'seconds':
    case 'ms': {
      if (!before || t.maxSlowdown === undefined || before.value <= 0) return null;
      const ratio = after.value / before.value;
      // One second more is the floor for whole-build times: a cached build's 2 s → 5 s is not news.
      if (after.kind === 'seconds' && after.value - before.value < 1) return null;
      return ratio > t.maxSlowdown ? `${ratio.toFixed(2)}× slower (tolerance ${t.maxSlowdown}×)` : null;
    }
  }
}

function compareBuild(after: BuildSummary, before: BuildSummary | undefined, t: Thresholds, changes: Change[]): void {
  const id = after.id;
  const status = (b: BuildSummary | undefined) => (b ? (b.ok ? 'ok' : b.infra ? 'not built' : `${b.status}: ${b.error ?? ''}`) : '—');
  // A build the machines could not run (build-job.ts) says nothing about the build: shown, never a regression.
  const failed = !after.ok && !after.infra;
  changes.push({
    build: id, figure: 'build', kind: 'status', before: status(before), after: status(after),
    flagged: failed, ...(failed ? { why: 'the build failed' } : after.infra ? { why: `not built: ${after.infra}` } : !before ? { why: 'new in this matrix' } : {}),
  });
  for (const [name, f] of Object.entries(after.figures)) {
    const prev = before?.figures[name];
    const why = regression(name, prev, f, t);
    const note = prev?.note !== undefined && f.note !== undefined && prev.note !== f.note ? `${prev.note} → ${f.note}` : undefined;
    changes.push({
      build: id, figure: name, kind: f.kind, before: formatFigure(prev), after: formatFigure(f), flagged: why !== null,
      ...(why ? { why: note ? `${why}; ${note}` : why } : note ? { why: note } : before && !prev ? { why: 'new figure' } : {}),
    });
  }
  // A figure that disappeared from a build that still succeeded: a gate no longer runs, a context
  // was merged. Shown; a failed build is flagged above already.
  for (const [name, prev] of Object.entries(before?.figures ?? {})) {
    if (name in after.figures || !after.ok) continue;
    changes.push({ build: id, figure: name, kind: prev.kind, before: formatFigure(prev), after: '—', flagged: false, why: 'not measured this time' });
  }
}

export function compareNightlies(after: Pick<Nightly, 'builds' | 'thresholds'>, before: Pick<Nightly, 'builds'> | null): Comparison {
  const changes: Change[] = [];
  const prev = new Map((before?.builds ?? []).map((b) => [b.id, b]));
  const tools: Comparison['tools'] = [];
  for (const b of after.builds) {
    const p = prev.get(b.id);
    compareBuild(b, p, after.thresholds, changes);
    for (const [tool, v] of Object.entries(b.tools)) {
      const was = p?.tools[tool];
      if (was !== undefined && was !== v) tools.push({ build: b.id, tool, before: was, after: v });
    }
  }
  const now = new Set(after.builds.map((b) => b.id));
  const toolchains = compareToolchains(after.builds, after.thresholds);
  const regressions = [...changes.filter((c) => c.flagged), ...toolchainRegressions(toolchains, after.thresholds)];
  return { changes, regressions, dropped: [...prev.keys()].filter((id) => !now.has(id)), tools, toolchains };
}
