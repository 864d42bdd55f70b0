// The precision's logit error end to end, which the parity gates' tie bound is built on. The oracle
// gate feeds every graph HF's own hidden state, so a separate lm-head graph sees none of the
// decoder's quantization error (on the twins its W8 logit error equals fp32's, ~5e-7). Here, at
// every traced step, a variant's one-token graphs run in model order, each fed the previous graph's
// own output as the runtime hands it along (and HF's caches and states for that step, as in the
// gate); the last graph's logits are compared with HF's. The first shard's input is the embedding
// row, the same in both, so its gate cases are the chain's first link.
import type { GraphEntry } from '../export/graphs.js';
import type { GateCase } from '../families/types.js';

const key = (c: Pick<GateCase, 'prompt' | 'step'>) => `${c.prompt}:${c.step}`;

/**
 * How the chained logits decide HF's greedy tokens: at every traced step whose logits chose a
 * generated token, whether forge's argmax is HF's, and forge's own margin for HF's token (its logit
 * minus the largest other; negative where another token wins). With every step agreeing, greedy
 * decoding of the traced prompts gives HF's tokens: teacher forcing is free running while they agree.
 */
export interface ChainDecisions {
  steps: number;
  agree: number;
  minMargin: number;
  /** Where minMargin is: `prompt P step S`. */
  at: string;
}

/** The traced steps whose logits chose a generated token: prompt p's steps from its last prompt token on. */
export function greedySteps(prompts: Array<{ prompt_tokens: number[]; generated: number[] }>): (prompt: number, step: number) => boolean {
  return (p, t) => t >= prompts[p].prompt_tokens.length - 1 && t < prompts[p].prompt_tokens.length - 1 + prompts[p].generated.length;
}

function argmax(x: Float32Array, skip = -1): number {
  let best = -1;
  for (let i = 0; i < x.length; i++) if (i !== skip && (best < 0 || x[i] > x[best])) best = i;
  return best;
}

export class StepChain {
  /** Hidden rows by the residual they are (`h.<layer>` or `final`), then by `prompt:step`. */
  private readonly rows = new Map<string, Map<string, Float32Array>>();
  private maxAbs = 0;
  private logitCases = 0;
  private nonFinite = false;
  /** The graphs the chain ran, in order. */
  readonly graphs: string[] = [];
  private readonly tally: ChainDecisions = { steps: 0, agree: 0, minMargin: Infinity, at: '' };

  /**
   * `greedy`: which traced steps chose a generated token (greedySteps); without it no decisions are kept.
   * `round`: what a hand-off between graphs does to the residual (f16 hand-offs: roundToF16). The
   * first graph's input is the host's own float32 rows, not a hand-off: it is not rounded.
   */
  constructor(private readonly greedy?: (prompt: number, step: number) => boolean, private readonly round?: (x: Float32Array) => Float32Array) {}

  /** One-token graphs on the residual stream (decode shards, the lm-head) chain: every traced step has a case in each. */
  static applies(entry: GraphEntry): boolean {
    return entry.n === 1 && entry.stream !== undefined;
  }

  /** The residual a graph's hidden input holds; null for the first graph (fed from a host table: it starts the chain). */
  static source(entry: GraphEntry): string | null {
    return StepChain.stream(entry).from;
  }

  private static sink(entry: GraphEntry): string | null {
    return StepChain.stream(entry).to ?? null;
  }

  private static stream(entry: GraphEntry): NonNullable<GraphEntry['stream']> {
    if (!entry.stream) throw new Error(`oracle: ${entry.name} declares no residual stream, so it cannot be chained`);
    return entry.stream;
  }

  /** The graph's gate cases with its hidden input replaced by what the previous graph of the chain gave at that step. */
  async *cases(entry: GraphEntry, cases: AsyncIterable<GateCase>): AsyncGenerator<GateCase> {
    const source = StepChain.source(entry);
    if (source === null) throw new Error(`${entry.name} is fed from a host table: its gate cases are the chain's first link`);
    const { input, output } = StepChain.stream(entry);
    const rows = this.rows.get(source);
    if (!rows) throw new Error(`oracle: ${entry.name} reads ${source}, which no earlier one-token graph of its variant wrote (graphs.json lists the graphs out of model order)`);
    for await (const c of cases) {
      const row = rows.get(key(c));
      const feed = c.feeds[input];
      if (!row || !feed) throw new Error(`oracle: no chained ${source} for ${entry.name} at prompt ${c.prompt} step ${c.step}`);
      const expected: GateCase['expected'] = {};
      for (const name of [output, 'logits']) if (name && c.expected[name]) expected[name] = c.expected[name];
      yield { prompt: c.prompt, step: c.step, feeds: { ...c.feeds, [input]: { ...feed, data: row } }, expected };
    }
  }

  /** Keeps a chained case's hidden output for the next graph and measures its logits against HF's. */
  record(entry: GraphEntry, c: GateCase, output: (name: string) => Float32Array): void {
    if (this.graphs.at(-1) !== entry.name) this.graphs.push(entry.name);
    const sink = StepChain.sink(entry);
    const out = entry.stream?.output;
    if (sink && out && c.expected[out]) {
      if (!this.rows.has(sink)) this.rows.set(sink, new Map());
      const row = output(out);
      this.rows.get(sink)!.set(key(c), this.round ? this.round(row) : row.slice());
    }
    if (c.expected.logits) this.logits(c, output('logits'));
  }

  /** Measures a case's chained logits against HF's (`c.expected.logits`), from a chain run by a family itself (Family.chain). */
  logits(c: GateCase, got: Float32Array): void {
    const want = c.expected.logits;
    if (!want) return;
    this.logitCases++;
    if (this.greedy?.(c.prompt, c.step)) {
      const top = argmax(want);
      const margin = got[top] - got[argmax(got, top)];
      this.tally.steps++;
      if (argmax(got) === top) this.tally.agree++;
      if (!(margin >= this.tally.minMargin)) Object.assign(this.tally, { minMargin: margin, at: `prompt ${c.prompt} step ${c.step}` });
    }
    for (let i = 0; i < want.length; i++) {
      const d = Math.abs(got[i] - want[i]);
      if (!Number.isFinite(d)) this.nonFinite = true;
      else if (d > this.maxAbs) this.maxAbs = d;
    }
  }

  /** HF's greedy tokens against the chained logits; undefined without greedy steps. */
  get decisions(): ChainDecisions | undefined {
    return this.tally.steps ? { ...this.tally } : undefined;
  }

  /** The largest |logit − HF logit| over every chained step; undefined when no logits were chained or one was non-finite. */
  get logitError(): number | undefined {
    return this.logitCases > 0 && !this.nonFinite ? this.maxAbs : undefined;
  }
}
