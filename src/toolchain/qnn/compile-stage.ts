// Stage `compile`: the deployable graphs → QNN HTP context binaries for the arch, one per context
// (a shard's prefill and decode graphs share one binary's weights), each graph with its thin
// `_ctx.onnx` EPContext wrapper. Checks after compiling: every binary under the arch's per-context
// ceiling, the context count within the arch's limit, and the target the binary reports equal to
// the requested soc_model/arch. A memory failure is reported as such so the build can re-plan.
import { mkdirSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { linkOrCopy } from '../../io/files.js';
import { tmpdir } from 'node:os';
import { writeFile } from 'node:fs/promises';
import { basename, join, relative } from 'node:path';
import type { StageModule } from '../../engine/stage.js';
import { GRAPHS_JSON, type ContextEntry, type ExportManifest } from '../../families/export-stage.js';
import { compileContext, QnnCompileError, type CompileReport } from './compile.js';

export interface CompileParams {
  arch: { id: string; socModel: number; dspArch: string; vtcmMb: number; contextCeilingBytes: number; maxContexts: number };
  fp16: boolean;
  timeoutSeconds: number;
  /**
   * Test hook (FORGE_FAKE_HTP_LIMIT_BYTES): a context whose weights exceed this fails as an HTP
   * memory failure would, so re-planning can be exercised without a real one. Part of the key.
   */
  fakeHtpLimitBytes?: number;
}

/** A context's files sit in `<context>/` of the stage output: the binary and the wrappers that name it. */
export interface CompiledContext {
  name: string;
  bin: string;
  bytes: number;
  graphs: Array<{ graph: string; wrapper: string }>;
  target: CompileReport['target'];
  compileSeconds: number;
  qairtVersion: string | null;
}

/** The marker build.ts looks for to re-plan with smaller shards. */
export const MEMORY_FAILURE = 'HTP memory failure';

/** Hard-links the graphs into a directory fixed by the quantize entry's key (see below). */
function stableSource(quantizeDir: string, archId: string): string {
  // Per arch too: builds for v79 and v81 of the same graphs may compile at the same time.
  const src = join(tmpdir(), 'forge-qnn-src', `${basename(quantizeDir)}-${archId}`);
  rmSync(src, { recursive: true, force: true });
  mkdirSync(src, { recursive: true });
  for (const f of readdirSync(quantizeDir).filter((x) => x.endsWith('.onnx') || x.endsWith('.data'))) {
    linkOrCopy(join(quantizeDir, f), join(src, f));
  }
  return src;
}

async function compileOne(c: ContextEntry, src: string, out: string, p: CompileParams, log: (m: string) => void): Promise<{ entry: CompiledContext; peak: number }> {
  if (p.fakeHtpLimitBytes !== undefined && c.dataBytes > p.fakeHtpLimitBytes) {
    throw new Error(`${MEMORY_FAILURE} compiling ${c.name} (${c.dataBytes} bytes of weights; simulated by FORGE_FAKE_HTP_LIMIT_BYTES=${p.fakeHtpLimitBytes})`);
  }
  let r: CompileReport;
  try {
    r = await compileContext({
      graphs: c.graphs.map((g) => join(src, g.file)),
      outDir: join(out, c.name), contextName: c.name,
      arch: { socModel: p.arch.socModel, dspArch: p.arch.dspArch, vtcmMb: p.arch.vtcmMb },
      fp16: p.fp16, timeoutSeconds: p.timeoutSeconds,
    });
  } catch (e) {
    if (e instanceof QnnCompileError && e.kind === 'memory') throw new Error(`${MEMORY_FAILURE} compiling ${c.name}: ${e.message}`);
    throw e;
  }
  if (r.target.socModel !== null && r.target.socModel !== p.arch.socModel) throw new Error(`${c.name}.bin reports soc_model ${r.target.socModel}, ${p.arch.id} needs ${p.arch.socModel}`);
  if (r.target.dspArch !== null && r.target.dspArch !== p.arch.dspArch) throw new Error(`${c.name}.bin reports arch ${r.target.dspArch}, ${p.arch.id} needs ${p.arch.dspArch}`);
  if (r.bytes > p.arch.contextCeilingBytes) {
    throw new Error(`${MEMORY_FAILURE}: ${c.name}.bin is ${r.bytes} bytes, over the ${p.arch.id} per-context ceiling of ${p.arch.contextCeilingBytes}`);
  }
  log(`${c.name}: ${r.bytes} bytes for soc_model ${r.target.socModel} (${r.target.dspArch}) in ${r.compileSeconds.toFixed(1)} s`);
  return {
    peak: r.peakRssBytes,
    entry: {
      name: c.name, bin: `${c.name}/${c.name}.bin`, bytes: r.bytes,
      graphs: r.wrappers.map((w) => ({ graph: basename(w.graph, '.onnx'), wrapper: relative(out, w.path) })),
      target: r.target, compileSeconds: r.compileSeconds, qairtVersion: r.qairtVersion,
    },
  };
}

export const stage: StageModule<CompileParams> = {
  name: 'compile',
  version: '1',
  async run(ctx) {
    const p = ctx.params;
    const exp = JSON.parse(readFileSync(join(ctx.inputs.quantize, GRAPHS_JSON), 'utf8')) as ExportManifest;
    if (exp.contexts.length > p.arch.maxContexts) throw new Error(`${exp.contexts.length} contexts, over the ${p.arch.id} limit of ${p.arch.maxContexts}`);
    // ORT names a compiled partition after a hash that covers the source model's path, and the name
    // lands in the wrapper: compile from a path fixed by the quantize entry's key (which does not
    // depend on where the cache is), so clean builds in different caches agree.
    const src = stableSource(ctx.inputs.quantize, p.arch.id);
    const compiled: CompiledContext[] = [];
    try {
      for (const [i, c] of exp.contexts.entries()) {
        ctx.progress(i, exp.contexts.length, c.name);
        const r = await compileOne(c, src, ctx.out, p, ctx.log);
        ctx.notePeakRss(r.peak);
        compiled.push(r.entry);
      }
    } finally {
      rmSync(src, { recursive: true, force: true });
    }
    await writeFile(join(ctx.out, 'compile.json'), JSON.stringify({ arch: p.arch.id, contexts: compiled }, null, 2));
    return { summary: { contexts: compiled.map((c) => ({ name: c.name, bytes: c.bytes, socModel: c.target.socModel, dspArch: c.target.dspArch })), qairt: compiled[0]?.qairtVersion ?? null } };
  },
};
