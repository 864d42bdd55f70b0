// Stage `bundle`: what the user ships, flat, ready for `adb push`: manifest.json, the QNN context
// binaries with their _ctx.onnx wrappers, the host embedding table, tokenizer files, the model card
// (README.md) and SHA256SUMS. It runs only after every gate passed (its inputs), and writes nothing
// that varies between builds of the same inputs: no timestamps, no absolute paths.
import { copyFileSync, readFileSync, rmSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { StageModule } from '../engine/stage.js';
import type { FamilyId, Recipe } from '../recipe/schema.js';
import { getArch } from '../arch/table.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { listFiles, sha256OfFile } from '../engine/hash.js';
import type { CompiledContext } from '../toolchain/qnn/compile-stage.js';
import { assembleBundle, MANIFEST } from './assemble.js';
import { modelCard, type CardFacts } from './card.js';
import type { Manifest } from './manifest.js';

export interface BundleParams {
  recipe: { id: string; family: FamilyId; source: Recipe['source']; card: Recipe['card'] };
  arch: string;
  maxNewTokens: number;
}

export const SUMS = 'SHA256SUMS';

function emulationFacts(file: string): NonNullable<CardFacts['emulation']> {
  const e = JSON.parse(readFileSync(file, 'utf8'));
  const sim = e.simulator;
  return {
    ok: e.ok,
    simulator: `x86 HTP simulator (soc_model ${sim.socModel}, ${sim.dspArch}, QAIRT ${sim.qairt}${sim.fp16 ? ', fp16 activations' : ''})`,
    graphs: e.oracle.graphs,
    parity: { matched: e.parity.matched, total: e.parity.total },
  };
}

export const stage: StageModule<BundleParams> = {
  name: 'bundle',
  version: '1',
  async run(ctx) {
    const p = ctx.params;
    const arch = getArch(p.arch);
    const staging = join(ctx.out, '.assemble');
    // Assemble with the ONNX graphs (for the sha256s and bindings), then keep only what a device loads.
    const full = await assembleBundle({ recipe: p.recipe, arch, graphsDir: ctx.inputs.quantize, embeddingDir: ctx.inputs.quantize, checkpointDir: readCheckpointRef(ctx.inputs.checkpoint).absDir, maxNewTokens: p.maxNewTokens }, staging);
    const compiled = (JSON.parse(readFileSync(join(ctx.inputs.compile, 'compile.json'), 'utf8')) as { contexts: CompiledContext[] }).contexts;
    const manifest: Manifest = { ...full, contexts: [] };
    for (const c of full.contexts) {
      const cc = compiled.find((x) => x.name === c.name);
      if (!cc) throw new Error(`context ${c.name} was not compiled`);
      const bin = `${c.name}.bin`;
      copyFileSync(join(ctx.inputs.compile, cc.bin), join(ctx.out, bin));
      const graphs = [];
      for (const g of c.graphs) {
        const w = cc.graphs.find((x) => x.graph === g.name);
        if (!w) throw new Error(`graph ${g.name} has no compiled wrapper`);
        const wrapper = `${g.name}_ctx.onnx`;
        copyFileSync(join(ctx.inputs.compile, w.wrapper), join(ctx.out, wrapper));
        const { file: _f, sha256: _s, ...rest } = g;
        graphs.push({ ...rest, qnn: { wrapper, sha256: await sha256OfFile(join(ctx.out, wrapper)), binary: bin } });
      }
      manifest.contexts.push({ name: c.name, files: [{ path: bin, sha256: await sha256OfFile(join(ctx.out, bin)), bytes: cc.bytes }], graphs });
    }
    for (const f of [full.hostTables[0].file, full.tokenizer.file, ...(full.tokenizer.config ? [full.tokenizer.config] : [])]) copyFileSync(join(staging, f), join(ctx.out, f));
    await writeFile(join(ctx.out, MANIFEST), JSON.stringify(manifest, null, 2) + '\n');

    const facts: CardFacts = {
      recipe: p.recipe, arch, manifest, compiled,
      oracle: JSON.parse(readFileSync(join(ctx.inputs.oracle, 'oracle.json'), 'utf8')),
      parity: JSON.parse(readFileSync(join(ctx.inputs.parity, 'parity.json'), 'utf8')),
      tools: ctx.tools,
      ...(ctx.inputs.emulation ? { emulation: emulationFacts(join(ctx.inputs.emulation, 'emulation.json')) } : {}),
    };
    const files = (await listFiles(ctx.out, new Set(['.assemble']))).filter((f) => !f.startsWith('.assemble/') && f !== 'meta.json');
    const sizes = Object.fromEntries(await Promise.all(files.map(async (f) => [f, readFileSync(join(ctx.out, f)).length] as const)));
    await writeFile(join(ctx.out, 'README.md'), modelCard(facts, sizes));
    const all = [...files, 'README.md'].sort();
    const sums = await Promise.all(all.map(async (f) => `${await sha256OfFile(join(ctx.out, f))}  ${f}`));
    await writeFile(join(ctx.out, SUMS), sums.join('\n') + '\n');
    rmSync(staging, { recursive: true, force: true });
    return { summary: { files: all.length + 1, bytes: Object.values(sizes).reduce((a, b) => a + b, 0) } };
  },
};
