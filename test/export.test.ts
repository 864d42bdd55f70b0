import { describe, it, expect, beforeAll } from 'vitest';
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { readModel, overwriteInitializer } from '../src/onnx/reader.js';
import { checkExportedGraphs } from './helpers/check-graphs.js';
import { venvPython } from '../src/toolchain/venv.js';
import { openCheckpoint } from '../src/io/checkpoint.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import { checkIoNames, layoutOf, type ExportManifest } from '../src/export/graphs.js';
import { runExport } from '../src/export/stage.js';
import { getFamily } from '../src/families/index.js';
import { allTensors, componentTensors, modelTensors } from '../src/families/tensors.js';
import { runOracleGate, firstMiss } from '../src/gates/oracle.js';
import type { RunRecord } from '../src/engine/record.js';
import { assembleBundle } from '../src/bundle/assemble.js';
import { loadRecipe, archSettings } from '../src/recipe/load.js';
import { sha256OfFile } from '../src/engine/hash.js';

let record: RunRecord;
const entry = (id: string) => join(cacheRoot(), id, record.stages.find((s) => s.name === id)!.key!);
const manifest = (dir: string) => JSON.parse(readFileSync(join(dir, 'graphs.json'), 'utf8')) as ExportManifest;

beforeAll(async () => {
  record = await build({ recipe: 'tiny-qwen3', arch: 'v81', out: mkdtempSync(join(tmpdir(), 'forge-export-')), progress: silentProgress });
  expect(record.ok).toBe(true);
}, 600_000);

