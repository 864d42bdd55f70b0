import { describe, it, expect } from 'vitest';
import { readFileSync } from 'node:fs';
import { manifestJsonSchema, ManifestSchema } from '../src/bundle/manifest.js';
import { SEED } from './helpers/manifest-seed.js';

describe('manifest.schema.json', () => {
  it('is what the zod schema generates (run `npm run manifest-schema` after changing src/bundle/manifest.ts)', () => {
    expect(JSON.parse(readFileSync('src/bundle/manifest.schema.json', 'utf8'))).toEqual(manifestJsonSchema());
  });
});

/** The seed with `edit` applied to a deep copy. */
function edited(edit: (m: any) => void): unknown {
  const m = structuredClone(SEED) as any;
  edit(m);
  return m;
}

/** The first issue's path and message, or null when the manifest is accepted. */
function refusal(doc: unknown): string | null {
  const r = ManifestSchema.safeParse(doc);
  return r.success ? null : `${r.error.issues[0].path.join('.')}: ${r.error.issues[0].message}`;
}

describe('manifest v2', () => {
  it('accepts the seed and refuses a v1 manifest by its version', () => {
    expect(refusal(SEED)).toBeNull();
    expect(refusal(edited((m) => (m.version = 1)))).toMatch(/^version: /);
  });

  it('leaves host-ops and roles open (the runtime registry decides) but well-formed', () => {
    expect(refusal(edited((m) => (m.hostOp = 'phimoe_generate')))).toBeNull();
    expect(refusal(edited((m) => (m.contexts[0].graphs[0].role = 'attn_router')))).toBeNull();
    expect(refusal(edited((m) => (m.hostOp = 'Phi MoE')))).toMatch(/^hostOp: a lowercase identifier/);
    expect(refusal(edited((m) => delete m.contexts[0].graphs[0].component))).toMatch(/^contexts\.0\.graphs\.0\.component: /);
  });

  it('types the bindings a later host-op needs: host-table rows, routing, encoders, images, audio', () => {
    const t = (name: string, bind: string, extra: object = {}) => ({ name, dtype: 'float32', shape: [1, 4], bind, ...extra });
    const ok = edited((m) => {
      m.hostTables.push({ name: 'experts.w', use: 'expert-weights', file: 'experts.w.bin', sha256: 'f'.repeat(64), dtype: 'int8', shape: [1, 2, 4, 4] });
      m.contexts[0].graphs[0].inputs.push(
        t('w', 'host-rows', { table: 'experts.w', index: 'expert', layer: 0, slot: 1 }), t('rw', 'routing-weights', { layer: 0 }),
        t('img', 'encoder-output', { component: 'vision' }));
      m.contexts[0].graphs[0].outputs.push(t('router', 'router-logits', { layer: 0, topK: 2 }));
      const vision = { name: 'vision', component: 'vision', role: 'encoder', tokens: 1, file: 'vision.onnx', sha256: 'f'.repeat(64), quant: SEED.contexts[0].graphs[0].quant };
      m.contexts.unshift({ name: 'vision', files: [], graphs: [{ ...vision, inputs: [t('px', 'pixels'), t('mel', 'audio-features'), t('pcm', 'audio-samples')], outputs: [t('feat', 'encoder-output')] }] });
      m.state[0].window = 4;
      m.state[0].shared = true;
    });
    expect(refusal(ok)).toBeNull();
    expect(refusal(edited((m) => m.contexts[0].graphs[0].inputs.push(t('w', 'host-rows', { table: 'x', index: 'layer' }))))).toMatch(/index: /);
    expect(refusal(edited((m) => m.contexts[0].graphs[0].outputs.push(t('r', 'router-logits', { layer: 0 }))))).toMatch(/topK: /);
  });

  it('refuses a binding to an undeclared host table, state, encoder component or router, naming its path', () => {
    const row = { name: 'w', dtype: 'int8', shape: [2, 4], bind: 'host-rows', table: 'experts.w', index: 'expert', layer: 0, slot: 0 };
    expect(refusal(edited((m) => m.contexts[0].graphs[0].inputs.push(row)))).toBe("contexts.0.graphs.0.inputs.5.table: 'experts.w' is not a declared host table");
    expect(refusal(edited((m) => (m.contexts[0].graphs[0].inputs[3].state = 'kv.9.k')))).toBe("contexts.0.graphs.0.inputs.3.state: 'kv.9.k' is not a declared state");
    expect(refusal(edited((m) => (m.contexts[0].graphs[0].outputs[1].state = 'kv.9.k')))).toBe("contexts.0.graphs.0.outputs.1.state: 'kv.9.k' is not a declared state");
    const enc = { name: 'img', dtype: 'float32', shape: [1, 4], bind: 'encoder-output', component: 'vision' };
    expect(refusal(edited((m) => m.contexts[0].graphs[0].inputs.push(enc)))).toBe("contexts.0.graphs.0.inputs.5.component: 'vision' is not a component of this manifest");
    expect(refusal(edited((m) => m.contexts[0].graphs[0].inputs.push({ ...enc, component: 'lm_head' })))).toBe("contexts.0.graphs.0.inputs.5.component: component 'lm_head' gives no encoder-output");
    const rw = { name: 'rw', dtype: 'float32', shape: [2], bind: 'routing-weights', layer: 0 };
    expect(refusal(edited((m) => m.contexts[0].graphs[0].inputs.push(rw)))).toBe('contexts.0.graphs.0.inputs.5.layer: no graph gives router-logits for layer 0');
  });

  it('declares host tables by use and dtype, any rank, names unique', () => {
    expect(refusal(edited((m) => (m.hostTables[0].use = 'weights')))).toMatch(/^hostTables\.0\.use: /);
    expect(refusal(edited((m) => (m.hostTables[0].dtype = 'uint8')))).toMatch(/^hostTables\.0\.dtype: /);
    expect(refusal(edited((m) => (m.hostTables[0].shape = [32])))).toBeNull();
    expect(refusal(edited((m) => m.hostTables.push({ ...m.hostTables[0] })))).toBe('hostTables: host table names are unique');
  });

  it('records the chat wrap as {prefix, suffix} strings, or null without a template', () => {
    expect(refusal(edited((m) => (m.tokenizer.chat = { prefix: '<|user|>\n', suffix: '<|end|>\n<|assistant|>\n' })))).toBeNull();
    expect(refusal(edited((m) => (m.tokenizer.chat = { prefix: '', suffix: '' })))).toBeNull();
    expect(refusal(edited((m) => delete m.tokenizer.chat))).toMatch(/^tokenizer\.chat: /);
    expect(refusal(edited((m) => (m.tokenizer.chat = { prefix: '<|user|>\n' })))).toMatch(/^tokenizer\.chat\.suffix: /);
    expect(refusal(edited((m) => (m.tokenizer.chat = { prefix: 1, suffix: '' })))).toMatch(/^tokenizer\.chat\.prefix: /);
    expect(refusal(edited((m) => (m.tokenizer.chat = { prefix: '', suffix: '', system: '' })))).toMatch(/^tokenizer\.chat: /);
  });

  it('records the wraps for the template\'s switches (chatOptions) only beside a chat wrap, each combination once', () => {
    const wrap = { prefix: '<|im_start|>user\n', suffix: '<|im_end|>\n<|im_start|>assistant\n' };
    const off = { options: { enable_thinking: false }, prefix: wrap.prefix, suffix: wrap.suffix + '<think>\n\n</think>\n\n' };
    const on = { options: { enable_thinking: true }, ...wrap };
    const withChat = (edit: (t: any) => void) => edited((m) => {
      m.tokenizer.chat = wrap;
      edit(m.tokenizer);
    });
    expect(refusal(withChat((t) => (t.chatOptions = [on, off])))).toBeNull();
    expect(refusal(withChat((t) => (t.chatOptionsNotApplied = 'the template reads 4 switches')))).toBeNull();
    expect(refusal(edited((m) => ((m.tokenizer.chat = null), (m.tokenizer.chatOptions = [off]))))).toMatch(/^tokenizer\.chatOptions: given without a chat wrap/);
    expect(refusal(withChat((t) => (t.chatOptions = [off, off])))).toBe('tokenizer.chatOptions: each combination of options appears once');
    expect(refusal(withChat((t) => ((t.chatOptions = [off]), (t.chatOptionsNotApplied = 'why'))))).toMatch(/^tokenizer\.chatOptionsNotApplied: given with chatOptions/);
    expect(refusal(withChat((t) => (t.chatOptions = [{ ...off, options: {} }])))).toMatch(/^tokenizer\.chatOptions\.0\.options: names at least one switch/);
    expect(refusal(withChat((t) => (t.chatOptions = [{ ...off, options: { enable_thinking: 'no' } }])))).toMatch(/^tokenizer\.chatOptions\.0\.options\.enable_thinking: /);
    expect(refusal(withChat((t) => (t.chatOptions = [{ ...off, system: '' }])))).toMatch(/^tokenizer\.chatOptions\.0: /);
  });
});
