// The classic QAIRT SDK command-line path, the compile toolchain while QAIRT_SDK_ROOT is set:
// qnn-onnx-converter -> qnn-model-lib-generator -> qnn-context-binary-generator, then
// qnn-context-binary-utility to read back what the binary targets and which graphs it holds (the
// compile stage writes the EPContext wrappers from that, see ep-context.ts). The plan (argv arrays
// and config files) is built by pure functions; `runQairtPlan` executes one.
//
// Not verified against a real SDK (none is available where this was written; the tests run a
// stand-in): the flags follow the QAIRT docs as summarised in shared/REFERENCE.md. The one thing
// the docs warn about is checked: an HTP config that is not wrapped in `backend_extensions` is
// ignored silently (a default-arch, O0 binary), so the binary's own report must name the requested
// SoC/arch before the result counts.
import { existsSync } from 'node:fs';
import { mkdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { detectMemoryFailure, QnnCompileError, runWithTimeout, type HtpTarget } from './compile.js';
import { QAIRT_HOST, type QairtSdk } from './qairt-sdk.js';

/** The environment the SDK tools expect (what `source bin/envsetup.sh` sets up). */
export function qairtEnv(sdk: QairtSdk, base: NodeJS.ProcessEnv = process.env): Record<string, string> {
  const join2 = (a: string, b?: string) => (b ? `${a}:${b}` : a);
  return {
    QNN_SDK_ROOT: sdk.root,
    QAIRT_SDK_ROOT: sdk.root,
    PATH: join2(sdk.bin, base.PATH),
    LD_LIBRARY_PATH: join2(sdk.lib, base.LD_LIBRARY_PATH),
    PYTHONPATH: join2(sdk.python, base.PYTHONPATH),
  };
}

/** A QNN graph / model-library name from a graph file: a C identifier ('shard0.prefill.onnx' -> 'shard0_prefill'). */
export function qnnGraphName(file: string): string {
  const n = basename(file).replace(/\.onnx$/, '').replace(/[^A-Za-z0-9_]/g, '_');
  return /^[A-Za-z_]/.test(n) ? n : `g_${n}`;
}

export interface HtpConfigOptions {
  graphNames: string[];
  arch: HtpTarget;
  optLevel?: 0 | 1 | 2 | 3;
  fp16: boolean;
  /** One weight copy serving every graph of the context (prefill + decode). */
  weightSharing: boolean;
}

/** The HTP backend-extension config (htp.json). */
export function htpConfig(o: HtpConfigOptions): Record<string, unknown> {
  return {
    graphs: [{ graph_names: o.graphNames, O: o.optLevel ?? 3, vtcm_mb: o.arch.vtcmMb, fp16_relaxed_precision: o.fp16 ? 1 : 0 }],
    devices: [{ soc_model: o.arch.socModel, dsp_arch: o.arch.dspArch }],
    context: { weight_sharing_enabled: o.weightSharing },
  };
}

/** The --config_file of qnn-context-binary-generator: the HTP config wrapped in backend_extensions (unwrapped, it is ignored). */
export function contextConfig(sdk: QairtSdk, htpJsonPath: string): Record<string, unknown> {
  return { backend_extensions: { shared_library_path: join(sdk.lib, 'libQnnHtpNetRunExtensions.so'), config_file_path: htpJsonPath } };
}

export interface QairtPlanOptions {
  sdk: QairtSdk;
  /** The graphs of one context, in order. */
  graphs: string[];
  outDir: string;
  contextName: string;
  arch: HtpTarget;
  /** Float ops in fp16 (the converter's --float_bitwidth 16, the HTP's relaxed precision). */
  fp16: boolean;
  optLevel?: 0 | 1 | 2 | 3;
  /**
   * The graphs carry W8 or W4 weights in QDQ form (int8 → DequantizeLinear, or int4 → blocked
   * DequantizeLinear: quant/w4-qdq.ts): the converter takes their encodings from the graph and,
   * with --float_fallback, keeps every tensor without one in float.
   */
  qdqWeights: boolean;
}

export interface QairtStep {
  name: string;
  argv: string[];
}

export interface QairtPlan {
  env: Record<string, string>;
  /** Written before the first step. */
  files: Array<{ path: string; contents: string }>;
  steps: QairtStep[];
  bin: string;
  /** What qnn-context-binary-utility writes about the binary. */
  infoJson: string;
  graphNames: string[];
  log: string;
}

/** Every command and file the QAIRT path needs to build one context binary. Pure. */
export function qairtPlan(o: QairtPlanOptions): QairtPlan {
  const out = resolve(o.outDir);
  const names = o.graphs.map(qnnGraphName);
  if (new Set(names).size !== names.length) throw new Error(`graph names collide: ${names.join(', ')}`);
  const htpJson = join(out, 'htp.json');
  const cfgJson = join(out, 'context_config.json');
  const libDir = join(out, 'libs');
  const steps: QairtStep[] = [];
  o.graphs.forEach((g, i) => {
    const base = join(out, 'model', names[i]);
    steps.push({
      name: `convert ${names[i]}`,
      argv: [
        join(o.sdk.bin, 'qnn-onnx-converter'), '--input_network', resolve(g), '--output_path', `${base}.cpp`,
        // The runtime binds the graph's own I/O types (float32, int32): fp16 or quantized I/O would not bind.
        '--preserve_io_datatype',
        ...(o.fp16 ? ['--float_bitwidth', '16'] : []),
        ...(o.qdqWeights ? ['--float_fallback'] : []),
      ],
    });
    steps.push({
      name: `model-lib ${names[i]}`,
      argv: [join(o.sdk.bin, 'qnn-model-lib-generator'), '-c', `${base}.cpp`, '-b', `${base}.bin`, '-t', QAIRT_HOST, '-l', names[i], '-o', libDir],
    });
  });
  const libs = names.map((n) => join(libDir, QAIRT_HOST, `lib${n}.so`));
  steps.push({
    name: 'context-binary',
    argv: [
      join(o.sdk.bin, 'qnn-context-binary-generator'), '--model', libs.join(','), '--backend', join(o.sdk.lib, 'libQnnHtp.so'),
      '--binary_file', o.contextName, '--output_dir', out, '--config_file', cfgJson,
    ],
  });
  const bin = join(out, `${o.contextName}.bin`);
  const infoJson = join(out, `${o.contextName}.info.json`);
  steps.push({ name: 'read-back', argv: [join(o.sdk.bin, 'qnn-context-binary-utility'), '--context_binary', bin, '--json_file', infoJson] });
  const htp = htpConfig({ graphNames: names, arch: o.arch, optLevel: o.optLevel, fp16: o.fp16, weightSharing: o.graphs.length > 1 });
  return {
    env: qairtEnv(o.sdk),
    files: [
      { path: htpJson, contents: `${JSON.stringify(htp, null, 2)}\n` },
      { path: cfgJson, contents: `${JSON.stringify(contextConfig(o.sdk, htpJson), null, 2)}\n` },
    ],
    steps,
    bin,
    infoJson,
    graphNames: names,
    log: join(out, 'qairt.log'),
  };
}

export interface ContextBinaryFacts {
  socModel: number | null;
  dspArch: string | null;
  graphs: string[];
}

/**
 * What a qnn-context-binary-utility JSON says the binary targets. The exact layout differs between
 * SDK releases, so this looks for the keys anywhere in the document: soc model ("socModel" /
 * "soc_model"), arch ("dspArch" / "dsp_arch" / "arch", as 'v81' or 81) and graph names ("graphName").
 */
export function contextBinaryFacts(doc: unknown): ContextBinaryFacts {
  const facts: ContextBinaryFacts = { socModel: null, dspArch: null, graphs: [] };
  const visit = (v: unknown) => {
    if (Array.isArray(v)) return v.forEach(visit);
    if (!v || typeof v !== 'object') return;
    for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
      const key = k.toLowerCase().replace(/_/g, '');
      if (facts.socModel === null && key === 'socmodel' && (typeof x === 'number' || /^\d+$/.test(String(x)))) facts.socModel = Number(x);
      else if (facts.dspArch === null && (key === 'dsparch' || key === 'arch' || key === 'htparch') && /^v?\d+$/i.test(String(x))) {
        facts.dspArch = `v${String(x).replace(/^v/i, '')}`;
      } else if (key === 'graphname' && typeof x === 'string') facts.graphs.push(x);
      else visit(x);
    }
  };
  visit(doc);
  return facts;
}

