// The last screen of `forge build` (issue 36): the verdict per gate against its threshold, the
// bundle and where the report is; the stage table and forge's own diagnostics only with --verbose.
// Run records are made here, as a build writes them: nothing is built.
import { describe, expect, it } from 'vitest';
import type { RunRecord } from '../src/engine/record.js';
import type { StageRecord } from '../src/engine/run.js';
import { recipeOracleThreshold, verdictLines } from '../src/bundle/verdict.js';

const stage = (name: string, status: StageRecord['status'], seconds: number, extra: Partial<StageRecord> = {}): StageRecord => ({
  name, status, seconds, peakRssBytes: null, peakPrivateBytes: null, peakMappedBytes: null, ...extra,
});
const RULE = 'every step teacher-forced on HF\'s greedy token …';
const OVER = 'measured peak over the prediction by more than 25%: private 1.20 GB vs 800.0 MB predicted (×1.50) (predicted from a test figure)';

function record(over: Partial<RunRecord> = {}): RunRecord {
  return {
    recipe: 'tiny-qwen3', arch: 'v81', ok: true, status: 'ok',
    stages: [stage('fetch', 'cached', 0.1), stage('oracle', 'ran', 41.5), stage('compile', 'ran', 12.3, { overPrediction: OVER }), stage('bundle', 'ran', 0.4)],
    gates: {
      oracle: {
        ok: true,
        graphs: {
          'export:fp32/shard0.decode': { minCosine: 0.99999912, ok: true },
          'export:fp32/lm_head': { minCosine: 0.99999995, ok: true, top1: '270/270' },
          'quantize:w8/shard0.prefill': { minCosine: 0.99985121, ok: true },
          'quantize:w8/shard0.decode': { minCosine: 0.99951268, ok: true },
          'quantize:w8/lm_head': { minCosine: 0.99999990, ok: true, top1: '270/270' },
        },
        logitError: { export: 1e-5, quantize: 0.2 },
        handoff: { quantize: { dtype: 'float16', why: 'f16 chain keeps every greedy decision' } },
      },
      parity: {
        ok: true, target: 'host', matched: 256, total: 256, ties: 1, maxTies: 1, rule: RULE,
        variants: {
          export: { ok: true, matched: 128, total: 128, ties: 0, mismatches: 0 },
          quantize: { ok: true, matched: 120, total: 128, ties: 1, mismatches: 1 },
        },
        thresholds: { minMatch: 1, maxTies: 1 },
      },
      emulation: {
        ok: true, ran: true, simulator: 'x86 HTP simulator, soc_model 87 (v81), QAIRT 2.51.0, fp16 true',
        graphs: { 'shard0.decode': { minCosine: 0.99945371, ok: true }, lm_head: { minCosine: 0.9999999, ok: true, top1: '270/270' } },
        parity: { ok: true, matched: 128, total: 128, ties: 0, maxTies: 1, mismatches: { count: 0, listed: [] } },
        msPerToken: 79.33,
        thresholds: { minCosine: 0.999, minTop1: 1, minMatch: 1, maxTies: 1, tokens: 32 },
      },
    },
    gatesRequired: ['oracle', 'parity', 'emulation'],
    summaries: {
      handoff: { dtype: 'float16', why: 'f16 chain keeps every greedy decision', graphs: ['shard0.decode'] },
      compile: { contexts: [{ name: 'shard0', bytes: 577536 }, { name: 'lm_head', bytes: 184320 }] },
      bundle: { files: 11, bytes: 976810 },
    },
    tools: {},
    bundle: '/out/tiny-qwen3/v81',
    buildDir: '/out/tiny-qwen3/v81/build',
    seconds: 60,
    ...over,
  };
}
const thresholds = (label: string) => (label === 'export' ? 0.99999 : 0.999);

