// report.html and report.md from run records made here (nothing is built): the summary card first,
// the gate table in words, and the page as a person sees it in headless Chromium at 1280 × 900.
import { describe, it, expect } from 'vitest';
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { reportHtml, reportMarkdown, cosinePlot } from '../src/bundle/report.js';
import { gateRows } from '../src/bundle/gate-rows.js';
import type { RunRecord } from '../src/engine/record.js';
import type { OracleRow } from '../src/gates/oracle.js';
import { jsonCells, pageLayout } from './helpers/page-layout.js';

const RULE = 'every step teacher-forced on HF\'s greedy token, the runtime\'s own choice compared with HF\'s at each; any other mismatch fails';
const timings = { load_ms: 98.8, prefill_ms: 40.3, decode_ms_per_token: 1.09, host_overhead_ms_per_token: 0.0066 };

/** A good build as `forge build` records it, with the nested figures the old report dumped as JSON. */
function passing(): RunRecord {
  return {
    recipe: 'tiny-qwen3', arch: 'v81', ok: true, status: 'ok',
    stages: [{ name: 'fetch', status: 'cached', seconds: 0.01, peakRssBytes: null, peakPrivateBytes: null, peakMappedBytes: null }, { name: 'oracle', status: 'ran', seconds: 1.5, peakRssBytes: 150e6, peakPrivateBytes: 120e6, peakMappedBytes: 30e6, predicted: { privateBytes: 400e6, mappedBytes: 100e6, how: 'a fixed figure' } }],
    gates: {
      oracle: {
        ok: true,
        graphs: {
          'export:fp32/shard0.decode': { minCosine: 0.99999912, ok: true },
          'quantize:w8/shard0.decode': { minCosine: 0.99951268, ok: true },
          'quantize:w8/lm_head': { minCosine: 0.9999999, ok: true, top1: '270/270' },
        },
        logitError: { export: 1.12e-5, quantize: 0.2089 },
        logitChain: { export: ['shard0.decode', 'lm_head'], quantize: ['shard0.decode', 'lm_head'] },
        handoff: { quantize: { dtype: 'float16', why: 'f16 hand-offs keep every greedy decision' } },
      },
      parity: {
        ok: true, target: 'host', matched: 256, total: 256, ties: 0, maxTies: 0, rule: RULE,
        variants: {
          export: { ok: true, matched: 128, total: 128, ties: 0, mismatches: 0, logitError: 1.12e-5, tieMargin: 2.24e-5, timings },
          quantize: { ok: true, matched: 128, total: 128, ties: 0, mismatches: 0, logitError: 0.2089, tieMargin: 0.4178, timings },
        },
        mismatches: { count: 0, listed: [] }, firstDivergence: null,
        thresholds: { minMatch: 1, maxTies: 0 },
      },
      emulation: {
        ok: true, ran: true, simulator: 'x86 HTP simulator, soc_model 87 (v81), QAIRT 2.51.0, fp16 true',
        graphs: { 'shard0.decode': { minCosine: 0.99945371, ok: true, msPerCall: 60.6 }, lm_head: { minCosine: 0.9999999, ok: true, top1: '270/270', msPerCall: 10.3 } },
        parity: { ok: true, matched: 128, total: 128, ties: 0, maxTies: 0, mismatches: { count: 0, listed: [] }, logitError: 0.0073, tieMargin: 0.0145, firstDivergence: null, rule: RULE },
        msPerToken: 79.33, prefillMs: 5229.7,
        thresholds: { minCosine: 0.999, minTop1: 1, minMatch: 1, maxTies: 0, tokens: 32 },
      },
    },
    summaries: {
      quantize: { scheme: 'w8', contexts: [{ name: 'shard0', dataBytes: 311552, graphs: 1 }] },
      handoff: { dtype: 'float16', why: 'f16 hand-offs keep every greedy decision', graphs: ['shard0.decode'] },
      compile: { contexts: [{ name: 'shard0', bytes: 577536 }, { name: 'lm_head', bytes: 184320 }] },
      bundle: { files: 11, bytes: 976810 },
    },
    tools: { torch: '2.15.0' }, bundle: '/out/tiny-qwen3/v81', buildDir: '/out/tiny-qwen3/v81/build', seconds: 60,
  };
}

