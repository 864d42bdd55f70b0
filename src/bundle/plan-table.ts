// The plan as the card prints it: each context with the layers it runs, the weight bytes the planner
// cut it by (against the arch's per-context ceiling), and the state it carries — KV caches over every
// position, ring caches of a sliding window, caches it reads that another context writes (K/V shared
// across layers) — then the host tables. From plan.json and the manifest the runtime loads.
import type { ShardPlan } from '../plan/shards.js';
import type { Manifest } from './manifest.js';
import { sizeText as bytes } from '../units.js';


/** What a context's graphs bind as state, in words: "6 kv-cache (4 rings of 16 slots); reads kv.2.k, kv.2.v (written by shard0)". */
function stateWords(m: Manifest, ci: number): string {
  const spec = new Map(m.state.map((s) => [s.name, s]));
  const read = new Set<string>();
  for (const g of m.contexts[ci].graphs) for (const i of g.inputs) if (i.bind === 'state') read.add(i.state);
  const writtenBy = (name: string) => m.contexts.find((c) => c.graphs.some((g) => g.outputs.some((o) => 'state' in o && o.state === name)))?.name;
  const own = [...read].filter((n) => writtenBy(n) === m.contexts[ci].name);
  const foreign = [...read].filter((n) => writtenBy(n) !== m.contexts[ci].name);
  if (!read.size) return '-';
  const kinds = new Map<string, number>();
  const rings = new Map<number, number>();
  for (const n of own) {
    const s = spec.get(n)!;
    kinds.set(s.kind, (kinds.get(s.kind) ?? 0) + 1);
    if (s.kind === 'kv-cache' && s.window) rings.set(s.window, (rings.get(s.window) ?? 0) + 1);
  }
  const parts = [...kinds].map(([k, n]) => `${n} ${k}`);
  const ringWords = [...rings].map(([w, n]) => `${n} rings of ${w} slots`);
  const out = [parts.join(', ') + (ringWords.length ? ` (${ringWords.join(', ')})` : '')].filter(Boolean);
  if (foreign.length) out.push(`reads ${foreign.join(', ')} (written by ${[...new Set(foreign.map(writtenBy))].join(', ')})`);
  return out.join('; ');
}

export function planLines(plan: ShardPlan, m: Manifest): string[] {
  const lines = [`**Plan** (weights per context as the planner cut them, under ${plan.arch}'s per-context ceiling of ${bytes(plan.shardCeilingBytes ?? plan.ceilingBytes)}):`, '', '| context | layers | weights | state it carries |', '|---|---|---|---|'];
  m.contexts.forEach((c, ci) => {
    const layers = c.graphs.find((g) => g.layers)?.layers;
    const shard = layers ? plan.shards.find((s) => s.first === layers[0] && s.last === layers[1]) : undefined;
    const w = shard ? shard.weightBytes + (plan.lmHead.placement === 'last-shard' && shard.index === plan.shards.length - 1 ? plan.lmHead.bytes : 0) : !layers ? plan.lmHead.bytes : undefined;
    lines.push(`| ${c.name} | ${layers ? `${layers[0]}–${layers[1]}` : 'lm-head'} | ${w === undefined ? '-' : bytes(w)} | ${stateWords(m, ci)} |`);
  });
  lines.push('', `Host tables: ${plan.hostTables.map((t) => `${t.name} ${bytes(t.bytes)} (${t.dtype})`).join(', ')}.`, '');
  lines.push(promptLine(m), '');
  return lines;
}

/** How the runtime takes a prompt: batched prefill calls of N tokens, or one token per call. */
export function promptLine(m: Manifest): string {
  const n = Math.max(0, ...m.contexts.flatMap((c) => c.graphs.filter((g) => g.role.includes('prefill')).map((g) => g.tokens)));
  return n > 1
    ? `**Prompt:** prefilled ${n} tokens per call (batched prefill graphs): a longer prompt runs in chunks of ${n}, the last one padded; a one-token prompt is decoded (one call either way, and the decode graph computes one row instead of ${n}); the runtime decodes over the prompt instead when asked to (\`--no-prefill\`).`
    : '**Prompt:** decoded one token per call (this bundle has no prefill graphs).';
}
