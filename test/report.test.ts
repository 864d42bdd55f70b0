import { describe, it, expect } from 'vitest';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { pathToFileURL } from 'node:url';
import { reportHtml, reportMarkdown, cosinePlot } from '../src/bundle/report.js';
import { dumpDom } from '../src/toolchain/chromium.js';
import type { RunRecord } from '../src/engine/record.js';
import type { OracleRow } from '../src/gates/oracle.js';

const record: RunRecord = {
  recipe: 'tiny-qwen3', arch: 'v81', ok: false, status: 'failed', error: 'oracle: gate oracle failed',
  stages: [{ name: 'fetch', status: 'cached', seconds: 0.01, peakRssBytes: null, peakPrivateBytes: null, peakMappedBytes: null }, { name: 'oracle', status: 'ran', seconds: 1.5, peakRssBytes: 150e6, peakPrivateBytes: 120e6, peakMappedBytes: 30e6, predicted: { privateBytes: 400e6, mappedBytes: 100e6, how: 'a fixed figure' } }],
  gates: { oracle: { ok: false, graphs: { 'quantize:w8/shard0.decode': { minCosine: 0.9123, ok: false } } as any } },
  summaries: {}, tools: { torch: '2.15.0' }, bundle: null, buildDir: '/x/build', seconds: 2.5,
};
const row = (layer: number, cos: number, ok = true): OracleRow => ({ variant: 'quantize:w8', graph: 'shard0.decode', layer: String(layer), output: `h.${layer + 1}`, what: 'residual out', minCosine: cos, maxAbs: 0.1, worst: 'prompt 0 step 1', ok });
const rows = [row(0, 0.9999), row(1, 0.9998), row(2, 0.9123, false)];

describe('build report', () => {
  it('renders as a person sees it in Chromium: the gate table shows the failed gate', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-report-'));
    const file = join(dir, 'report.html');
    writeFileSync(file, reportHtml({ record, oracleRows: rows }));
    const dom = await dumpDom(pathToFileURL(file).href, join(dir, 'chromium-profile'));
    const gates = /<table id="gates">([\s\S]*?)<\/table>/.exec(dom)?.[1] ?? '';
    expect(gates).toMatch(/<td>oracle<\/td><td class="fail">FAIL<\/td>/);
    expect(gates).toMatch(/quantize:w8\/shard0.decode: cos 0.9123000 FAIL/);
    const oracle = /<table id="oracle">([\s\S]*?)<\/table>/.exec(dom)?.[1] ?? '';
    expect(oracle.match(/<tr>/g)!.length).toBe(1 + rows.length);
    expect(dom).toMatch(/<svg[^>]*aria-label="per-layer cosine"/);
    expect(dom).toContain('FAILED: oracle: gate oracle failed');
  });

  it('escapes what it did not write itself', () => {
    const html = reportHtml({ record: { ...record, error: '<script>alert(1)</script>' } });
    expect(html).not.toContain('<script>alert');
    expect(html).toContain('&lt;script&gt;');
  });

  it('plots one series per graph, one point per layer', () => {
    const svg = cosinePlot([...rows, { ...row(0, 0.99999), graph: 'shard0.prefill' }]);
    expect(svg.match(/<polyline/g)!.length).toBe(2);
    expect(/points="([^"]+)"/.exec(svg)![1].split(' ')).toHaveLength(3);
  });

  it('writes the same tables in markdown', () => {
    const md = reportMarkdown({ record, oracleRows: rows });
    expect(md).toContain('| oracle | FAIL |');
    expect(reportMarkdown({ record: { ...record, gatesNotRun: { emulation: 'tiny recipes only' } } })).toContain('| emulation | not run | tiny recipes only |');
    expect(md).toContain('| quantize:w8 | shard0.decode | 2 | h.3 (residual out) | 0.9123000 |');
  });
});
