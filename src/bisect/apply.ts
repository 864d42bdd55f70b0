// `forge bisect --apply`: the chosen fix written into the recipe file as override lines. Kept
// simple: the recipe must be a JSON file this process may write; the lines go first in the list
// that applies to the arch (an override already there for the same matrices would otherwise win,
// the first match does), where the trial build put them too, so the recipe builds what was gated.
import { accessSync, constants, readFileSync, writeFileSync } from 'node:fs';
import type { PrecisionOverride, Rescale } from '../recipe/schema.js';
import { parseRecipe } from '../recipe/load.js';

export function applyOverrides(file: string, archId: string, overrides: PrecisionOverride[], rescale: Rescale[] = []): { file: string; overrides: PrecisionOverride[]; rescale?: Rescale[] } {
  try {
    accessSync(file, constants.W_OK);
  } catch (e) {
    throw new Error(`forge bisect --apply: ${file} is not a recipe file this process may write (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}); add the override by hand: ${JSON.stringify(overrides)}`);
  }
  const raw = JSON.parse(readFileSync(file, 'utf8')) as { arch?: Record<string, { overrides?: PrecisionOverride[]; rescale?: Rescale[] }> };
  if (!raw.arch || typeof raw.arch !== 'object') throw new Error(`forge bisect --apply: ${file}: arch: missing, so there is no arch block to put the override in`);
  // An arch's own `overrides` replaces the default's (archSettings merges the blocks key by key):
  // when it has one, that is the list the build reads.
  const block = Array.isArray(raw.arch[archId]?.overrides) ? raw.arch[archId] : (raw.arch.default ??= {});
  const existing = block.overrides ?? [];
  const already = overrides.filter((o) => existing.some((e) => e.match === o.match && e.quant === o.quant));
  if (already.length) throw new Error(`forge bisect --apply: ${file}: arch.${block === raw.arch[archId] ? archId : 'default'}.overrides already has ${already.map((o) => JSON.stringify(o.match)).join(', ')} (this fix was applied before)`);
  if (overrides.length) block.overrides = [...overrides, ...existing];
  if (rescale.length) {
    // The same rule for `rescale`: the arch's own list when it has one, first in it.
    const rb = Array.isArray(raw.arch[archId]?.rescale) ? raw.arch[archId] : (raw.arch.default ??= {});
    const had = rb.rescale ?? [];
    if (had.some((h) => rescale.some((r) => r.match === h.match))) throw new Error(`forge bisect --apply: ${file}: its rescale list already has ${rescale.map((r) => JSON.stringify(r.match)).join(', ')} (this fix was applied before)`);
    rb.rescale = [...rescale, ...had];
  }
  // Checked as the loader would check it before anything is written: a bad line never reaches the file.
  parseRecipe(JSON.parse(JSON.stringify(raw)), file);
  writeFileSync(file, JSON.stringify(raw, null, 2) + '\n');
  return { file, overrides, ...(rescale.length ? { rescale } : {}) };
}

/**
 * `--apply` for a hand-off fix: `handoff` set in the arch's own block (made when the recipe has
 * none), so the other archs keep theirs; checked as the loader checks it before it is written.
 */
export function applyHandoff(file: string, archId: string, handoff: 'f32'): { file: string; overrides: PrecisionOverride[]; handoff: 'f32' } {
  try {
    accessSync(file, constants.W_OK);
  } catch (e) {
    throw new Error(`forge bisect --apply: ${file} is not a recipe file this process may write (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}); set arch.${archId}.handoff to "${handoff}" by hand`);
  }
  const raw = JSON.parse(readFileSync(file, 'utf8')) as { arch?: Record<string, { handoff?: string }> };
  if (!raw.arch || typeof raw.arch !== 'object') throw new Error(`forge bisect --apply: ${file}: arch: missing, so there is no arch block to put the hand-off in`);
  const block = (raw.arch[archId] ??= {});
  if (block.handoff === handoff) throw new Error(`forge bisect --apply: ${file}: arch.${archId}.handoff is already "${handoff}" (this fix was applied before)`);
  block.handoff = handoff;
  parseRecipe(JSON.parse(JSON.stringify(raw)), file);
  writeFileSync(file, JSON.stringify(raw, null, 2) + '\n');
  return { file, overrides: [], handoff };
}
