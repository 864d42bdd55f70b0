// Stage `native`: the C++ runtime built for this machine (native/, CMake). The build itself lives in
// FORGE_HOME keyed by the hash of native/'s sources (toolchain/native.ts); this stage records which
// build a pipeline used, so the parity gate re-runs when the runtime changes.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import { ensureNative } from '../toolchain/native.js';
import { sha256OfFile } from '../engine/hash.js';

export interface NativeParams {
  /** Hash of native/'s sources, so an edited runtime is a new key. */
  sources: string;
}

export interface NativeRecord {
  qhxGenerate: string;
  buildDir: string;
  sha256: string;
}

export const stage: StageModule<NativeParams> = {
  name: 'native',
  version: '1',
  async run(ctx) {
    ctx.log('building the native runtime (cached per source change)');
    const b = await ensureNative();
    const record: NativeRecord = { ...b, sha256: await sha256OfFile(b.qhxGenerate) };
    await writeFile(join(ctx.out, 'native.json'), JSON.stringify(record, null, 2));
    return { summary: { qhxGenerate: b.qhxGenerate } };
  },
};