describe('the build verdict', () => {
  it("is the last screen of a good build: a line per gate with its figure against its threshold, the bundle's size and contexts, the report", () => {
    expect(verdictLines(record(), { oracleThreshold: thresholds })).toEqual([
      'ok: tiny-qwen3 for v81, every gate passed',
      '  oracle     pass     min cosine vs HF fp32: export:fp32 0.9999991 (threshold 0.99999), quantize:w8 0.9995127 (threshold 0.999)',
      '  hand-off            float16 residual between contexts (f16 chain keeps every greedy decision)',
      '  parity     pass     greedy vs HF on host: export 128/128 equal to HF, 0 ties; quantize 127/128 equal to HF (the first 120 in a row), 1 mismatch (1 tie) (threshold: ≤ 1 tie, no other mismatch)',
      '  emulation  pass     on the x86 HTP simulator: min cosine 0.9994537 at shard0.decode (threshold 0.999), parity 128/128 equal to HF, 0 ties (threshold: ≤ 1 tie, no other mismatch), 79.3 ms/token simulated',
      'bundle: /out/tiny-qwen3/v81 (976.8 kB, 11 files, 2 contexts)',
      'report: /out/tiny-qwen3/v81/build/report.html',
      'run record: /out/tiny-qwen3/v81/build/run.json',
    ]);
  });

  it('keeps the stage times and the memory prediction misses for --verbose, above the verdict', () => {
    const plain = verdictLines(record(), { oracleThreshold: thresholds });
    expect(plain.join('\n')).not.toMatch(/^(fetch|oracle|compile) +(ran|cached)/m);
    expect(plain.join('\n')).not.toContain('measured peak over the prediction');
    const verbose = verdictLines(record(), { oracleThreshold: thresholds, verbose: true });
    expect(verbose.slice(0, 6)).toEqual([
      'fetch        cached    0.1 s',
      'oracle       ran       41.5 s',
      'compile      ran       12.3 s',
      'bundle       ran       0.4 s',
      `memory: compile: ${OVER}`,
      '',
    ]);
    expect(verbose.slice(6)).toEqual(plain); // the verdict stays the last screen
  });

  it('names what failed: the gate, the failing graph and variant, the first miss', () => {
    const r = record({ ok: false, status: 'failed', error: 'oracle: gate oracle failed', bundle: null, buildDir: '/out/tiny-qwen3/v81.incomplete/build' });
    r.gates.oracle = {
      ok: false,
      graphs: { 'export:fp32/shard0.decode': { minCosine: 0.9999995, ok: true }, 'quantize:w8/shard0.decode': { minCosine: 0.5, ok: false }, 'quantize:w8/lm_head': { minCosine: 0.9999, ok: false, top1: '200/270' } },
      firstMiss: { variant: 'quantize:w8', graph: 'shard0.decode', layer: '3', output: 'h.3', cosine: 0.5 },
    };
    r.gates.parity = { ...r.gates.parity, ok: false, variants: { export: { ok: true, matched: 128, total: 128, ties: 0, mismatches: 0 }, quantize: { ok: false, matched: 40, total: 128, ties: 0, mismatches: 9 } } };
    delete r.gates.emulation;
    r.gatesNotRun = { emulation: 'no QAIRT SDK' };
    const lines = verdictLines(r, { oracleThreshold: thresholds });
    expect(lines[0]).toBe('FAILED: oracle: gate oracle failed');
    expect(lines[1]).toBe('  oracle     FAIL     min cosine vs HF fp32: export:fp32 0.9999995 (threshold 0.99999), quantize:w8 0.5000000 (threshold 0.999); '
      + 'failed: quantize:w8/shard0.decode cosine 0.5000000, quantize:w8/lm_head cosine 0.9999000 top-1 200/270; first miss: quantize:w8 shard0.decode layer 3 h.3 (cosine 0.5000000)');
    expect(lines.find((l) => l.startsWith('  parity'))).toBe('  parity     FAIL     greedy vs HF on host: export 128/128 equal to HF, 0 ties; quantize 119/128 equal to HF (the first 40 in a row), 9 mismatches (0 ties) FAIL (threshold: ≤ 1 tie, no other mismatch)');
    // With the listed mismatches in the record, the first one that is not a tie is named.
    r.gates.parity.mismatches = { count: 9, listed: [{ variant: 'quantize', prompt: 1, step: 40, hf: { token: 516 }, runtime: { token: 439 }, margin: 0.00011, tie: true }, { variant: 'quantize', prompt: 1, step: 44, hf: { token: 12 }, runtime: { token: 13 }, margin: 2.5, tie: false }] };
    expect(verdictLines(r, { oracleThreshold: thresholds }).find((l) => l.startsWith('  parity'))).toMatch(/; first: quantize prompt 1 generated token 44: HF 12 \(HF's margin 2\.5e\+0\), the runtime 13$/);
    // What to do next: bisect, and for parity the tie allowance.
    expect(lines).toContain("next: ./forge bisect tiny-qwen3 --arch v81 names where the shipped graphs first leave Hugging Face and tries the cheapest fix (docs/bisect.md); a mismatch where HF's own margin is tiny may be allowed with gates.parity.maxTies and tiesWhy (docs/gates.md#parity)");
    expect(lines).toContain('  emulation  not run  no QAIRT SDK');
    expect(lines.some((l) => l.startsWith('bundle:'))).toBe(false); // no bundle was made
    expect(lines.slice(-2)).toEqual(['report: /out/tiny-qwen3/v81.incomplete/build/report.html', 'run record: /out/tiny-qwen3/v81.incomplete/build/run.json']);
  });

  it('says a --until run is partial and shows the gates it ran', () => {
    const r = record({ status: 'partial', until: 'oracle', bundle: null, gates: { oracle: record().gates.oracle }, summaries: {} });
    const lines = verdictLines(r, { oracleThreshold: thresholds });
    expect(lines[0]).toBe('partial: stopped after oracle as asked; no bundle made, only gates oracle ran');
    expect(lines[1]).toMatch(/^ {2}oracle +pass +min cosine vs HF fp32: export:fp32 0\.9999991/);
    expect(lines.join('\n')).not.toMatch(/^ok:/m);
  });

  it("reads the oracle thresholds from the recipe by default, as the build used them", () => {
    const t = recipeOracleThreshold('tiny-qwen3');
    expect(t('export', 'fp32')).toBeGreaterThan(0.9);
    expect(t('quantize', 'w8')).toBeGreaterThan(0.9);
    expect(recipeOracleThreshold('no-such-recipe')('quantize', 'w8')).toBeUndefined();
    expect(verdictLines(record())[1]).toMatch(/export:fp32 0\.9999991 \(threshold 0\.\d+\), quantize:w8 0\.9995127 \(threshold 0\.\d+\)$/);
  });
});
