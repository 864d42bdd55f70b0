// Qwen3.5's linear attention over N tokens per call (its batched prefill) against the token-by-token
// recurrence it replaces: the chunked gated delta rule and the causal conv over a prompt, over several
// chunks in one call, from a non-zero state, with the last rows padding.
import { describe, it, expect } from 'vitest';
import * as ort from 'onnxruntime-node';
import { GraphBuilder, encodeModel } from '../src/onnx/index.js';
import { attentionMask } from '../src/families/blocks.js';
import { causalConvChunk, chunkedGatedDelta, deltaChunk, realRows } from '../src/families/delta-rule.js';
import { rng } from './onnx/fixture.js';

const [HV, DK, DV, N, CTX] = [3, 4, 5, 12, 6];

/** The recurrence, one token at a time (HF's torch_recurrent_gated_delta_rule): outputs [Hv, T, dv], final state. */
function recurrence(q: Float32Array, k: Float32Array, v: Float32Array, beta: Float32Array, g: Float32Array, s0: Float32Array, steps: number) {
  const s = Float32Array.from(s0);
  const out = new Float32Array(HV * N * DV);
  for (let h = 0; h < HV; h++) {
    const S = s.subarray(h * DK * DV, (h + 1) * DK * DV);
    for (let t = 0; t < steps; t++) {
      const at = (x: Float32Array, d: number, i: number) => x[(h * N + t) * d + i];
      const decay = Math.exp(g[h * N + t]);
      for (let e = 0; e < DK * DV; e++) S[e] *= decay;
      for (let j = 0; j < DV; j++) {
        let u = 0;
        for (let i = 0; i < DK; i++) u += at(k, DK, i) * S[i * DV + j];
        const delta = (at(v, DV, j) - u) * beta[h * N + t];
        for (let i = 0; i < DK; i++) S[i * DV + j] += at(k, DK, i) * delta;
      }
      for (let j = 0; j < DV; j++) {
        let o = 0;
        for (let i = 0; i < DK; i++) o += at(q, DK, i) * S[i * DV + j];
        out[(h * N + t) * DV + j] = o;
      }
    }
  }
  return { out, state: s };
}

const close = (a: Float32Array, b: Float32Array, tol: number) => {
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]));
  expect(worst).toBeLessThan(tol);
};

describe('the chunked gated delta rule (a prefill call of N tokens)', () => {
  it('chunks N = 12 by 4 and N = 128 by HF\'s 64', () => {
    expect([deltaChunk(12), deltaChunk(16), deltaChunk(128), deltaChunk(7)]).toEqual([4, 16, 64, 1]);
  });

  it('gives the recurrence\'s outputs and final state over 3 chunks, the last 3 rows padding', async () => {
    const r = rng(7);
    const unit = (n: number, d: number) => {
      const x = Float32Array.from({ length: n * d }, () => r());
      for (let row = 0; row < n; row++) {
        const norm = Math.hypot(...x.subarray(row * d, (row + 1) * d));
        for (let i = 0; i < d; i++) x[row * d + i] /= norm;
      }
      return x;
    };
    const valid = 9;
    const q = unit(HV * N, DK).map((x) => x / Math.sqrt(DK));
    const k = unit(HV * N, DK);
    const v = Float32Array.from({ length: HV * N * DV }, () => r() * 2);
    // Decays from slow to fast forgetting (g down to -6) and β over (0, 1): a trained model's range.
    const beta = Float32Array.from({ length: HV * N }, (_, i) => (i % N < valid ? 0.5 + r() : 0));
    const logDecay = Float32Array.from({ length: HV * N }, (_, i) => (i % N < valid ? -Math.abs(r()) * 12 : 0));
    const s0 = Float32Array.from({ length: HV * DK * DV }, () => r());

    const g = new GraphBuilder('delta');
    const inp = (name: string, dims: number[]) => g.input(name, 'float32', dims);
    const res = chunkedGatedDelta(g, {
      q: inp('q', [1, HV, N, DK]), k: inp('k', [1, HV, N, DK]), v: inp('v', [1, HV, N, DV]),
      beta: inp('beta', [1, HV, N, 1]), logDecay: inp('g', [1, HV, N, 1]), state: inp('s', [1, HV, DK, DV]),
    }, N);
    g.output(res.out, 'out', { shape: [1, HV, N, DV] });
    g.output(res.next, 'next', { shape: [1, HV, DK, DV] });
    const sess = await ort.InferenceSession.create(encodeModel(g));
    const t = (data: Float32Array, dims: number[]) => new ort.Tensor('float32', data, dims);
    const got = await sess.run({ q: t(q, [1, HV, N, DK]), k: t(k, [1, HV, N, DK]), v: t(v, [1, HV, N, DV]), beta: t(beta, [1, HV, N, 1]), g: t(logDecay, [1, HV, N, 1]), s: t(s0, [1, HV, DK, DV]) });
    const want = recurrence(q, k, v, beta, logDecay, s0, valid);
    close(got.next.data as Float32Array, want.state, 1e-5);
    const real = (x: Float32Array) => Float32Array.from(x).filter((_, i) => Math.floor(i / DV) % N < valid);
    close(real(got.out.data as Float32Array), real(want.out), 1e-5);
  });
});

describe('the causal conv over a prompt chunk', () => {
  it('gives each real row the FIFO step\'s output and hands on the state after the last real row', async () => {
    const [C, K] = [3, 4];
    const r = rng(3);
    const state = Float32Array.from({ length: C * K }, () => r());
    const x = Float32Array.from({ length: C * N }, () => r());
    const w = Float32Array.from({ length: C * K }, () => r());
    for (const valid of [N, 5, 1]) {
      const g = new GraphBuilder('conv');
      const mask = g.input('mask', 'float32', [1, 1, N, CTX + N]);
      const res = causalConvChunk(g, g.input('state', 'float32', [1, C, K]), g.input('x', 'float32', [1, C, N]), g.input('w', 'float32', [1, C, K]), K, N, realRows(g, mask, CTX, N));
      g.output(res.out, 'out', { shape: [1, C, N] });
      g.output(res.next, 'next', { shape: [1, C, K] });
      const sess = await ort.InferenceSession.create(encodeModel(g));
      const got = await sess.run({
        mask: new ort.Tensor('float32', attentionMask(CTX, N, 2, valid), [1, 1, N, CTX + N]),
        state: new ort.Tensor('float32', state, [1, C, K]), x: new ort.Tensor('float32', x, [1, C, N]), w: new ort.Tensor('float32', w, [1, C, K]),
      });
      // The one-token FIFO: drop the oldest column, append the input, Σ taps · window.
      const fifo = Array.from({ length: C }, (_, c) => Array.from(state.subarray(c * K, (c + 1) * K)));
      for (let t = 0; t < valid; t++) {
        for (let c = 0; c < C; c++) {
          fifo[c] = [...fifo[c].slice(1), x[c * N + t]];
          const want = fifo[c].reduce((s, f, j) => s + f * w[c * K + j], 0);
          expect((got.out.data as Float32Array)[c * N + t]).toBeCloseTo(want, 5);
        }
      }
      expect(Array.from(got.next.data as Float32Array)).toEqual(fifo.flat().map((f) => Math.fround(f)));
    }
  });
});
