// The fp32 reference export (the `export` stage of `forge build`) on a full-size checkpoint, both
// ways in one run: the graphs that read the checkpoint's own bytes through hard links (today's) and
// the converted fp32 copy of the weights (the baseline: the same export without `inPlace`). For each:
// the export's seconds, the bytes it wrote (wchar of this process, and the new files it left), and
// the seconds the stage cache's commit spends hashing the output (hashTree, as the cache does).
// Prints one JSON object with both and the ratios in-place / copy.
//
//   node --import tsx bench/reference-export.ts [--recipe qwen3-4b] [--checkpoint DIR] [--out-root DIR]
//
// The copy writes ~16 GB for a 4B model: run it under /work/prompts/heavy.sh on a shared machine.
import { mkdirSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { runExport, type ExportParams } from '../src/export/stage.js';
import { getFamily } from '../src/families/index.js';
import { getArch } from '../src/arch/table.js';
import { makePlan } from '../src/plan/shards.js';
import { archSettings, loadRecipe } from '../src/recipe/load.js';
import { hashTree } from '../src/engine/hash.js';
import { defaultCheckpointDir } from './gen-checkpoint.js';
import { benchArgs } from './util.js';
import { forgeHome } from '../src/paths.js';

const { values: a } = benchArgs({
  recipe: { type: 'string', default: 'qwen3-4b' }, checkpoint: { type: 'string', default: '' },
  'out-root': { type: 'string', default: join(forgeHome(), 'bench', 'out') },
});
const ckptDir = a.checkpoint || defaultCheckpointDir(a.recipe);
const { recipe } = loadRecipe(a.recipe);
const { settings } = archSettings(recipe, 'v81');
const family = getFamily(recipe.family);
const config = family.parseConfig(JSON.parse(readFileSync(join(ckptDir, 'config.json'), 'utf8')), join(ckptDir, 'config.json'));
const plan = await makePlan(family, config, getArch('v81'), settings);
const base: ExportParams = { family: recipe.family, scheme: 'fp32', lmHeadScheme: 'fp32', maxContext: settings.maxContext, prefillLength: settings.prefillLength, hostTables: false };

const wchar = () => Number(/wchar:\s*(\d+)/.exec(readFileSync('/proc/self/io', 'utf8'))![1]);

async function measure(label: string, inPlace: boolean) {
  const out = join(a['out-root'], `reference-export-${label}-${process.pid}`);
  rmSync(out, { recursive: true, force: true });
  mkdirSync(out, { recursive: true });
  try {
    const w0 = wchar();
    const t0 = performance.now();
    await runExport({ ...base, ...(inPlace ? { inPlace: true } : {}) }, ckptDir, plan, out, { log: (m) => process.stderr.write(`${label}: ${m}\n`), progress() {} });
    const exportSeconds = (performance.now() - t0) / 1000;
    const bytesWritten = wchar() - w0;
    const t1 = performance.now();
    await hashTree(out);
    const commitHashSeconds = (performance.now() - t1) / 1000;
    const files = readdirSync(out).map((f) => statSync(join(out, f)));
    const newFileBytes = files.filter((s) => s.nlink === 1).reduce((n, s) => n + s.size, 0);
    const linkedBytes = files.filter((s) => s.nlink > 1).reduce((n, s) => n + s.size, 0);
    return { exportSeconds, bytesWritten, newFileBytes, linkedBytes, commitHashSeconds };
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
}

const inPlace = await measure('in-place', true);
const copy = await measure('copy', false);
const ratio = (k: 'exportSeconds' | 'bytesWritten' | 'commitHashSeconds') => inPlace[k] / copy[k];
console.log(JSON.stringify({
  checkpoint: ckptDir, plan: plan.shards.map((s) => [s.first, s.last]), lmHead: plan.lmHead.placement,
  inPlace, copy,
  ratios: { exportSeconds: ratio('exportSeconds'), bytesWritten: ratio('bytesWritten'), commitHashSeconds: ratio('commitHashSeconds'), exportPlusCommitSeconds: (inPlace.exportSeconds + inPlace.commitHashSeconds) / (copy.exportSeconds + copy.commitHashSeconds) },
}));
