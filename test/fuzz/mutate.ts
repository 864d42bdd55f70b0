// Seeded, structure-aware mutation of valid inputs for the fuzz specs: JSON documents get values
// swapped for other types, huge/negative/fractional numbers, fields dropped or added, deep nesting,
// control characters and non-ASCII in strings; text and bytes get truncated, flipped and stray
// non-UTF-8 bytes. Everything derives from one seed (printed on failure), so a case reproduces.
import { expect } from 'vitest';

/** FORGE_FUZZ_SEED / FORGE_FUZZ_CASES override the defaults (e.g. a longer run by hand). */
export const FUZZ_SEED = Number(process.env.FORGE_FUZZ_SEED ?? 20261123);
export const FUZZ_CASES = Number(process.env.FORGE_FUZZ_CASES ?? 10_000);

/** mulberry32: small, fast, and the same sequence on every platform. */
export class Rng {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  next(): number {
    let t = (this.state = (this.state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  below(n: number): number {
    return Math.floor(this.next() * n);
  }
  chance(oneIn: number): boolean {
    return this.below(oneIn) === 0;
  }
  pick<T>(items: readonly T[]): T {
    return items[this.below(items.length)];
  }
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

function deepNesting(depth: number): Json {
  let v: Json = [];
  for (let i = 0; i < depth; i++) v = [v];
  return v;
}
// 500 levels: deep enough to trip a recursive validator, shallow enough for JSON.stringify; deeper
// nesting (100,000 levels) goes in as text (mutateJsonText).
const DEEP_TEXT = `${'['.repeat(100_000)}${']'.repeat(100_000)}`;

export function oddValue(rng: Rng): Json {
  return rng.pick<() => Json>([
    () => null,
    () => true,
    () => -1,
    () => 0,
    () => 0.5,
    () => 2 ** 31,
    () => -(2 ** 31) - 1,
    () => 2 ** 53 + 2,
    () => 1e308,
    () => '',
    () => 'x\ny',
    () => '../../etc/passwd',
    () => '\u0000\u001b[31m',
    () => 'é\u{1F600}',
    () => [],
    () => ({}),
    () => JSON.parse('{"__proto__":1,"constructor":"x"}') as Json,
    () => deepNesting(500), // fresh each time: a shared one could be edited into containing itself
  ])();
}

/** A random walk from the root that often stops early, so top-level fields get as much attention as leaves. */
function pickContainerSlot(rng: Rng, doc: Json): { parent: Json[] | { [k: string]: Json }; key: string | number } | null {
  let parent: Json[] | { [k: string]: Json } | null = null;
  let key: string | number = '';
  let at: Json = doc;
  for (;;) {
    const isContainer = at !== null && typeof at === 'object';
    const keys: (string | number)[] = !isContainer ? [] : Array.isArray(at) ? at.map((_, i) => i) : Object.keys(at as object);
    if (!keys.length || (parent !== null && rng.chance(3))) break;
    parent = at as Json[] | { [k: string]: Json };
    key = rng.pick(keys);
    at = (parent as Record<string | number, Json>)[key];
  }
  return parent === null ? null : { parent, key };
}

/** An own data property even for '__proto__' (plain assignment would set the prototype instead). */
function put(target: Record<string | number, Json>, key: string | number, v: Json): void {
  Object.defineProperty(target, key, { value: v, enumerable: true, writable: true, configurable: true });
}

function editOnce(rng: Rng, doc: Json): void {
  const slot = pickContainerSlot(rng, doc);
  if (!slot) return;
  const { parent, key } = slot;
  const p = parent as Record<string | number, Json>;
  const value = p[key];
  switch (rng.below(8)) {
    case 0:
    case 1:
      put(p, key, oddValue(rng));
      break;
    case 2: // drop it
      if (Array.isArray(parent)) parent.splice(key as number, 1);
      else delete p[key];
      break;
    case 3: // add a sibling
      if (Array.isArray(parent)) parent.push(rng.chance(2) ? structuredClone(value) : oddValue(rng));
      else put(p, rng.pick(['extra', 'x\ty', 'x\ny', '__proto__', 'constructor']), oddValue(rng));
      break;
    case 4: // nudge a number
      if (typeof value === 'number') put(p, key, value + rng.below(5) - 2);
      break;
    case 5: // scale a number
      if (typeof value === 'number') put(p, key, value * rng.pick([-1, 1000003, 1e-9, 2 ** 40]));
      break;
    case 6: // change a string
      if (typeof value === 'string') put(p, key, rng.chance(2) && value.length ? value.slice(0, rng.below(value.length)) : value + rng.pick(['\n', 'é', '\u0000', ' ']));
      break;
    default: // wrap it
      put(p, key, rng.chance(2) ? [value] : { value });
  }
}

/** A mutated deep copy of `doc`: 1-3 structural edits. */
export function mutateJson<T>(rng: Rng, doc: T): Json {
  const copy = structuredClone(doc) as Json;
  for (let k = 0, n = 1 + rng.below(3); k < n; k++) editOnce(rng, copy);
  return copy;
}

/** Byte-level damage: truncation, a flipped bit, a stray 0xff (never valid UTF-8). */
export function mutateBytes(rng: Rng, bytes: Buffer): Buffer {
  if (!bytes.length) return bytes;
  const out = Buffer.from(bytes);
  switch (rng.below(3)) {
    case 0:
      return out.subarray(0, rng.below(out.length));
    case 1:
      out[rng.below(out.length)] ^= 1 << rng.below(8);
      return out;
    default: {
      const at = rng.below(out.length);
      return Buffer.concat([out.subarray(0, at), Buffer.from([0xff]), out.subarray(at)]);
    }
  }
}

/** The mutated document as file bytes: usually valid JSON, one time in four damaged text. */
export function mutateJsonText(rng: Rng, doc: unknown): Buffer {
  let text = JSON.stringify(mutateJson(rng, doc));
  if (rng.chance(16)) {
    // `"key":value` → `"key":[[[…]]],"deep":value`: still valid JSON, 100,000 levels deep.
    const colons = [...text.matchAll(/":/g)].map((m) => m.index + 1);
    if (colons.length) {
      const at = rng.pick(colons) + 1;
      text = `${text.slice(0, at)}${DEEP_TEXT},"deep":${text.slice(at)}`;
    }
  }
  const bytes = Buffer.from(text, 'utf8');
  return rng.chance(4) ? mutateBytes(rng, bytes) : bytes;
}

/**
 * What "a clear refusal" means for every parser: the parser's own error class (never a TypeError,
 * RangeError or SyntaxError leaking out of it), a message of exactly one line (no stack trace, no
 * list), that names the input (`names`: the file, or its field path prefix).
 */
export function expectClearRefusal(err: unknown, errorClass: new (...args: never[]) => Error, names: string, context: () => string): void {
  const where = `seed ${FUZZ_SEED}, ${context()}`;
  if (!(err instanceof errorClass)) {
    const e = err as Error;
    expect.fail(`${where}: threw ${e?.name ?? typeof err} instead of ${errorClass.name}: ${e?.stack ?? String(err)}`);
  }
  const message = (err as Error).message;
  expect(message.includes('\n') || message.includes('\r'), `${where}: refusal is not one line: ${JSON.stringify(message)}`).toBe(false);
  expect(message.includes(names), `${where}: refusal does not name ${names}: ${JSON.stringify(message)}`).toBe(true);
  expect(message.length, `${where}: refusal is ${message.length} characters`).toBeLessThan(2000);
}

/** A short, printable picture of a failing input for the failure message. */
export function show(input: unknown): string {
  const text = Buffer.isBuffer(input) ? input.toString('latin1') : JSON.stringify(input);
  return JSON.stringify(text.length > 1500 ? `${text.slice(0, 1500)}…` : text);
}
