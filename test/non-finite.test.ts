// Done-when of issue 11 item 1, end to end on the tiny Qwen3 twin: a checkpoint with one Inf and one
// NaN weight fails at fetch naming the tensor; with the check disabled by the recipe the oracle's
// reference (the trace) refuses the non-finite outputs; and `forge publish --dry-run` refuses what
// either build left.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { openSafetensors } from '../src/io/safetensors.js';
import { f32ToBf16Bits } from '../src/io/dtype.js';
import { writeSafetensors } from '../src/io/safetensors-writer.js';
import { forge } from './helpers/forge-cli.js';
import { cacheRoot } from '../src/paths.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import { runOracleGate } from '../src/gates/oracle.js';
import { overwriteInitializer, readModel } from '../src/onnx/reader.js';
import { twinDir } from './helpers/twin.js';

const INF_TENSOR = 'model.layers.2.mlp.down_proj.weight';
const NAN_TENSOR = 'model.layers.1.self_attn.v_proj.weight';
let work: string;
let poisoned: string;
let twin: string;

/** Overwrite element `index` of a BF16 tensor in place. */
async function poison(file: string, tensor: string, index: number, value: number) {
  const st = await openSafetensors(file);
  const { fileOffset, dtype } = st.info(tensor);
  await st.close();
  expect(dtype).toBe('BF16');
  const bytes = readFileSync(file);
  bytes.writeUInt16LE(f32ToBf16Bits(value), fileOffset + 2 * index);
  writeFileSync(file, bytes);
}

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'forge-nonfinite-'));
  twin = join(work, 'twin');
  cpSync(await twinDir('qwen3'), twin, { recursive: true });
  poisoned = join(work, 'poisoned');
  cpSync(twin, poisoned, { recursive: true });
  await poison(join(poisoned, 'model.safetensors'), INF_TENSOR, 70, Infinity);
  await poison(join(poisoned, 'model.safetensors'), NAN_TENSOR, 3, NaN);
}, 300_000);
afterAll(() => rmSync(work, { recursive: true, force: true }));

async function buildPoisoned(id: string, allowNonFinite?: { reason: string }, path = poisoned, until?: string) {
  const r = JSON.parse(readFileSync('recipes/tiny-qwen3/recipe.json', 'utf8'));
  r.id = id;
  r.source = { kind: 'local', path, ...(allowNonFinite ? { allowNonFinite } : {}) };
  const recipes = join(work, 'recipes');
  mkdirSync(join(recipes, id), { recursive: true });
  writeFileSync(join(recipes, id, 'recipe.json'), JSON.stringify(r));
  const prev = process.env.FORGE_RECIPES;
  process.env.FORGE_RECIPES = recipes;
  try {
    const out = join(work, 'out', id);
    return { record: await build({ recipe: id, arch: 'v81', out, progress: silentProgress, ...(until ? { until } : {}) }), out };
  } finally {
    // Assigning undefined would store the string "undefined".
    if (prev === undefined) delete process.env.FORGE_RECIPES;
    else process.env.FORGE_RECIPES = prev;
  }
}

