// A graph's top-1 agreement with HF's greedy tokens, as the oracle and simulator gates record it
// ("agree/rows", e.g. "270/270"), written and read back in one place.

export interface Top1 {
  agree: number;
  rows: number;
}

export const top1Text = (t: Top1): string => `${t.agree}/${t.rows}`;

/** "270/270" → its counts; undefined for anything else. */
export function parseTop1(v: unknown): Top1 | undefined {
  const m = typeof v === 'string' ? /^(\d+)\/(\d+)$/.exec(v) : null;
  return m ? { agree: Number(m[1]), rows: Number(m[2]) } : undefined;
}
