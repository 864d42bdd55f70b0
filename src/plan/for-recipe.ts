// `forge plan`: straight from the recipe's recorded config when it has one (offline, no weights),
// otherwise by building up to the plan stage (tiny twins are made locally).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadRecipe, archSettings } from '../recipe/load.js';
import { getFamily } from '../families/index.js';
import { build } from '../build.js';
import { lineProgress, silentProgress } from '../engine/progress.js';
import { makePlan, type ShardPlan } from './shards.js';
import { mb } from '../units.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';

export async function planRecipe(id: string, archId: string, verbose = false): Promise<ShardPlan> {
  const { recipe, file } = loadRecipe(id);
  const { arch, settings } = archSettings(recipe, archId, file);
  if (recipe.config) {
    const family = getFamily(recipe.family);
    return await makePlan(family, family.parseConfig(recipe.config, `${file} (config)`), arch, settings);
  }
  const out = mkdtempSync(join(tmpdir(), 'forge-plan-'));
  try {
    const record = await build({ recipe: id, arch: archId, out, until: 'plan', progress: verbose ? lineProgress() : silentProgress });
    if (!record.ok) throw new Error(record.error ?? 'planning failed');
    return JSON.parse(readFileSync(join(out, 'build', 'plan.json'), 'utf8')) as ShardPlan;
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
}


export function formatPlan(p: ShardPlan): string {
  const lines = [`${p.arch} (soc_model ${p.socModel}), ceiling ${mb(p.ceilingBytes)} per context, weights ${p.quant}`];
  for (const s of p.shards) lines.push(`  shard ${s.index}: layers ${s.first}-${s.last}  ${mb(s.weightBytes)}  graphs ${s.graphs.join('+')}`);
  for (const e of p.encoders ?? []) lines.push(`  encoder ${e.name}: ${mb(e.weightBytes)}  graphs ${e.graphs.join('+')}`);
  lines.push(`  lm-head: ${p.lmHead.placement} ${p.lmHead.quant}${p.lmHead.chosen ? ` (${p.lmHead.chosen})` : ''}${p.lmHead.tied ? ' (tied)' : ''}  ${mb(p.lmHead.bytes)}`);
  for (const t of p.hostTables) lines.push(`  host ${t.name}: ${t.dtype} ${mb(t.bytes)}`);
  lines.push(`  ${p.contexts} contexts${p.graphs !== undefined ? `, ${p.graphs} graphs` : ''}, ${mb(p.totalContextBytes)} in contexts`);
  for (const d of p.dropped ?? []) lines.push(`  dropped ${d.graph}: ${d.why}`);
  if (p.precisionNote) lines.push(`  note: ${p.precisionNote}`);
  return lines.join('\n');
}