describe('export', () => {
  it('writes graphs that pass the full onnx.checker', async () => {
    for (const id of ['export', 'quantize']) expect(await checkExportedGraphs(entry(id))).toBeGreaterThan(0);
  });

  it('stores W8 weights as MatMulNBits(bits=8): uint8 codes [out, blocks, block] with one scale per output row', () => {
    const m = readModel(join(entry('quantize'), 'shard0.decode.onnx'));
    const name = 'model.layers.0.mlp.gate_proj.weight';
    const w = m.initializers().find((t) => t.name === name)!;
    const scale = m.initializers().find((t) => t.name === `${name}.scale`)!;
    expect(w.dtype).toBe('uint8');
    const [out, blocks, block] = w.dims;
    expect(out * blocks * block).toBe(out * 64); // in-features of the twin's MLP input: hidden 64
    expect(scale).toMatchObject({ dtype: 'float32', dims: [out * blocks] });
    const node = m.nodes().find((n) => n.opType === 'MatMulNBits' && n.inputs[1] === name)!;
    expect(node).toMatchObject({ domain: 'com.microsoft', attrs: { bits: 8, K: 64, N: out, block_size: block } });
    const s = m.initializerData(`${name}.scale`) as Float32Array;
    for (let r = 0; r < out; r++) expect(new Set(s.subarray(r * blocks, (r + 1) * blocks)).size).toBe(1);
    expect(m.nodes().some((n) => n.opType === 'DequantizeLinear')).toBe(false);
  });

  it('keeps one copy of a shard\'s weights, shared by its prefill and decode graphs', () => {
    const mf = manifest(entry('quantize'));
    const shard = mf.contexts[0];
    expect(shard.graphs.map((g) => g.name)).toEqual(['shard0.prefill', 'shard0.decode']);
    const locations = (file: string) => new Set(readModel(join(entry('quantize'), file)).initializers().flatMap((t) => (t.external ? [t.external.location] : [])));
    expect([...locations('shard0.prefill.onnx')]).toEqual(['shard0.data']);
    expect([...locations('shard0.decode.onnx')]).toEqual(['shard0.data']);
    const plan = JSON.parse(readFileSync(join(entry('plan'), 'plan.json'), 'utf8'));
    // The plan's byte estimate is what lands on disk, less alignment padding and the small float tensors kept inline.
    expect(shard.dataBytes).toBeGreaterThan(plan.shards[0].weightBytes * 0.9);
    expect(shard.dataBytes).toBeLessThan(plan.shards[0].weightBytes * 1.5);
  });

  it('writes the reference graphs, not weights: they read the checkpoint\'s own file, hard-linked into the cache entry', async () => {
    const mf = manifest(entry('export'));
    const ckptDir = readCheckpointRef(entry('fetch')).absDir;
    expect(mf.linked).toEqual([{ file: 'model.safetensors', bytes: statSync(join(ckptDir, 'model.safetensors')).size, how: 'hardlink' }]);
    // Survived the cache's rename of the entry: still the checkpoint's inode.
    expect(statSync(join(entry('export'), 'model.safetensors')).ino).toBe(statSync(join(ckptDir, 'model.safetensors')).ino);
    for (const c of mf.contexts) {
      expect(c, c.name).toMatchObject({ dataBytes: 0, linked: ['model.safetensors'] });
      expect(c.data).toBeUndefined();
    }
    expect(readdirSync(entry('export')).filter((f) => f.endsWith('.data'))).toEqual([]);
    const ckpt = await openCheckpoint(ckptDir);
    const m = readModel(join(entry('export'), 'shard0.decode.onnx'));
    for (const t of m.initializers().filter((i) => i.external)) {
      expect(t.external, t.name).toEqual({ location: 'model.safetensors', offset: ckpt.info(t.name).fileOffset, length: ckpt.info(t.name).byteLength });
      expect(t.dtype).toBe('bfloat16');
    }
    await ckpt.close();
  });

  it('assembles the reference graphs into a bundle whose context files are the linked checkpoint file, with the sha256 the cache recorded', async () => {
    const { recipe } = loadRecipe('tiny-qwen3');
    const { arch } = archSettings(recipe, 'v81');
    const ckptDir = readCheckpointRef(entry('fetch')).absDir;
    const input = { recipe, arch, graphsDir: entry('export'), embeddingDir: entry('quantize'), checkpointDir: ckptDir, maxNewTokens: 4 };
    const out = mkdtempSync(join(tmpdir(), 'forge-ref-bundle-'));
    const m = await assembleBundle(input, join(out, 'a'));
    const file = join(ckptDir, 'model.safetensors');
    for (const c of m.contexts) expect(c.files, c.name).toEqual([{ path: 'model.safetensors', bytes: statSync(file).size, sha256: await sha256OfFile(file) }]);
    expect(statSync(join(out, 'a', 'model.safetensors')).ino).toBe(statSync(file).ino);
    // The recorded digest is taken, not recomputed (a checkpoint's GBs are not hashed per gate run):
    // shown by a copy of the export whose record says otherwise for a file of the recorded size.
    const copy = join(out, 'export');
    cpSync(entry('export'), copy, { recursive: true });
    const meta = JSON.parse(readFileSync(join(copy, 'meta.json'), 'utf8'));
    meta.files['model.safetensors'].sha256 = 'f'.repeat(64);
    writeFileSync(join(copy, 'meta.json'), JSON.stringify(meta));
    expect((await assembleBundle({ ...input, graphsDir: copy }, join(out, 'b'))).contexts[0].files[0].sha256).toBe('f'.repeat(64));
    // A file whose size is not the recorded one is hashed.
    meta.files['model.safetensors'].size += 1;
    writeFileSync(join(copy, 'meta.json'), JSON.stringify(meta));
    expect((await assembleBundle({ ...input, graphsDir: copy }, join(out, 'c'))).contexts[0].files[0].sha256).toBe(await sha256OfFile(file));
    rmSync(out, { recursive: true });
  });

  it('writes the embedding as a host f16 table equal to the checkpoint\'s', async () => {
    const ckpt = await openCheckpoint(readCheckpointRef(entry('fetch')).absDir);
    const want = await ckpt.readF16('model.embed_tokens.weight');
    await ckpt.close();
    const got = new Uint16Array(readFileSync(join(entry('quantize'), 'embedding.f16.bin')).buffer.slice(0));
    expect(got).toEqual(want);
  });

  it('names every graph input and output as a C identifier (what the QAIRT converter keeps), and refuses any other name', () => {
    for (const c of manifest(entry('quantize')).contexts) {
      for (const g of c.graphs) for (const t of [...g.inputs, ...g.outputs]) expect(t.name, `${g.name}: ${t.name}`).toMatch(/^[A-Za-z_][A-Za-z0-9_]*$/);
    }
    expect(() => checkIoNames('shard0.decode', { inputs: [{ name: 'past_k.0', dtype: 'float32', shape: [1] }], outputs: [], probes: {} }))
      .toThrow("shard0.decode: graph input/output 'past_k.0' is not a C identifier");
  });

  it('gives byte-identical graphs when run twice', async () => {
    const ckptDir = readCheckpointRef(entry('fetch')).absDir;
    const plan = JSON.parse(readFileSync(join(entry('plan'), 'plan.json'), 'utf8'));
    const params = { family: 'qwen3' as const, scheme: 'w8' as const, lmHeadScheme: 'fp16' as const, maxContext: 128, prefillLength: 8, hostTables: true };
    const ui = { log() {}, progress() {} };
    const a = mkdtempSync(join(tmpdir(), 'forge-exp-a-'));
    const b = mkdtempSync(join(tmpdir(), 'forge-exp-b-'));
    await runExport(params, ckptDir, plan, a, ui);
    await runExport(params, ckptDir, plan, b, ui);
    for (const f of readdirSync(a)) expect(readFileSync(join(b, f)).equals(readFileSync(join(a, f))), f).toBe(true);
  });
});

