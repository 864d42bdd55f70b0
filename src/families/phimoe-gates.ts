// PhiMoE's gate cases and runtime bindings (the graphs are in phimoe.ts). Teacher-forced from the
// trace's named captures: an attention+router graph is fed h.l and HF's KV cache and must give
// attn_res.l, moe_in.l, router_logits.l and the K/V rows; the experts graph, at every step and
// layer, is fed a zero residual, moe_in.l, the rows of the two experts HF's sparsemixer chose (read
// from this export's own host tables) and HF's weights, and must give HF's MoE output moe_out.l (h.{l+1}
// less the residual, exactly: check_trace.py): the experts' numbers, not diluted by a residual of
// similar size; the lm-head is fed h.L.
// Batched prefill, over each prompt in chunks of N: the attention+router graph the same, N rows at
// once; the experts-prefill graph once per (chunk, layer, expert the chunk chose), fed a zero
// running sum and that expert's per-token weights, must give weight · HF's own output of that
// expert (the trace's expert_out, per slot): the expert alone, not diluted by the residual.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Trace } from '../gates/trace.js';
import { GRAPHS_JSON, type ExportManifest, type GraphEntry } from '../export/graphs.js';
import type { GraphBindings } from './types.js';
import type { ManifestGraph } from '../bundle/manifest.js';
import { attentionMask } from './blocks.js';
import { CacheBuilder, promptCalls, rowMask, stackKv, stackRows, type KvLayout } from './kv-decoder.js';
import type { Feed, GateCase } from './types.js';
import { newKv, parseStateInput, parseStateOutput, pastKv, stateName } from './state-io.js';
import { readExpertRows, scaleTable } from './expert-tables.js';
import { EXPERT_TABLES, ROLES, expertInput, expertScaleInput, type PhimoeConfig } from './phimoe.js';

const kvLayout = (c: PhimoeConfig, maxContext: number): KvLayout => ({ maxContext, layer: () => ({ kvHeads: c.kvHeads, headDim: c.headDim }) });

/** The layer an attention+router graph runs (its own entry's first = last). */
function layerOf(entry: GraphEntry): number {
  if (entry.first === undefined || entry.first !== entry.last) throw new Error(`${entry.name}: not a per-layer attention+router graph (layers ${entry.first}..${entry.last})`);
  return entry.first;
}

const f32 = (data: Float32Array, dims: number[]): Feed => ({ dtype: 'float32', data, dims });

async function* attnRouterCases(c: PhimoeConfig, entry: GraphEntry, trace: Trace, maxContext: number): AsyncGenerator<GateCase> {
  const l = layerOf(entry);
  const kv = kvLayout(c, maxContext);
  const H = c.hidden;
  for (let p = 0; p < trace.meta.prompts.length; p++) {
    const cache = new CacheBuilder([l], kv);
    for (let t = 0; t < trace.meta.prompts[p].steps; t++) {
      await cache.fillTo(trace, p, t);
      yield {
        prompt: p, step: t,
        feeds: {
          hidden_in: f32(await trace.get(p, t, `h.${l}`), [1, 1, H]),
          position: { dtype: 'int32', data: Int32Array.of(Math.min(t, maxContext - 1)), dims: [1] },
          attn_mask: f32(attentionMask(maxContext, 1, t, 1), [1, 1, 1, maxContext + 1]),
          [pastKv('k', l)]: f32(cache.k.get(l)!, [1, c.kvHeads, maxContext, c.headDim]),
          [pastKv('v', l)]: f32(cache.v.get(l)!, [1, c.kvHeads, maxContext, c.headDim]),
        },
        expected: {
          attn_res: await trace.get(p, t, `attn_res.${l}`),
          moe_in: await trace.get(p, t, `moe_in.${l}`),
          router_logits: await trace.get(p, t, `router_logits.${l}`),
          [newKv('k', l)]: await trace.get(p, t, `k.${l}`),
          [newKv('v', l)]: await trace.get(p, t, `v.${l}`),
        },
      };
    }
  }
}