/** The same build with the oracle failed at layer 2 and the later gates not run. */
function failing(): RunRecord {
  const r = passing();
  return {
    ...r, ok: false, status: 'failed', error: 'oracle: gate oracle failed', bundle: null, buildDir: '/x/build',
    gates: { oracle: { ok: false, graphs: { 'export:fp32/shard0.decode': { minCosine: 0.99999912, ok: true }, 'quantize:w8/shard0.decode': { minCosine: 0.9123, ok: false } }, firstMiss: { variant: 'quantize:w8', graph: 'shard0.decode', layer: '2', output: 'h.3', cosine: 0.9123 }, logitError: { export: 1e-5, quantize: 0.9 } } },
    gatesNotRun: { parity: 'the oracle gate failed', emulation: 'the oracle gate failed' },
  };
}

const thresholds = (label: string) => (label === 'export' ? 0.99999 : 0.999);
const row = (layer: number, cos: number, ok = true): OracleRow => ({ variant: 'quantize:w8', graph: 'shard0.decode', layer: String(layer), output: `h.${layer + 1}`, what: 'residual out', minCosine: cos, maxAbs: 0.1, worst: 'prompt 0 step 1', ok });
const rows = [row(0, 0.9999), row(1, 0.9998), row(2, 0.9123, false)];
const tmp = () => mkdtempSync(join(tmpdir(), 'forge-report-'));
const cardOf = (dom: string) => /<section id="summary"[^>]*>([\s\S]*?)<\/section>/.exec(dom)?.[1] ?? '';

