// The build pipeline for one recipe × one arch, as data: which stage modules run, with which
// params, reading which outputs. Each stage gets only the recipe fields it uses, so changing a
// field re-runs just the stages downstream of it.
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { Pipeline, StageNode } from '../src/engine/stage.js';
import type { HexagonArch } from '../src/arch/table.js';
import type { ArchSettings, Recipe } from '../src/recipe/schema.js';
import { fingerprintDir, type FetchParams } from '../src/hub/fetch-stage.js';
import type { PlanParams } from '../src/plan/stage.js';
import { repoRoot } from '../src/paths.js';

const GB = 1_000_000_000;
const src = (p: string) => join(repoRoot(), 'src', p);

function fetchNode(recipe: Recipe): StageNode {
  const params: FetchParams = { source: recipe.source };
  let tools: string[] = [];
  if (recipe.source.kind === 'tiny') {
    params.factory = createHash('sha256').update(readFileSync(join(repoRoot(), 'oracles', 'make_twin.py'))).digest('hex');
    tools = ['python-env'];
  } else if (recipe.source.kind === 'local') {
    params.fingerprint = fingerprintDir(recipe.source.path);
  }
  return { id: 'fetch', module: src('hub/fetch-stage.ts'), params: params as any, inputs: {}, tools, peakMemoryBytes: 2 * GB };
}

export function buildPipeline(recipe: Recipe, arch: HexagonArch, settings: ArchSettings): Pipeline {
  const plan: PlanParams = { family: recipe.family, arch: arch.id, settings, expectedConfig: recipe.config };
  return {
    nodes: [
      fetchNode(recipe),
      { id: 'plan', module: src('plan/stage.ts'), params: plan as any, inputs: { checkpoint: 'fetch' }, tools: [], peakMemoryBytes: 0.2 * GB },
    ],
    publish: ['plan'],
  };
}