/** The attention+router graph over prefill chunks of entry.n prompt tokens, padding rows not compared. */
async function* attnRouterPrefillCases(c: PhimoeConfig, entry: GraphEntry, trace: Trace, maxContext: number): AsyncGenerator<GateCase> {
  const l = layerOf(entry);
  const kv = kvLayout(c, maxContext);
  const { hidden: H, experts: E, kvHeads, headDim: d } = c;
  const n = entry.n;
  for (let p = 0; p < trace.meta.prompts.length; p++) {
    const cache = new CacheBuilder([l], kv);
    for (const { start, valid } of promptCalls(entry, trace.meta.prompts[p].prompt_tokens.length, trace.meta.prompts[p].steps)) {
      await cache.fillTo(trace, p, start);
      const steps = Array.from({ length: valid }, (_, r) => start + r);
      const rows = (what: string, width: number) => stackRows(trace, p, steps, n, what, width);
      const expected = {
        attn_res: await rows(`attn_res.${l}`, H),
        moe_in: await rows(`moe_in.${l}`, H),
        router_logits: await rows(`router_logits.${l}`, E),
        [newKv('k', l)]: await stackKv(trace, p, steps, n, `k.${l}`, kv.layer(l)),
        [newKv('v', l)]: await stackKv(trace, p, steps, n, `v.${l}`, kv.layer(l)),
      };
      const residual = rowMask(1, n, H, valid);
      const kvRows = rowMask(kvHeads, n, d, valid);
      yield {
        prompt: p, step: start,
        feeds: {
          hidden_in: f32(await rows(`h.${l}`, H), [1, n, H]),
          position: { dtype: 'int32', data: Int32Array.from({ length: n }, (_, r) => Math.min(start + r, maxContext - 1)), dims: [n] },
          attn_mask: f32(attentionMask(maxContext, n, start, valid), [1, 1, n, maxContext + n]),
          [pastKv('k', l)]: f32(cache.k.get(l)!, [1, kvHeads, maxContext, d]),
          [pastKv('v', l)]: f32(cache.v.get(l)!, [1, kvHeads, maxContext, d]),
        },
        expected,
        ...(valid < n ? { masks: { attn_res: residual, moe_in: residual, router_logits: rowMask(1, n, E, valid), [newKv('k', l)]: kvRows, [newKv('v', l)]: kvRows } } : {}),
      };
    }
  }
}

