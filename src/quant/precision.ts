// Which precision each matmul weight is stored in: the one place that combines the recipe's
// scheme, its per-matrix overrides (by tensor-name pattern) and the `auto` precision map, so the
// planner's byte counts and the export's graphs cannot disagree. How a chosen precision is stored
// (a padding for in-features no block divides: quant/pad.ts) is the store's business.
import type { PrecisionOverride, QuantScheme } from '../recipe/schema.js';
import type { MatrixPrecision } from './w4.js';

/** The `auto` stage's result: tensor name → its precision and why (quant/auto.ts). */
export type PrecisionMap = Record<string, MatrixPrecision>;

export const PRECISION_JSON = 'precision.json';

export class PrecisionChooser {
  private readonly patterns: Array<{ o: PrecisionOverride; re: RegExp; hits: number }>;

  constructor(overrides: readonly PrecisionOverride[] = [], private readonly map: PrecisionMap = {}) {
    this.patterns = overrides.map((o) => ({ o, re: new RegExp(`^(?:${o.match})$`), hits: 0 }));
  }

  /** The first override whose pattern matches `name` whole, if any. */
  override(name: string): PrecisionOverride | undefined {
    const p = this.patterns.find((x) => x.re.test(name));
    if (p) p.hits++;
    return p?.o;
  }

  /** A matrix's precision: a recipe override first, then the auto map, then the graph's own scheme. */
  choose(name: string, scheme: QuantScheme): MatrixPrecision {
    const o = this.override(name);
    if (o) return { scheme: o.quant, why: `recipe override ${JSON.stringify(o.match)}${o.why ? `: ${o.why}` : ''}` };
    const m = this.map[name];
    return m ? { scheme: m.scheme, why: m.why! } : { scheme };
  }

  /** Whether an override or the map gives some matrix `scheme` (whatever the graphs' own scheme). */
  mayChoose(scheme: QuantScheme): boolean {
    return this.patterns.some((p) => p.o.quant === scheme) || Object.values(this.map).some((m) => m.scheme === scheme);
  }

  /** Override patterns that matched no tensor choose() was asked about (a typo, or another model's names). */
  unused(): PrecisionOverride[] {
    return this.patterns.filter((p) => p.hits === 0).map((p) => p.o);
  }
}