describe('components', () => {
  it('derives each component\'s tensors from its builder: exactly the checkpoint tensors its exported graphs hold, and the host table\'s', async () => {
    const ckpt = await openCheckpoint(readCheckpointRef(entry('fetch')).absDir);
    try {
      const family = getFamily('qwen3');
      const config = family.parseConfig(JSON.parse(readFileSync(join(readCheckpointRef(entry('fetch')).absDir, 'config.json'), 'utf8')), 'config.json');
      const plan = JSON.parse(readFileSync(join(entry('plan'), 'plan.json'), 'utf8'));
      const mf = manifest(entry('quantize'));
      const components = family.components(config, layoutOf(plan, { prefillLength: 8, maxContext: mf.maxContext }));
      expect(components.map((c) => c.name)).toEqual(mf.contexts.map((c) => c.name));
      const everyRead = new Set<string>(['model.embed_tokens.weight']); // the host table
      for (const [i, c] of components.entries()) {
        const read = new Set<string>();
        for (const g of mf.contexts[i].graphs) for (const t of readModel(join(entry('quantize'), g.file)).initializers()) if (ckpt.has(t.name)) read.add(t.name);
        for (const t of read) everyRead.add(t);
        const derived = await componentTensors(c);
        expect(derived.map((t) => t.name).sort(), c.name).toEqual([...read].sort());
        for (const t of derived) expect(t.shape, t.name).toEqual(ckpt.info(t.name).shape);
      }
      // Every tensor the model reads, the checkpoint check's list, is the graphs' plus the host table's.
      const all = allTensors(await modelTensors(family, config)).map((t) => t.name);
      expect(all.sort()).toEqual([...everyRead].sort());
    } finally {
      await ckpt.close();
    }
  });

  it('leaves out the graphs the plan dropped, and writes host tables from the family\'s list', async () => {
    const ckptDir = readCheckpointRef(entry('fetch')).absDir;
    const plan = JSON.parse(readFileSync(join(entry('plan'), 'plan.json'), 'utf8'));
    const params = { family: 'qwen3' as const, scheme: 'fp32' as const, lmHeadScheme: 'fp32' as const, maxContext: 128, prefillLength: 8, hostTables: true };
    const out = mkdtempSync(join(tmpdir(), 'forge-exp-drop-'));
    try {
      const m = await runExport(params, ckptDir, { ...plan, dropped: [{ graph: 'shard0.prefill', why: 'test' }] }, out, { log() {}, progress() {} });
      expect(m.contexts.map((c) => c.graphs.map((g) => g.name))).toEqual([['shard0.decode'], ['lm_head']]);
      expect(m.contexts[0].graphs[0]).toMatchObject({ component: 'shard0', variant: 'decode', n: 1, scheme: 'fp32', stream: { input: 'hidden_in', from: null, output: 'hidden_out', to: 'final' } });
      const [vocab, hidden] = manifest(entry('quantize')).hostTables![0].shape;
      expect(m.hostTables).toEqual([{ name: 'embedding', file: 'embedding.f16.bin', dtype: 'float16', shape: [vocab, hidden] }]);
      expect(m.embedding).toEqual({ file: 'embedding.f16.bin', dtype: 'float16', shape: [vocab, hidden] });
      expect(statSync(join(out, 'embedding.f16.bin')).size).toBe(vocab * hidden * 2);
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});

describe('oracle gate', () => {
  it('passes the tiny twin with the figures in the run record', () => {
    const g = record.gates.oracle as any;
    expect(g.ok).toBe(true);
    expect(g.graphs['export:fp32/shard0.decode'].minCosine).toBeGreaterThanOrEqual(0.99999);
    expect(g.graphs['quantize:w8/shard0.decode'].minCosine).toBeGreaterThanOrEqual(0.999);
    expect(g.graphs['export:fp32/lm_head'].top1).toMatch(/^(\d+)\/\1$/);
  });

  it('fails on a copy with one perturbed layer, and names that layer first', async () => {
    const work = mkdtempSync(join(tmpdir(), 'forge-corrupt-'));
    const copy = join(work, 'export');
    cpSync(entry('export'), copy, { recursive: true });
    const name = 'model.layers.2.self_attn.o_proj.weight';
    const m = readModel(join(copy, 'shard0.decode.onnx'));
    // The reference graphs hold the checkpoint's bf16 bytes (cpSync made a copy of the linked file): flip signs.
    expect(m.initializer(name).dtype).toBe('bfloat16');
    const w = m.initializerData(name) as Uint16Array;
    const perturbed = Uint16Array.from(w, (x, i) => (i % 3 === 0 ? x ^ 0x8000 : x));
    overwriteInitializer(join(copy, 'shard0.decode.onnx'), name, perturbed);
    const result = await runOracleGate('qwen3', readCheckpointRef(entry('fetch')).absDir, entry('trace'),
      [{ label: 'export', dir: copy, minCosine: 0.99999 }], 1, join(work, 'scratch'));
    expect(result.ok).toBe(false);
    const miss = firstMiss(result.rows)!;
    expect(miss).toMatchObject({ graph: 'shard0.decode', layer: '2', output: 'h.3' });
    // Layers before it still match; the prefill graph shares the data file, so it fails too.
    expect(result.rows.filter((r) => r.graph === 'shard0.decode' && Number(r.layer) < 2).every((r) => r.ok)).toBe(true);
    expect(result.graphs['export:fp32/shard0.prefill'].ok).toBe(false);
  });
});
