// The summary card at the top of report.html and report.md: the verdict, one line per gate with its
// headline figure against its threshold (the build's last screen, verdict.ts), the precision shipped
// and the bundle's sizes. A person reads it without scrolling; the tables below hold the detail.
import type { RunRecord } from '../engine/record.js';
import { sizeText } from '../units.js';
import { countsText, type PrecisionRow } from './precision-map.js';
import { bundleFacts, gateVerdicts, headline, isObj, type GateVerdict } from './verdict.js';

export interface Summary {
  /** The word in the card's corner. */
  verdict: 'PASS' | 'FAIL' | 'PARTIAL' | 'INTERRUPTED';
  /** The build's verdict line (what failed, when it did). */
  headline: string;
  gates: GateVerdict[];
  /** The weights' precision and the residual hand-off between contexts, in words. */
  precision: string[];
  /** The bundle's size, files and contexts, and each context's size. */
  sizes: string[];
}

export interface SummaryInput {
  record: RunRecord;
  precision?: PrecisionRow[];
  contexts?: Array<{ name: string; bytes: number }>;
  oracleThreshold?: (label: string, scheme: string) => number | undefined;
}

const VERDICT = { ok: 'PASS', failed: 'FAIL', partial: 'PARTIAL', interrupted: 'INTERRUPTED' } as const;

function precisionLines(r: RunRecord, rows: PrecisionRow[] | undefined): string[] {
  const out: string[] = [];
  const q = isObj(r.summaries?.quantize) ? r.summaries.quantize : undefined;
  if (q && typeof q.scheme === 'string') out.push(`weights ${q.scheme}`);
  if (rows?.length) {
    const total: Record<string, number> = {};
    for (const row of rows) for (const [s, n] of Object.entries(row.counts)) total[s] = (total[s] ?? 0) + n;
    out.push(`matrices: ${countsText(total)}`);
  }
  const h = isObj(r.summaries?.handoff) ? r.summaries.handoff : undefined;
  if (h && typeof h.dtype === 'string') out.push(`${h.dtype} residual between contexts`);
  return out;
}

function sizeLines(r: RunRecord, contexts: SummaryInput['contexts']): string[] {
  const out: string[] = [];
  const facts = bundleFacts(r);
  if (r.bundle && facts.length) out.push(`bundle ${facts.join(', ')}`);
  else if (!r.bundle) out.push('no bundle made');
  const compiled = contexts ?? (isObj(r.summaries?.compile) && Array.isArray(r.summaries.compile.contexts) ? (r.summaries.compile.contexts as Array<{ name: string; bytes: number }>) : []);
  const listed = compiled.filter((c) => typeof c?.name === 'string' && typeof c?.bytes === 'number');
  if (listed.length) out.push(`contexts: ${listed.map((c) => `${c.name} ${sizeText(c.bytes)}`).join(', ')}`);
  // What a decode step moves (the bundle stage's count from the plan and the graphs), per position.
  const perToken = isObj(r.summaries?.bundle) && isObj(r.summaries.bundle.decodeBytesPerToken) ? Object.entries(r.summaries.bundle.decodeBytesPerToken).filter(([, b]) => typeof b === 'number') : [];
  if (perToken.length) out.push(`per decode token: ${perToken.map(([p, b]) => `${sizeText(b as number)} at position ${p}`).join(', ')}`);
  return out;
}

export function summary(input: SummaryInput): Summary {
  const r = input.record;
  return {
    verdict: VERDICT[r.status] ?? (r.ok ? 'PASS' : 'FAIL'),
    headline: headline(r),
    gates: gateVerdicts(r, input.oracleThreshold),
    precision: precisionLines(r, input.precision),
    sizes: sizeLines(r, input.contexts),
  };
}