/** The export's made tables, by name, with their paths. */
function tablesOf(dir: string): Map<string, NonNullable<ExportManifest['madeTables']>[number] & { path: string }> {
  const m = JSON.parse(readFileSync(join(dir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  return new Map((m.madeTables ?? []).map((t) => [t.name, { ...t, path: join(dir, t.file) }]));
}

/** Feeds a slot's expert inputs with expert e of layer l, read from the export's own host tables (and W8's row scales). */
function expertRowsFeeder(c: PhimoeConfig, dir: string): (feeds: Record<string, Feed>, slot: number, l: number, e: number) => void {
  const tables = tablesOf(dir);
  const table = (name: string) => {
    const t = tables.get(name);
    if (!t) throw new Error(`${join(dir, GRAPHS_JSON)}: no host table '${name}' (the experts graph is fed from it)`);
    return t;
  };
  return (feeds, slot, l, e) => {
    for (const name of [EXPERT_TABLES.gateUp, EXPERT_TABLES.down]) {
      const tb = table(name);
      feeds[expertInput(name, slot)] = { dtype: tb.dtype, data: readExpertRows(tb.path, tb.dtype, tb.shape, l, e), dims: tb.shape.slice(2) } as Feed;
      if (tb.dtype === 'int8') {
        const sc = table(scaleTable(name));
        feeds[expertScaleInput(name, slot)] = f32(readExpertRows(sc.path, sc.dtype, sc.shape, l, e) as Float32Array, sc.shape.slice(2));
      }
    }
  };
}

/** HF's two experts of layer l at a step, checked against the config. */
async function expertIds(c: PhimoeConfig, trace: Trace, p: number, t: number, l: number): Promise<number[]> {
  const ids = Array.from(await trace.get(p, t, `expert_ids.${l}`));
  for (const e of ids) if (!Number.isInteger(e) || e < 0 || e >= c.experts) throw new Error(`trace: expert_ids.${l} of prompt ${p} step ${t} holds ${e}, not an expert of ${c.experts}`);
  return ids;
}

async function* expertsCases(c: PhimoeConfig, trace: Trace, dir: string): AsyncGenerator<GateCase> {
  const feedRows = expertRowsFeeder(c, dir);
  const H = c.hidden;
  for (let p = 0; p < trace.meta.prompts.length; p++) {
    for (let t = 0; t < trace.meta.prompts[p].steps; t++) {
      for (let l = 0; l < c.layers; l++) {
        const ids = await expertIds(c, trace, p, t, l);
        const feeds: Record<string, Feed> = {
          attn_res: f32(new Float32Array(H), [1, 1, H]),
          moe_in: f32(await trace.get(p, t, `moe_in.${l}`), [1, 1, H]),
          routing: f32(await trace.get(p, t, `expert_weights.${l}`), [2]),
        };
        for (const slot of [0, 1]) feedRows(feeds, slot, l, ids[slot]);
        yield { prompt: p, step: t, feeds, expected: { hidden_out: await trace.get(p, t, `moe_out.${l}`) }, served: { layer: l, experts: ids } };
      }
    }
  }
}

/**
 * The experts-prefill graph, per prefill chunk, layer and expert the chunk's tokens chose (ascending,
 * as HF runs them): fed moe_in and each token's weight for that expert (0 where it chose others),
 * and a zero running sum so that the expert's own numbers are compared (a residual of similar size
 * would dilute a wrong expert); gives weight · HF's output of that expert.
 */
async function* expertsPrefillCases(c: PhimoeConfig, entry: GraphEntry, trace: Trace, dir: string): AsyncGenerator<GateCase> {
  const feedRows = expertRowsFeeder(c, dir);
  const H = c.hidden;
  const n = entry.n;
  for (let p = 0; p < trace.meta.prompts.length; p++) {
    for (const { start, valid } of promptCalls(entry, trace.meta.prompts[p].prompt_tokens.length, trace.meta.prompts[p].steps)) {
      const steps = Array.from({ length: valid }, (_, r) => start + r);
      for (let l = 0; l < c.layers; l++) {
        const moeIn = await stackRows(trace, p, steps, n, `moe_in.${l}`, H);
        const chosen = await Promise.all(steps.map(async (t) => ({
          ids: await expertIds(c, trace, p, t, l), weights: await trace.get(p, t, `expert_weights.${l}`), outs: await trace.get(p, t, `expert_out.${l}`),
        })));
        for (const e of [...new Set(chosen.flatMap((x) => x.ids))].sort((a, b) => a - b)) {
          const routing = new Float32Array(n);
          const expected = new Float32Array(n * H);
          chosen.forEach(({ ids, weights, outs }, r) => {
            const slot = ids.indexOf(e);
            if (slot < 0) return;
            routing[r] = weights[slot];
            for (let i = 0; i < H; i++) expected[r * H + i] = weights[slot] * outs[slot * H + i];
          });
          const feeds: Record<string, Feed> = { acc: f32(new Float32Array(n * H), [1, n, H]), moe_in: f32(moeIn, [1, n, H]), routing: f32(routing, [n]) };
          feedRows(feeds, 0, l, e);
          yield { prompt: p, step: start, feeds, expected: { hidden_out: expected }, ...(valid < n ? { masks: { hidden_out: rowMask(1, n, H, valid) } } : {}), served: { layer: l, experts: [e] } };
        }
      }
    }
  }
}

async function* lmHeadCases(c: PhimoeConfig, trace: Trace): AsyncGenerator<GateCase> {
  for (let p = 0; p < trace.meta.prompts.length; p++) {
    for (let t = 0; t < trace.meta.prompts[p].steps; t++) {
      yield { prompt: p, step: t, feeds: { hidden: f32(await trace.get(p, t, `h.${c.layers}`), [1, 1, c.hidden]) }, expected: { logits: await trace.get(p, t, 'logits') } };
    }
  }
}

export function phimoeCases(c: PhimoeConfig, entry: GraphEntry, trace: Trace, maxContext: number, dir: string): AsyncGenerator<GateCase> {
  if (entry.role === ROLES.attnRouter) return attnRouterCases(c, entry, trace, maxContext);
  if (entry.role === ROLES.experts) return expertsCases(c, trace, dir);
  if (entry.role === ROLES.lmHead) return lmHeadCases(c, trace);
  if (entry.role === ROLES.attnRouterPrefill) return attnRouterPrefillCases(c, entry, trace, maxContext);
  if (entry.role === ROLES.expertsPrefill) return expertsPrefillCases(c, entry, trace, dir);
  throw new Error(`${entry.name}: role '${entry.role}' is not a phimoe graph's`);
}

/**
 * How phimoe_generate binds each graph: the attention+router graph threads the residual, reads and
 * writes its layer's KV cache and hands moe_in to the experts graph; the experts graph takes the
 * rows of the slot's expert of the current layer (no `layer`: the layer whose router ran last) and
 * the routing weights; the lm-head takes the last residual.
 */
/** The MoE input handed from attention to experts: one name per call size (its buffer holds N rows). */
const handoff = (entry: GraphEntry) => (entry.n === 1 ? 'moe_in' : 'moe_in_prefill');

export function phimoeBindings(c: PhimoeConfig, entry: GraphEntry, maxContext: number): GraphBindings {
  const state: GraphBindings['state'] = [];
  const rows = /^(expert_gate_up|expert_down)_([01])(_scale)?$/;
  const inputs = entry.inputs.map((t): ManifestGraph['inputs'][number] => {
    const kv = parseStateInput(t.name);
    if (kv && !kv.recurrent) {
      const name = stateName(kv);
      state.push({ name, kind: 'kv-cache', dtype: 'float32', shape: [1, c.kvHeads, maxContext, c.headDim], positionAxis: 2 });
      return { ...t, bind: 'state', state: name };
    }
    const r = rows.exec(t.name);
    if (r) {
      const table = r[1] === 'expert_gate_up' ? EXPERT_TABLES.gateUp : EXPERT_TABLES.down;
      return { ...t, bind: 'host-rows', table: r[3] ? scaleTable(table) : table, index: 'expert', slot: Number(r[2]) };
    }
    switch (t.name) {
      case 'hidden_in': case 'hidden': case 'attn_res': case 'acc': return { ...t, bind: 'residual' };
      case 'position': return { ...t, bind: 'positions' };
      case 'attn_mask': return { ...t, bind: 'mask' };
      case 'moe_in': return { ...t, bind: 'hand-off', handoff: handoff(entry) };
      case 'routing': return { ...t, bind: 'routing-weights' };
    }
    throw new Error(`${entry.name}: input ${t.name} has no binding`);
  });
  const outputs = entry.outputs.map((t): ManifestGraph['outputs'][number] => {
    const kv = parseStateOutput(t.name);
    if (kv && !kv.recurrent) return { ...t, bind: 'state-rows', state: stateName(kv), axis: 2 };
    switch (t.name) {
      case 'attn_res': case 'hidden_out': return { ...t, bind: 'residual' };
      case 'moe_in': return { ...t, bind: 'hand-off', handoff: handoff(entry) };
      case 'router_logits': return { ...t, bind: 'router-logits', layer: layerOf(entry), topK: 2 };
      case 'logits': return { ...t, bind: 'logits' };
    }
    throw new Error(`${entry.name}: output ${t.name} has no binding`);
  });
  return { inputs, outputs, state };
}
