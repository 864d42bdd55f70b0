// Stage `compile`: the deployable graphs → QNN HTP context binaries for the arch, one per context
// (a shard's prefill and decode graphs share one binary's weights), each graph with its thin
// `_ctx.onnx` EPContext wrapper. Two toolchains give that same layout: onnxruntime-qnn (compile.ts),
// and the QAIRT SDK's command-line tools while QAIRT_SDK_ROOT is set (qairt-compile.ts). Checks
// after compiling: every binary under the arch's per-context ceiling, the context count within the
// arch's limit, and the target the binary reports equal to the requested soc_model/arch. A memory failure is reported as such so the build can re-plan.
import { mkdirSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { sha256Hex, stableStringify } from '../../engine/hash.js';
import lockfile from 'proper-lockfile';
import { linkOrCopy } from '../../io/files.js';
import { tmpdir } from 'node:os';
import { writeFile } from 'node:fs/promises';
import { basename, join, relative } from 'node:path';
import type { StageModule } from '../../engine/stage.js';
import { GRAPHS_JSON, type ContextEntry, type ExportManifest } from '../../export/graphs.js';
import { compileContext, QnnCompileError, type CompileReport } from './compile.js';
import { compileQairtContext } from './qairt-compile.js';
import { qairtSdk, qairtSdkVersion, type QairtSdk } from './qairt-sdk.js';
import { watchTreeMemory, type MemoryPeak } from '../../engine/memory.js';
import { WAITING_LOCK } from '../../engine/lock.js';
import { toolchainPython } from '../venv.js';

/**
 * Which toolchain compiles; the QAIRT SDK is found through QAIRT_SDK_ROOT and must be this version.
 * onnxruntime-qnn runs in the main venv, or with `env` in a pinned toolchain's (toolchains/<name>.txt,
 * its venv by the file's hash: build.ts made it before the pipeline ran).
 */
export type CompileToolchain = { kind: 'onnxruntime-qnn'; env?: { name: string; hash: string } } | { kind: 'qairt'; version: string };

export interface CompileParams {
  arch: { id: string; socModel: number; dspArch: string; vtcmMb: number; contextCeilingBytes: number; maxContexts: number; maxGraphsPerProcess: number };
  toolchain: CompileToolchain;
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
  /**
   * sha256 of the binary's own description (size, target, what QnnSystem reads from it: graphs, API
   * and SDK versions, blob size). Two compiles of the same graphs give different bytes (see
   * NONDETERMINISTIC_QNN_BINARY in bundle/manifest.ts) but this same description.
   */
  describeSha256: string;
  compileSeconds: number;
  qairtVersion: string | null;
  toolchain: CompileToolchain['kind'];
  /**
   * Peak private (RssAnon) and mapped (RssFile) bytes of the stage's process tree while this context
   * compiled (the helper with its QNN libraries): what pipelines/memory.ts COMPILE is calibrated
   * against, per context. null off Linux.
   */
  peakPrivateBytes: number | null;
  peakMappedBytes: number | null;
}

/** The marker build.ts looks for to re-plan with smaller shards. */
export const MEMORY_FAILURE = 'HTP memory failure';

/**
 * Runs fn with the graphs hard-linked into a directory fixed by the quantize entry's key (see
 * below). Builds in other caches compile the same graphs from the same path, so the directory is
 * held under a lock (stale when its holder dies, as the cache's are) for the whole compile: without
 * it, one build's clean-up deleted the graphs under another's running compile.
 */
async function withStableSource<T>(quantizeDir: string, archId: string, fn: (src: string) => Promise<T>): Promise<T> {
  // Per arch too: builds for v79 and v81 of the same graphs may compile at the same time.
  const root = join(tmpdir(), 'forge-qnn-src');
  const src = join(root, `${basename(quantizeDir)}-${archId}`);
  mkdirSync(root, { recursive: true });
  // The lock is on src itself (which need not exist): proper-lockfile keeps one record per locked path.
  const release = await lockfile.lock(src, { realpath: false, lockfilePath: `${src}.lock`, ...WAITING_LOCK });
  try {
    rmSync(src, { recursive: true, force: true });
    mkdirSync(src, { recursive: true });
    for (const f of readdirSync(quantizeDir).filter((x) => x.endsWith('.onnx') || x.endsWith('.data'))) {
      linkOrCopy(join(quantizeDir, f), join(src, f));
    }
    return await fn(src);
  } finally {
    rmSync(src, { recursive: true, force: true });
    await release().catch(() => undefined);
  }
}

/** The compile itself, by either toolchain: the binary, its wrappers and what the binary says it targets. */
async function compileWith(c: ContextEntry, src: string, out: string, p: CompileParams, qdq: boolean, qairt: Qairt | null): Promise<{ report: Pick<CompileReport, 'bytes' | 'compileSeconds' | 'qairtVersion' | 'peakRssBytes'> & { target: CompiledContext['target']; describe: unknown }; wrappers: Array<{ graph: string; path: string }> }> {
  const arch = { socModel: p.arch.socModel, dspArch: p.arch.dspArch, vtcmMb: p.arch.vtcmMb };
  if (qairt) {
    const r = await compileQairtContext({
      sdk: qairt.sdk, sdkVersion: qairt.version, graphs: c.graphs, srcDir: src, outDir: join(out, c.name),
      contextName: c.name, arch, fp16: p.fp16, qdqWeights: qdq, timeoutSeconds: p.timeoutSeconds,
    });
    const target = { socModel: r.target.socModel, socType: null, arch: r.target.dspArch ? Number(r.target.dspArch.slice(1)) : null, dspArch: r.target.dspArch, vtcmBytes: null, fp16Relaxed: null, optLevel: null };
    // The tools run as child processes of their own; their peak memory is not measured here.
    const describe = { toolchain: 'qairt', qairt: qairt.version, bytes: r.bytes, target, graphs: r.wrappers.map((w) => w.qnnGraph) };
    return { report: { bytes: r.bytes, compileSeconds: r.seconds, qairtVersion: qairt.version, peakRssBytes: 0, target, describe }, wrappers: r.wrappers };
  }
  const r = await compileContext({ graphs: c.graphs.map((g) => join(src, g.file)), outDir: join(out, c.name), contextName: c.name, arch, fp16: p.fp16, timeoutSeconds: p.timeoutSeconds, python: toolchainPython(p.toolchain) });
  if (r.binaryInfo && 'error' in r.binaryInfo) throw new Error(`${c.name}.bin: QnnSystem cannot read it: ${String(r.binaryInfo.error)}`);
  const describe = { toolchain: 'onnxruntime-qnn', bytes: r.bytes, target: r.target, binaryInfo: r.binaryInfo };
  return { report: { ...r, describe }, wrappers: r.wrappers.map((w) => ({ graph: basename(w.graph, '.onnx'), path: w.path })) };
}

async function compileOne(c: ContextEntry, src: string, out: string, p: CompileParams, qdq: boolean, qairt: Qairt | null, log: (m: string) => void): Promise<{ entry: Omit<CompiledContext, 'peakPrivateBytes' | 'peakMappedBytes'>; peak: number }> {
  if (p.fakeHtpLimitBytes !== undefined && c.dataBytes > p.fakeHtpLimitBytes) {
    throw new Error(`${MEMORY_FAILURE} compiling ${c.name} (${c.dataBytes} bytes of weights; simulated by FORGE_FAKE_HTP_LIMIT_BYTES=${p.fakeHtpLimitBytes})`);
  }
  let done: Awaited<ReturnType<typeof compileWith>>;
  try {
    done = await compileWith(c, src, out, p, qdq, qairt);
  } catch (e) {
    if (e instanceof QnnCompileError && e.kind === 'memory') throw new Error(`${MEMORY_FAILURE} compiling ${c.name}: ${e.message}`);
    throw e;
  }
  const r = done.report;
  if (r.target.socModel !== null && r.target.socModel !== p.arch.socModel) throw new Error(`${c.name}.bin reports soc_model ${r.target.socModel}, ${p.arch.id} needs ${p.arch.socModel}`);
  if (r.target.dspArch !== null && r.target.dspArch !== p.arch.dspArch) throw new Error(`${c.name}.bin reports arch ${r.target.dspArch}, ${p.arch.id} needs ${p.arch.dspArch}`);
  if (r.bytes > p.arch.contextCeilingBytes) {
    throw new Error(`${MEMORY_FAILURE}: ${c.name}.bin is ${r.bytes} bytes, over the ${p.arch.id} per-context ceiling of ${p.arch.contextCeilingBytes}`);
  }
  log(`${c.name}: ${r.bytes} bytes for soc_model ${r.target.socModel} (${r.target.dspArch}) in ${r.compileSeconds.toFixed(1)} s with ${p.toolchain.kind}`);
  return {
    peak: r.peakRssBytes,
    entry: {
      name: c.name, bin: `${c.name}/${c.name}.bin`, bytes: r.bytes,
      graphs: done.wrappers.map((w) => ({ graph: w.graph, wrapper: relative(out, w.path) })),
      target: r.target, describeSha256: sha256Hex(stableStringify(r.describe)), compileSeconds: r.compileSeconds, qairtVersion: r.qairtVersion, toolchain: p.toolchain.kind,
    },
  };
}

interface Qairt {
  sdk: QairtSdk;
  version: string;
}

/** The SDK a QAIRT compile runs, checked against the version its cache key was made with. */
function qairtFor(t: CompileToolchain): Qairt | null {
  if (t.kind !== 'qairt') return null;
  const sdk = qairtSdk();
  if (!sdk) throw new Error('this build compiles with the QAIRT SDK, but QAIRT_SDK_ROOT is not set in the compile stage');
  const version = qairtSdkVersion(sdk);
  if (version !== t.version) throw new Error(`QAIRT_SDK_ROOT=${sdk.root} is QAIRT ${version}, but the build was planned with ${t.version}`);
  return { sdk, version };
}

export const stage: StageModule<CompileParams> = {
  name: 'compile',
  version: '2',
  async run(ctx) {
    const p = ctx.params;
    const exp = JSON.parse(readFileSync(join(ctx.inputs.quantize, GRAPHS_JSON), 'utf8')) as ExportManifest;
    if (exp.contexts.length > p.arch.maxContexts) throw new Error(`${exp.contexts.length} contexts, over the ${p.arch.id} limit of ${p.arch.maxContexts}`);
    const graphs = exp.contexts.reduce((n, c) => n + c.graphs.length, 0);
    if (graphs > p.arch.maxGraphsPerProcess) throw new Error(`${graphs} graphs, over the ${p.arch.id} limit of ${p.arch.maxGraphsPerProcess} graphs per process (the plan drops optional graphs to fit)`);
    const qairt = qairtFor(p.toolchain);
    // Which contexts hold W8 or W4 weights (each graph records its weights' scheme): their form is
    // the toolchain's (W4 in QDQ form is checked against the stand-in SDK only: quant/w4-qdq.ts).
    const quantized = (c: ContextEntry) => c.graphs[0].scheme === 'w8' || c.graphs[0].scheme === 'w4';
    const held = [...new Set(exp.contexts.filter(quantized).map((c) => c.graphs[0].scheme.toUpperCase()))].join(' and ');
    if (held) {
      if (qairt === null && exp.w8Form === 'qdq') throw new Error(`${ctx.inputs.quantize}: ${held} weights in QDQ form, which onnxruntime-qnn leaves on the CPU; they are the QAIRT converter's form`);
      if (qairt !== null && exp.w8Form !== 'qdq') throw new Error(`${ctx.inputs.quantize}: ${held} weights as MatMulNBits, which the QAIRT converter does not read; the QAIRT toolchain needs the QDQ form`);
    }
    // ORT names a compiled partition after a hash that covers the source model's path, and the name
    // lands in the wrapper: compile from a path fixed by the quantize entry's key (which does not
    // depend on where the cache is), so clean builds in different caches agree.
    const compiled = await withStableSource(ctx.inputs.quantize, p.arch.id, async (src) => {
      const done: CompiledContext[] = [];
      for (const [i, c] of exp.contexts.entries()) {
        ctx.progress(i, exp.contexts.length, c.name);
        const memory = watchTreeMemory(process.pid);
        let r: Awaited<ReturnType<typeof compileOne>>;
        let peak: MemoryPeak | null;
        try {
          r = await compileOne(c, src, ctx.out, p, quantized(c) && exp.w8Form === 'qdq', qairt, ctx.log);
        } finally {
          peak = memory.stop();
        }
        ctx.notePeakRss(r.peak);
        done.push({ ...r.entry, peakPrivateBytes: peak?.privateBytes ?? null, peakMappedBytes: peak?.mappedBytes ?? null });
      }
      return done;
    });
    await writeFile(join(ctx.out, 'compile.json'), JSON.stringify({ arch: p.arch.id, contexts: compiled }, null, 2));
    return { summary: { toolchain: p.toolchain.kind, ...(p.toolchain.kind === 'onnxruntime-qnn' && p.toolchain.env ? { env: p.toolchain.env.name } : {}), contexts: compiled.map((c) => ({ name: c.name, bytes: c.bytes, compileSeconds: c.compileSeconds, socModel: c.target.socModel, dspArch: c.target.dspArch, peakPrivateBytes: c.peakPrivateBytes, peakMappedBytes: c.peakMappedBytes })), qairt: compiled[0]?.qairtVersion ?? null } };
  },
};
