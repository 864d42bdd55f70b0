// Tiny twins, made once per machine. A twin is a fixed function of oracles/make_twin.py, the modules
// it imports and the pinned Python environment (make_twin is seeded: byte-identical every time), so,
// like a hub download in the HF cache, it is kept outside the stage cache, under FORGE_HOME/twins,
// keyed by those files' bytes; the fetch stage copies it into its entry. A fresh stage cache (every
// test run's) then takes the twins from here instead of training each again (~3 min of CPU here).
import { cpSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { forgeHome } from '../paths.js';
import { sha256Hex } from '../engine/hash.js';
import { runPython } from '../toolchain/python.js';
import { requirementsFile } from '../toolchain/versions.js';

export const MAKE_TWIN = new URL('../../oracles/make_twin.py', import.meta.url);
// make_twin.py imports these: an edit to the corpus, the training or the vision twin's pictures
// makes the twins again (and, named by the fetch stage, re-keys its entry).
export const TWIN_MODULES = [new URL('../../oracles/twin_corpus.py', import.meta.url), new URL('../../oracles/twin_training.py', import.meta.url),
  new URL('../../oracles/twin_images.py', import.meta.url), new URL('../../oracles/pixels.py', import.meta.url)];

/** The file make_twin writes last of a twin (its margins): a store folder without it is not a twin. */
const LAST_WRITTEN = 'twin.json';

/** Where `twin` made by today's make_twin.py, modules and pinned environment is kept. */
export function twinStoreDir(twin: string): string {
  const sources = [MAKE_TWIN, ...TWIN_MODULES].map((u) => fileURLToPath(u)).concat(requirementsFile());
  const key = sha256Hex(sources.map((f) => `${f.slice(f.lastIndexOf('/') + 1)}\0${sha256Hex(readFileSync(f))}`).join('\n')).slice(0, 16);
  return join(forgeHome(), 'twins', `${twin}-${key}`);
}

/**
 * Copies the `twin` checkpoint into `out` (which must not exist), making it first when this
 * machine's store lacks it. Two builds making the same twin at once each make it in a folder of
 * their own; the first to finish is kept.
 */
export async function placeTwin(twin: string, out: string, log: (m: string) => void): Promise<{ made: boolean; peakRssBytes: number | null }> {
  const dir = twinStoreDir(twin);
  let made = false;
  let peakRssBytes: number | null = null;
  if (!existsSync(join(dir, LAST_WRITTEN))) {
    log(`making the tiny ${twin} twin (kept in ${dir} for later builds)`);
    mkdirSync(join(dir, '..'), { recursive: true });
    const own = `${dir}.making-${process.pid}`;
    rmSync(own, { recursive: true, force: true }); // a killed earlier try by a process of this pid
    try {
      const r = await runPython(fileURLToPath(MAKE_TWIN), ['--family', twin, '--out', own]);
      peakRssBytes = r.peakRssBytes;
      try {
        renameSync(own, dir);
      } catch (e) {
        // Another build made it meanwhile (the rename is atomic: a store folder is always whole).
        if (!existsSync(join(dir, LAST_WRITTEN))) throw e;
      }
      made = true;
    } finally {
      rmSync(own, { recursive: true, force: true });
    }
  } else {
    log(`the tiny ${twin} twin from ${dir} (made earlier on this machine by today's make_twin.py)`);
  }
  cpSync(dir, out, { recursive: true, errorOnExist: true, force: false });
  return { made, peakRssBytes };
}