export interface QairtReport {
  bin: string;
  bytes: number;
  target: ContextBinaryFacts;
  /** What qnn-context-binary-utility wrote about the binary. */
  info: unknown;
  seconds: number;
  log: string;
}

/**
 * Runs a plan: writes its files, runs each step under one overall time limit, and checks the
 * read-back target. Failures are QnnCompileErrors of the same kinds as the onnxruntime-qnn path's
 * (a memory failure is recognised in the tools' output by the same patterns).
 */
export async function runQairtPlan(plan: QairtPlan, o: { arch: HtpTarget; timeoutSeconds: number }): Promise<QairtReport> {
  const t0 = Date.now();
  for (const f of plan.files) {
    await mkdir(resolve(f.path, '..'), { recursive: true });
    await writeFile(f.path, f.contents);
  }
  await mkdir(join(resolve(plan.bin, '..'), 'model'), { recursive: true });
  await rm(plan.bin, { force: true });
  await rm(plan.infoJson, { force: true });
  const logLines: string[] = [];
  for (const step of plan.steps) {
    const left = o.timeoutSeconds - (Date.now() - t0) / 1000;
    const label = `QAIRT ${step.name}`;
    if (left <= 0) throw new QnnCompileError(`${label}: out of time (${o.timeoutSeconds} s in all); log: ${plan.log}`, 'timeout', plan.log);
    const r = await runWithTimeout(step.argv[0], step.argv.slice(1), left, plan.env);
    logLines.push(`$ ${step.argv.join(' ')}`, r.stdout, r.stderr);
    await writeFile(plan.log, logLines.join('\n'));
    if (r.spawnError) throw new QnnCompileError(`${label}: cannot run ${step.argv[0]}: ${r.spawnError}; check QAIRT_SDK_ROOT (\`./forge doctor\`)`, 'toolchain-missing', plan.log);
    if (r.timedOut) throw new QnnCompileError(`${label} timed out (${o.timeoutSeconds} s in all) and was killed; log: ${plan.log}`, 'timeout', plan.log);
    if (r.exitCode !== 0) {
      const out = `${r.stderr}\n${r.stdout}`;
      const tail = out.trim().split('\n').slice(-3).join(' | ');
      const memory = detectMemoryFailure(out) ?? (r.signal === 'SIGKILL' ? { kind: 'host-oom' as const, evidence: 'killed by SIGKILL (the kernel OOM killer?)' } : null);
      const how = r.signal ?? `exit ${r.exitCode}`;
      if (memory) throw new QnnCompileError(`${label} ran out of memory (${memory.kind}: ${memory.evidence}); log: ${plan.log}`, 'memory', plan.log, memory);
      throw new QnnCompileError(`${label} failed (${how}): ${tail}; log: ${plan.log}`, 'failed', plan.log);
    }
  }
  if (!existsSync(plan.bin)) throw new QnnCompileError(`QAIRT context-binary: ${plan.bin} was not written; log: ${plan.log}`, 'failed', plan.log);
  let info: unknown;
  try {
    info = JSON.parse(await readFile(plan.infoJson, 'utf8'));
  } catch (e) {
    throw new QnnCompileError(`QAIRT read-back: ${plan.infoJson}: ${(e as Error).message}; log: ${plan.log}`, 'failed', plan.log);
  }
  const target = contextBinaryFacts(info);
  if (target.socModel !== null && target.socModel !== o.arch.socModel) {
    throw new QnnCompileError(`${plan.bin} targets soc_model ${target.socModel}, not ${o.arch.socModel}: the HTP config was not applied`, 'failed', plan.log);
  }
  if (target.dspArch !== null && target.dspArch !== o.arch.dspArch) {
    throw new QnnCompileError(`${plan.bin} targets ${target.dspArch}, not ${o.arch.dspArch}: the HTP config was not applied`, 'failed', plan.log);
  }
  if (target.socModel === null && target.dspArch === null) {
    throw new QnnCompileError(`${plan.infoJson} names neither a soc model nor an arch: cannot show the binary is for ${o.arch.dspArch}`, 'failed', plan.log);
  }
  return { bin: plan.bin, bytes: (await stat(plan.bin)).size, target, info, seconds: (Date.now() - t0) / 1000, log: plan.log };
}
