// `forge bisect --from <qhx_generate --json result>`: "the device said this". The run's prompt ids are
// traced by HF exactly as given; this compares the tokens the run chose with HF's greedy continuation
// of them and names the first place they part, with HF's margin there (a near-tie is a weak verdict).
import type { TracePrompt } from '../gates/trace.js';

export interface RunDivergence {
  /** The run's generated tokens and HF's traced ones; the comparison covers the shorter. */
  runTokens: number;
  hfTokens: number;
  compared: number;
  /** The first generated token where the run's choice is not HF's. */
  first?: {
    /** 0-based among the generated tokens. */
    index: number;
    /** The trace step that chose it (prompt length − 1 + index), as drift and the gates count. */
    step: number;
    hf: { token: number; runnerUp: number; margin: number };
    run: number;
  };
}

export function firstRunDivergence(hf: TracePrompt, runIds: number[]): RunDivergence {
  const compared = Math.min(runIds.length, hf.generated.length);
  const base = { runTokens: runIds.length, hfTokens: hf.generated.length, compared };
  for (let i = 0; i < compared; i++) {
    if (runIds[i] === hf.generated[i]) continue;
    return { ...base, first: { index: i, step: hf.prompt_tokens.length - 1 + i, hf: { token: hf.generated[i], runnerUp: hf.runner_up[i], margin: hf.margins[i] }, run: runIds[i] } };
  }
  return base;
}

export function runDivergenceText(d: RunDivergence): string {
  const f = d.first;
  if (!f) return `the run follows HF's greedy continuation at all ${d.compared} generated tokens compared (the run ${d.runTokens}, HF traced ${d.hfTokens})`;
  return `the run leaves HF's greedy continuation at generated token ${f.index} (step ${f.step}): HF picks ${f.hf.token} by ${f.hf.margin.toFixed(4)} over ${f.hf.runnerUp}, the run picked ${f.run}`;
}
