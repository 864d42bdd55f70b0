// Stage `plan`: reads the fetched config.json, checks it against the config the recipe recorded,
// and writes plan.json (layer ranges under the arch ceiling, the graphs kept under its limits).
import { readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import type { ArchSettings, FamilyId } from '../recipe/schema.js';
import { getArch } from '../arch/table.js';
import { getFamily } from '../families/index.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { makePlan } from './shards.js';
import { checkConfigMatches } from './config-match.js';
import { PRECISION_JSON, type PrecisionMap } from '../quant/precision.js';

export interface PlanParams {
  family: FamilyId;
  arch: string;
  settings: ArchSettings;
  /** The recipe's recorded config, when it has one. */
  expectedConfig?: Record<string, unknown>;
  /** A lower per-context ceiling than the arch's, after a compile ran out of HTP memory (re-plan). */
  ceilingBytes?: number;
}

export const stage: StageModule<PlanParams> = {
  name: 'plan',
  version: '2',
  async run(ctx) {
    const { family: familyId, arch, settings, expectedConfig } = ctx.params;
    const ref = readCheckpointRef(ctx.inputs.checkpoint);
    const file = join(ref.absDir, 'config.json');
    const raw = JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
    if (expectedConfig) checkConfigMatches(raw, expectedConfig, file);
    const family = getFamily(familyId);
    // quant 'auto': the layers' precisions the precision stage chose (quant/auto.ts).
    const map = ctx.inputs.precision ? (JSON.parse(readFileSync(join(ctx.inputs.precision, PRECISION_JSON), 'utf8')) as { matrices: PrecisionMap }).matrices : undefined;
    const plan = await makePlan(family, family.parseConfig(raw, file), getArch(arch), settings, ctx.params.ceilingBytes, map);
    await writeFile(join(ctx.out, 'plan.json'), JSON.stringify(plan, null, 2));
    // What the planner dropped to fit the arch (and why) goes to the run record with the rest.
    return { summary: { shards: plan.shards.length, contexts: plan.contexts, graphs: plan.graphs ?? null, totalContextBytes: plan.totalContextBytes, ...(plan.dropped ? { dropped: plan.dropped } : {}) } };
  },
};
