import { describe, it, expect } from 'vitest';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { codeFiles } from '../../src/engine/code-hash.js';

describe("a stage's code, for its cache key", () => {
  it('follows local imports (static, mixed and dynamic) and files read as code, not unrelated modules', () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-code-hash-'));
    const put = (name: string, text: string) => writeFileSync(join(dir, name), text);
    put('stage.ts', "import { b } from './b.js';\nimport { type T, t } from './types.js';\nexport const s = () => import('./lazy.js');\n");
    put('b.ts', "export const b = new URL('./kernels.wat', import.meta.url);\nimport x from 'some-package';\n");
    put('types.ts', 'export type T = number;\n');
    put('lazy.ts', 'export const l = 1;\n');
    put('kernels.wat', '(module)\n');
    put('unrelated.ts', 'export const u = 1;\n');
    expect(codeFiles(join(dir, 'stage.ts')).map((f) => f.slice(dir.length + 1))).toEqual(['b.ts', 'kernels.wat', 'lazy.ts', 'stage.ts', 'types.ts']);
  });

  it('covers the files stages run as code: the W8 kernels, and each oracle script', () => {
    const uses = (stage: string) => codeFiles(stage).map((f) => f.split('/').slice(-2).join('/')).filter((f) => /\.(wat|py)$/.test(f));
    expect(uses('src/export/stage.ts')).toEqual(['quant/w8-simd.wat']);
    // The twin factory with the corpus, training, pictures and pixels it imports; the NaN/Inf scan's kernel.
    expect(uses('src/hub/fetch-stage.ts')).toEqual(['oracles/make_twin.py', 'oracles/pixels.py', 'oracles/twin_corpus.py', 'oracles/twin_images.py', 'oracles/twin_training.py', 'quant/w8-simd.wat']);
    // The tracer with the modules it imports (captures, pixels, audio features, streamed weights), and the pictures and clips it draws.
    expect(uses('src/gates/trace-stage.ts')).toEqual(['oracles/audio_features.py', 'oracles/audio_prompt.py', 'oracles/pixels.py', 'oracles/streamed_weights.py', 'oracles/trace.py', 'oracles/trace_families.py', 'oracles/twin_audio.py', 'oracles/twin_images.py']);
    expect(uses('src/toolchain/qnn/compile-stage.ts')).toContain('oracles/qnn_compile.py');
    expect(uses('src/gates/emulation.ts')).toEqual(expect.arrayContaining(['oracles/qnn_compile.py', 'oracles/qnn_simulate.py']));
  });

  it('leaves out type-only imports: types are erased before anything runs', () => {
    const dir = mkdtempSync(join(tmpdir(), 'forge-code-hash-'));
    writeFileSync(join(dir, 'stage.ts'), "import type { T } from './types.js';\nexport type { U } from './more.js';\nimport { type V, w } from './mixed.js';\n");
    for (const f of ['types.ts', 'more.ts', 'mixed.ts']) writeFileSync(join(dir, f), 'export const x = 1;\n');
    expect(codeFiles(join(dir, 'stage.ts')).map((f) => f.slice(dir.length + 1))).toEqual(['mixed.ts', 'stage.ts']);
  });
});
