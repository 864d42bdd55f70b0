// What the benchmarks share: their command lines (node:util parseArgs; an unknown flag or a bad
// number is an error, not a silent default) and the median they report.
import { parseArgs } from 'node:util';

type Spec = Record<string, { type: 'string'; default: string } | { type: 'boolean' }>;

/** Flags as `spec` declares them; numbers come through `num`. */
export function benchArgs<S extends Spec>(spec: S, argv = process.argv.slice(2)) {
  const parsed = parseArgs({ args: argv, options: spec, strict: true, allowPositionals: true });
  const values = parsed.values as unknown as { [K in keyof S]: S[K] extends { type: 'boolean' } ? boolean | undefined : string };
  const num = (name: keyof S & string, check: (n: number) => boolean = (n) => n >= 0): number => {
    const raw = values[name] as string;
    const n = Number(raw);
    if (raw === '' || !Number.isFinite(n) || !check(n)) throw new Error(`--${name} '${raw}' is not a valid number here`);
    return n;
  };
  return { values, positionals: parsed.positionals, num };
}

export const positiveInt = (n: number) => Number.isInteger(n) && n >= 1;

/** The middle value; for an even count, the mean of the two middle ones. */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}
