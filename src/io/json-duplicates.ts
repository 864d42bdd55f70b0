// JSON.parse keeps the last of two equal keys without a word. In a safetensors header or an index's
// weight_map that hides a tensor (its bytes then look like a hole in an innocent neighbour, or the
// index silently points elsewhere), so the raw text is scanned for keys that repeat in one object.
// Runs on text JSON.parse already accepted: only strings, nesting and colons need telling apart.
// Iterative (no recursion), linear in the text.

export interface DuplicateKey {
  key: string;
  /** Keys leading to the object that has `key` twice; [] for the top-level object. */
  path: string[];
}

interface Level {
  /** null for an array. */
  keys: Set<string> | null;
  /** The key under which this level sits in its parent (the parent's last key). */
  under: string | undefined;
  lastKey: string | undefined;
}

/** The first key that appears twice in one object of `text` (valid JSON), or null. */
export function firstDuplicateKey(text: string): DuplicateKey | null {
  const stack: Level[] = [];
  const n = text.length;
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
      stack.push({ keys: c === 0x7b ? new Set() : null, under: stack.at(-1)?.lastKey, lastKey: undefined });
    } else if (c === 0x7d /* } */ || c === 0x5d /* ] */) {
      stack.pop();
    } else if (c === 0x22 /* " */) {
      const start = i;
      for (i++; i < n; i++) {
        const d = text.charCodeAt(i);
        if (d === 0x5c /* \ */) i++;
        else if (d === 0x22) break;
      }
      const top = stack.at(-1);
      if (!top?.keys) continue;
      let j = i + 1;
      while (j < n && (text[j] === ' ' || text[j] === '\n' || text[j] === '\r' || text[j] === '\t')) j++;
      if (text[j] !== ':') continue; // a value, not a key
      const key = JSON.parse(text.slice(start, i + 1)) as string; // "\u0061" and "a" are the same key
      if (top.keys.has(key)) {
        const path = stack.slice(1).map((l) => l.under ?? '');
        return { key, path };
      }
      top.keys.add(key);
      top.lastKey = key;
    }
  }
  return null;
}