describe('build report', () => {
  it('opens with the verdict card, fits 1280 px and shows no JSON in any cell (a passing build, in Chromium)', async () => {
    const html = reportHtml({ record: passing(), oracleRows: rows, oracleThreshold: thresholds });
    const page = await pageLayout(html, tmp(), '#summary');
    // The card is the first thing under the title, and all of it is above the fold.
    expect(page.dom).toMatch(/<\/h1>\s*<section id="summary" class="card pass">/);
    expect(page.bottom).toBeGreaterThan(0);
    expect(page.bottom).toBeLessThanOrEqual(900);
    expect(page.scrollWidth).toBeLessThanOrEqual(1280);
    const card = cardOf(page.dom);
    expect(card).toContain('<span class="verdict">PASS</span> ok: tiny-qwen3 for v81, every gate passed');
    expect(card).toContain('min cosine vs HF fp32: export:fp32 0.9999991 (threshold 0.99999), quantize:w8 0.9995127 (threshold 0.999)');
    expect(card).toContain('<b>Precision:</b> weights w8; float16 residual between contexts');
    expect(card).toContain('<b>Size:</b> bundle 976.8 kB, 11 files, 2 contexts; contexts: shard0 577.5 kB, lm_head 184.3 kB');
    expect(page.cells.length).toBeGreaterThan(30);
    expect(jsonCells(page.cells)).toEqual([]);
    expect(page.dom).toMatch(/<svg[^>]*aria-label="per-layer cosine"/);
  });

  it('names the failure in the card and the failing variant in the gate table (a failing build, in Chromium)', async () => {
    const page = await pageLayout(reportHtml({ record: failing(), oracleRows: rows, oracleThreshold: thresholds }), tmp(), '#summary');
    const card = cardOf(page.dom);
    expect(page.dom).toMatch(/<section id="summary" class="card fail">/);
    expect(card).toContain('<span class="verdict">FAIL</span> FAILED: oracle: gate oracle failed');
    expect(card).toMatch(/<td>parity<\/td><td class="">not run<\/td><td>the oracle gate failed<\/td>/);
    expect(card).toContain('<b>Size:</b> no bundle made');
    expect(page.bottom).toBeLessThanOrEqual(900);
    expect(page.scrollWidth).toBeLessThanOrEqual(1280);
    const gates = /<table id="gates">([\s\S]*?)<\/table>/.exec(page.dom)?.[1] ?? '';
    expect(gates).toContain('<td>oracle quantize:w8</td><td class="fail">FAIL</td><td>min cosine 0.9123000</td><td>≥ 0.999</td>');
    expect(gates).toContain('first miss: shard0.decode layer 2 h.3 at cosine 0.9123000');
    const oracle = /<table id="oracle">([\s\S]*?)<\/table>/.exec(page.dom)?.[1] ?? '';
    expect(oracle.match(/<tr>/g)!.length).toBe(1 + rows.length);
    expect(jsonCells(page.cells)).toEqual([]);
  });

  it('writes nested figures as words: logit errors, tie margins, timings, the simulator', () => {
    const g = gateRows(passing(), thresholds);
    expect(g.map((x) => x.gate)).toEqual(['oracle export:fp32', 'oracle quantize:w8', 'hand-off', 'parity export', 'parity quantize', 'emulation cosine', 'emulation parity']);
    const w8 = g[1];
    expect(w8).toEqual({ gate: 'oracle quantize:w8', verdict: 'pass', figure: 'min cosine 0.9995127', threshold: '≥ 0.999', detail: 'per graph: shard0.decode 0.9995127, lm_head 0.9999999 (top-1 270/270); largest logit error 0.2089.' });
    expect(g[4]).toMatchObject({ figure: '128/128 equal to HF, 0 ties', threshold: '≤ 0 ties, no other mismatch' });
    expect(g[4].detail).toBe('greedy on host, teacher-forced on HF\'s tokens; a mismatch counts as a tie within a logit margin of 0.4178; load 98.8 ms, prefill 40.3 ms, decode 1.09 ms per token.');
    expect(g[5].detail).toBe('On the x86 HTP simulator, soc_model 87 (v81), QAIRT 2.51.0, fp16 activations, against HF; per graph: shard0.decode 0.9994537, 60.6 ms a call; lm_head 0.9999999 (top-1 270/270), 10.3 ms a call.');
    expect(g[6].detail).toBe('greedy on the simulator over 32 tokens a prompt; 79.3 ms per token simulated; prefill 5.23 s simulated.');
    // A gate forge does not know: its plain figures, never its nested ones.
    const other = gateRows({ ...passing(), gates: { size: { ok: true, bytes: 12, nested: { a: 1 } } } }, thresholds);
    expect(other).toEqual([{ gate: 'size', verdict: 'pass', figure: 'bytes 12', threshold: '', detail: '' }]);
    expect(jsonCells(g.flatMap((x) => Object.values(x)))).toEqual([]);
  });

  it('escapes what it did not write itself', () => {
    const html = reportHtml({ record: { ...failing(), error: '<script>alert(1)</script>' }, oracleThreshold: thresholds });
    expect(html).not.toContain('<script>alert');
    expect(html).toContain('FAILED: &lt;script&gt;alert(1)&lt;/script&gt;');
    const md = reportMarkdown({ record: { ...failing(), gatesNotRun: { emulation: 'a | b' } }, oracleThreshold: thresholds });
    expect(md).toContain('| emulation | not run | a \\| b |');
  });

  it('plots one series per graph, one point per layer', () => {
    const svg = cosinePlot([...rows, { ...row(0, 0.99999), graph: 'shard0.prefill' }]);
    expect(svg.match(/<polyline/g)!.length).toBe(2);
    expect(/points="([^"]+)"/.exec(svg)![1].split(' ')).toHaveLength(3);
  });

  it('writes the same card and tables in markdown', () => {
    const md = reportMarkdown({ record: failing(), oracleRows: rows, oracleThreshold: thresholds });
    const lines = md.split('\n');
    expect(lines[2]).toBe('**FAIL**: FAILED: oracle: gate oracle failed (60.0 s; 1 of 2 stages reused from the cache)');
    expect(md).toContain('| parity | not run | the oracle gate failed |');
    expect(md).toContain('| oracle quantize:w8 | FAIL | min cosine 0.9123000 | ≥ 0.999 |');
    expect(md).toContain('| quantize:w8 | shard0.decode | 2 | h.3 (residual out) | 0.9123000 |');
    expect(reportMarkdown({ record: passing(), oracleThreshold: thresholds })).toContain('- Precision: weights w8; float16 residual between contexts');
    expect(md).not.toMatch(/\{"|":/);
  });
});