describe('a checkpoint with an Inf and a NaN weight', () => {
  it('fails at fetch naming the file, the first poisoned tensor in file order, the index and the value', async () => {
    const { record, out } = await buildPoisoned('nonfinite-checked');
    expect(record.ok).toBe(false);
    expect(record.stages.find((s) => s.name === 'fetch')!.status).toBe('failed');
    // Header (file) order puts layer 1's v_proj before layer 2's down_proj.
    expect(record.error).toContain(`${join(poisoned, 'model.safetensors')}: tensor "${NAN_TENSOR}": NaN at flat index 3 of 4096 (BF16)`);
    expect(readdirSync(out)).toEqual(['build']);
    const pub = await forge(['publish', out, '--repo', 'forge-test/nonfinite', '--dry-run']);
    expect(pub.code).not.toBe(0);
    expect(pub.stderr).toMatch(/refusing to publish .*the build did not pass .*NaN at flat index 3/);
  }, 300_000);

  it('is refused at fetch from the scan the content digest made, once the files are older than its racy window', async () => {
    await new Promise((r) => setTimeout(r, 2100)); // the first build's digest kept nothing: the files were fresh
    const { record } = await buildPoisoned('nonfinite-fused');
    const fetch = record.stages.find((s) => s.name === 'fetch')!;
    expect(fetch.status).toBe('failed');
    expect(record.error).toContain(`${join(poisoned, 'model.safetensors')}: tensor "${NAN_TENSOR}": NaN at flat index 3 of 4096 (BF16)`);
    const log = readFileSync(join(cacheRoot(), 'fetch', 'logs', `${fetch.key}.log`), 'utf8');
    expect(log).toContain('its NaN/Inf scan was made as the content digest read it');
  }, 300_000);

  it('with source.allowNonFinite, the oracle refuses the non-finite reference outputs, naming prompt, step and tensor', async () => {
    const { record, out } = await buildPoisoned('nonfinite-allowed', { reason: 'test: the gates must catch it' });
    expect(record.ok).toBe(false);
    expect(record.stages.find((s) => s.name === 'fetch')!.status).toBe('ran');
    expect((record.summaries.fetch as any).finite).toEqual({ checked: false, reason: 'test: the gates must catch it' });
    expect(record.stages.find((s) => s.name === 'trace')!.status).toBe('failed');
    expect(record.error).not.toContain('\n'); // the script's own refusal, one line
    expect(record.error).toMatch(/the Hugging Face reference is not finite.*prompt 0 .* step 0: v\.1 \(layer 1's new value row\) holds 1 non-finite value of 64 \(first at index 0: nan\)/);
    expect(record.gates?.oracle?.ok).not.toBe(true);
    expect(readdirSync(out)).toEqual(['build']);
    const pub = await forge(['publish', out, '--repo', 'forge-test/nonfinite', '--dry-run']);
    expect(pub.code).not.toBe(0);
    expect(pub.stderr).toMatch(/refusing to publish [^]*gate oracle is missing from build\/run.json/);
  }, 600_000);
});

describe('an Inf in a tensor no graph reads', () => {
  it('builds through the oracle gate, the fetch summary counting that tensor as not checked; the same Inf in a read tensor is refused', async () => {
    // The clean twin with one more f32 tensor (a clip bound, +Inf) that no qwen3 graph or host table reads.
    const extra = 'model.audio_tower.clip.input_max';
    const withUnread = join(work, 'unread');
    cpSync(twin, withUnread, { recursive: true });
    const file = join(withUnread, 'model.safetensors');
    const st = await openSafetensors(file);
    const tensors = [];
    for (const name of st.tensors.keys()) {
      const t = st.info(name);
      tensors.push({ name, dtype: t.dtype, shape: t.shape, data: new Uint8Array(await st.read(name)) });
    }
    await st.close();
    await writeSafetensors(file, [{ name: extra, dtype: 'F32', shape: [1], data: Float32Array.from([Infinity]) }, ...tensors]);
    const { record } = await buildPoisoned('nonfinite-unread', undefined, withUnread, 'oracle');
    expect(record.error).toBeUndefined();
    expect(record.gates?.oracle?.ok).toBe(true);
    const fetch = record.summaries.fetch as any;
    expect(fetch.finite).toMatchObject({ checked: true, tensors: fetch.tensors, notRead: { tensors: 1, bytes: 4, under: { [extra]: 1 } } });
    const key = record.stages.find((s) => s.name === 'fetch')!.key;
    expect(readFileSync(join(cacheRoot(), 'fetch', 'logs', `${key}.log`), 'utf8')).toContain(`not checked: 1 floating tensors nothing reads (0.00 MB): ${extra}`);
    // The NaN and Inf of the poisoned copy sit in tensors the graphs read: still refused at fetch.
    const refused = await buildPoisoned('nonfinite-read', undefined, poisoned, 'fetch');
    expect(refused.record.stages.find((s) => s.name === 'fetch')!.status).toBe('failed');
    expect(refused.record.error).toContain(`tensor "${NAN_TENSOR}": NaN at flat index 3 of 4096 (BF16)`);
  }, 600_000);
});

describe('the oracle gate over graphs that output NaN', () => {
  it("fails the output, naming graph, prompt, step, count and first index in forge's output, and counts no top-1 agreement", async () => {
    const r = await build({ recipe: 'tiny-qwen3', arch: 'v81', until: 'oracle', out: join(work, 'out', 'clean'), progress: silentProgress });
    if (!r.ok) throw new Error(r.error);
    const entry = (id: string) => join(cacheRoot(), id, r.stages.find((s) => s.name === id)!.key!);
    const graphs = join(work, 'nan-export');
    cpSync(entry('export'), graphs, { recursive: true });
    // The lm-head's first weight row → logit 0 is NaN at every step, the other logits are untouched.
    // The reference reads the checkpoint's bf16 weight in place (cpSync made the copy its own file).
    const lmHead = join(graphs, 'lm_head.onnx');
    const weight = readModel(lmHead).initializers().find((t) => t.dtype === 'bfloat16')!;
    const w = readModel(lmHead).initializerData(weight.name) as Uint16Array;
    overwriteInitializer(lmHead, weight.name, Uint16Array.from(w, (x, i) => (i === 0 ? 0x7fc0 : x)));
    const result = await runOracleGate('qwen3', readCheckpointRef(entry('fetch')).absDir, entry('trace'), [{ label: 'export', dir: graphs, minCosine: 0.99 }], 0.9, join(work, 'scratch'));
    expect(result.ok).toBe(false);
    const bad = result.rows.filter((row) => !row.ok);
    expect(bad.map((row) => `${row.graph}/${row.output}`)).toEqual(['lm_head/logits']);
    expect(bad[0].nonFinite).toBe("lm_head prompt 0 step 0 output logits: 1 non-finite value in forge's output (first at index 0)");
    expect(result.graphs['export:fp32/lm_head']).toMatchObject({ ok: false, top1: expect.stringMatching(/^0\//) });
    // The prompts are shorter than a prefill chunk: its padding rows are masked out, not NaN, and it passes.
    expect(result.graphs['export:fp32/shard0.decode'].ok).toBe(true);
    expect(result.graphs['export:fp32/shard0.prefill'].ok).toBe(true);
  }, 600_000);
});
