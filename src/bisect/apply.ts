// `forge bisect --apply`: the chosen fix written into the recipe file as override lines. Kept
// simple: the recipe must be a JSON file this process may write; the lines go first in the list
// that applies to the arch (an override already there for the same matrices would otherwise win,
// the first match does), where the trial build put them too, so the recipe builds what was gated.
import { accessSync, constants, readFileSync, writeFileSync } from 'node:fs';
import type { Equalize, PrecisionOverride, Rescale } from '../recipe/schema.js';
import { parseRecipe } from '../recipe/load.js';

type ArchBlock = { overrides?: PrecisionOverride[]; rescale?: Rescale[]; equalize?: Equalize[]; handoff?: string };

/**
 * Reads the recipe file, lets `edit` change its arch blocks, checks the result as the loader would
 * and only then writes it: a bad line never reaches the file. `byHand`: what to tell the user when
 * the file cannot be written.
 */
function editRecipe(file: string, byHand: string, what: string, edit: (arch: Record<string, ArchBlock>) => void): void {
  try {
    accessSync(file, constants.W_OK);
  } catch (e) {
    throw new Error(`forge bisect --apply: ${file} is not a recipe file this process may write (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}); ${byHand}`);
  }
  const raw = JSON.parse(readFileSync(file, 'utf8')) as { arch?: Record<string, ArchBlock> };
  if (!raw.arch || typeof raw.arch !== 'object') throw new Error(`forge bisect --apply: ${file}: arch: missing, so there is no arch block to put the ${what} in`);
  edit(raw.arch);
  parseRecipe(JSON.parse(JSON.stringify(raw)), file);
  writeFileSync(file, JSON.stringify(raw, null, 2) + '\n');
}

export function applyOverrides(file: string, archId: string, overrides: PrecisionOverride[], rescale: Rescale[] = [], equalize: Equalize[] = []): { file: string; overrides: PrecisionOverride[]; rescale?: Rescale[]; equalize?: Equalize[] } {
  editRecipe(file, `add the override by hand: ${JSON.stringify(overrides)}`, 'override', (arch) => {
    // An arch's own `overrides` replaces the default's (archSettings merges the blocks key by key):
    // when it has one, that is the list the build reads.
    const block = Array.isArray(arch[archId]?.overrides) ? arch[archId] : (arch.default ??= {});
    const existing = block.overrides ?? [];
    const already = overrides.filter((o) => existing.some((e) => e.match === o.match && e.quant === o.quant));
    if (already.length) throw new Error(`forge bisect --apply: ${file}: arch.${block === arch[archId] ? archId : 'default'}.overrides already has ${already.map((o) => JSON.stringify(o.match)).join(', ')} (this fix was applied before)`);
    if (overrides.length) block.overrides = [...overrides, ...existing];
    if (rescale.length) {
      // The same rule for `rescale`: the arch's own list when it has one, first in it.
      const rb = Array.isArray(arch[archId]?.rescale) ? arch[archId] : (arch.default ??= {});
      const had = rb.rescale ?? [];
      if (had.some((h) => rescale.some((r) => r.match === h.match))) throw new Error(`forge bisect --apply: ${file}: its rescale list already has ${rescale.map((r) => JSON.stringify(r.match)).join(', ')} (this fix was applied before)`);
      rb.rescale = [...rescale, ...had];
    }
    if (equalize.length) {
      const eb = Array.isArray(arch[archId]?.equalize) ? arch[archId] : (arch.default ??= {});
      const had = eb.equalize ?? [];
      if (had.some((h) => equalize.some((r) => r.match === h.match))) throw new Error(`forge bisect --apply: ${file}: its equalize list already has ${equalize.map((r) => JSON.stringify(r.match)).join(', ')} (this fix was applied before)`);
      eb.equalize = [...equalize, ...had];
    }
  });
  return { file, overrides, ...(rescale.length ? { rescale } : {}), ...(equalize.length ? { equalize } : {}) };
}

/**
 * `--apply` for a hand-off fix: `handoff` set in the arch's own block (made when the recipe has
 * none), so the other archs keep theirs.
 */
export function applyHandoff(file: string, archId: string, handoff: 'f32'): { file: string; overrides: PrecisionOverride[]; handoff: 'f32' } {
  editRecipe(file, `set arch.${archId}.handoff to "${handoff}" by hand`, 'hand-off', (arch) => {
    const block = (arch[archId] ??= {});
    if (block.handoff === handoff) throw new Error(`forge bisect --apply: ${file}: arch.${archId}.handoff is already "${handoff}" (this fix was applied before)`);
    block.handoff = handoff;
  });
  return { file, overrides: [], handoff };
}
