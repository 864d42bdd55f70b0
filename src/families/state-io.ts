// The graph input/output names of decoder state, written by the family graph builders and read back
// by the bindings, the gate cases and the per-layer gate table: one place, so a renamed convention
// cannot leave a reader behind. They are C identifiers (see export/graphs.ts checkIoNames). Which
// recurrent states exist (Qwen3.5's conv FIFO and delta-rule state …) is the family's business: any
// lower-case kind name follows the same convention.
export type KvKind = 'k' | 'v';

/** A layer's KV cache in (`past_k_3`) and its new rows out (`new_k_3`). */
export const pastKv = (kind: KvKind, layer: number) => `past_${kind}_${layer}`;
export const newKv = (kind: KvKind, layer: number) => `new_${kind}_${layer}`;

function checkKind(kind: string): string {
  if (!/^[a-z]+$/.test(kind)) throw new Error(`recurrent state kind '${kind}' must be lower-case letters (it is part of graph I/O names)`);
  return kind;
}

/** A layer's recurrent state in (`rec_state_3`) and its next value out (`new_rec_state_3`). */
export const recurrentIn = (kind: string, layer: number) => `${checkKind(kind)}_state_${layer}`;
export const recurrentOut = (kind: string, layer: number) => `new_${checkKind(kind)}_state_${layer}`;

export type StateIo = { kind: KvKind; layer: number; recurrent: false } | { kind: string; layer: number; recurrent: true };

/** The state a graph input names, or null for any other input. */
export function parseStateInput(name: string): StateIo | null {
  const m = /^past_([kv])_(\d+)$/.exec(name);
  if (m) return { kind: m[1] as KvKind, layer: Number(m[2]), recurrent: false };
  const r = /^([a-z]+)_state_(\d+)$/.exec(name);
  return r ? { kind: r[1], layer: Number(r[2]), recurrent: true } : null;
}

/** The state a graph output gives, or null for any other output. */
export function parseStateOutput(name: string): StateIo | null {
  const m = /^new_([kv])_(\d+)$/.exec(name);
  if (m) return { kind: m[1] as KvKind, layer: Number(m[2]), recurrent: false };
  const r = /^new_([a-z]+)_state_(\d+)$/.exec(name);
  return r ? { kind: r[1], layer: Number(r[2]), recurrent: true } : null;
}

/** The runtime's name for that state in the manifest (`kv.3.k`, `rec.3`). */
export function stateName(io: StateIo): string {
  return io.recurrent ? `${io.kind}.${io.layer}` : `kv.${io.layer}.${io.kind}`;
}
