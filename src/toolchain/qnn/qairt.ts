// The classic QAIRT SDK command-line path, the other toolchain when a user has the SDK
// (QAIRT_SDK_ROOT): qnn-onnx-converter -> qnn-model-lib-generator -> qnn-context-binary-generator,
// then qnn-context-binary-utility to read back what the binary targets. The plan (argv arrays and
// config files) is built by pure functions; `runQairtPlan` executes one.
//
// Not verified against a real SDK (none is available where this was written): the flags follow the
// QAIRT docs as summarised in shared/REFERENCE.md. The one thing the docs warn about is checked: an
// HTP config that is not wrapped in `backend_extensions` is ignored silently (a default-arch, O0
// binary), so the binary's own report must name the requested SoC/arch before the result counts.
import { existsSync } from 'node:fs';
import { mkdir, readFile, stat, writeFile } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { runWithTimeout, type HtpTarget } from './compile.js';

export const QAIRT_HOST = 'x86_64-linux-clang';

export interface QairtSdk {
  root: string;
  bin: string;
  lib: string;
  /** Python modules of the converters. */
  python: string;
}

/** The SDK named by QAIRT_SDK_ROOT, or null when it is not set. Throws when it is set but unusable. */
export function qairtSdk(env: NodeJS.ProcessEnv = process.env, exists: (p: string) => boolean = existsSync): QairtSdk | null {
  const root = env.QAIRT_SDK_ROOT;
  if (!root) return null;
  const sdk: QairtSdk = { root: resolve(root), bin: join(resolve(root), 'bin', QAIRT_HOST), lib: join(resolve(root), 'lib', QAIRT_HOST), python: join(resolve(root), 'lib', 'python') };
  const missing = ['qnn-onnx-converter', 'qnn-model-lib-generator', 'qnn-context-binary-generator', 'qnn-context-binary-utility']
    .map((t) => join(sdk.bin, t))
    .concat([join(sdk.lib, 'libQnnHtp.so'), join(sdk.lib, 'libQnnHtpNetRunExtensions.so')])
    .filter((p) => !exists(p));
  if (missing.length) {
    throw new Error(`QAIRT_SDK_ROOT=${root} is not a usable QAIRT SDK: missing ${missing.join(', ')}. ` +
      'Point it at the unpacked SDK (the directory with bin/x86_64-linux-clang/), or unset it to use onnxruntime-qnn.');
  }
  return sdk;
}

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

export interface QairtQuant {
  /** AIMET-style encodings for --quantization_overrides (e.g. per-channel int8 weights). */
  overrides?: string;
  /** Calibration inputs (--input_list), needed when activations are quantized. */
  inputList?: string;
  weightsBitwidth?: 8 | 4;
  actBitwidth?: 8 | 16;
  biasBitwidth?: 8 | 32;
  perChannel?: boolean;
}

export interface QairtPlanOptions {
  sdk: QairtSdk;
  /** The graphs of one context, in order. */
  graphs: string[];
  outDir: string;
  contextName: string;
  arch: HtpTarget;
  fp16: boolean;
  optLevel?: 0 | 1 | 2 | 3;
  quant?: QairtQuant;
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
    const q = o.quant;
    steps.push({
      name: `convert ${names[i]}`,
      argv: [
        join(o.sdk.bin, 'qnn-onnx-converter'), '--input_network', resolve(g), '--output_path', `${base}.cpp`,
        ...(o.fp16 && !q ? ['--float_bitwidth', '16'] : []),
        ...(q?.overrides ? ['--quantization_overrides', resolve(q.overrides)] : []),
        ...(q?.inputList ? ['--input_list', resolve(q.inputList)] : []),
        ...(q?.weightsBitwidth ? ['--weights_bitwidth', String(q.weightsBitwidth)] : []),
        ...(q?.actBitwidth ? ['--act_bitwidth', String(q.actBitwidth)] : []),
        ...(q?.biasBitwidth ? ['--bias_bitwidth', String(q.biasBitwidth)] : []),
        ...(q?.perChannel ? ['--use_per_channel_quantization'] : []),
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
  seconds: number;
  log: string;
}

/** Runs a plan: writes its files, runs each step under one overall time limit, and checks the read-back target. */
export async function runQairtPlan(plan: QairtPlan, o: { arch: HtpTarget; timeoutSeconds: number }): Promise<QairtReport> {
  const t0 = Date.now();
  for (const f of plan.files) {
    await mkdir(resolve(f.path, '..'), { recursive: true });
    await writeFile(f.path, f.contents);
  }
  await mkdir(join(resolve(plan.bin, '..'), 'model'), { recursive: true });
  const logLines: string[] = [];
  for (const step of plan.steps) {
    const left = o.timeoutSeconds - (Date.now() - t0) / 1000;
    if (left <= 0) throw new Error(`QAIRT ${step.name}: out of time (${o.timeoutSeconds} s in all); log: ${plan.log}`);
    const r = await runWithTimeout(step.argv[0], step.argv.slice(1), left, plan.env);
    logLines.push(`$ ${step.argv.join(' ')}`, r.stdout, r.stderr);
    await writeFile(plan.log, logLines.join('\n'));
    if (r.timedOut) throw new Error(`QAIRT ${step.name} timed out (${o.timeoutSeconds} s in all) and was killed; log: ${plan.log}`);
    if (r.exitCode !== 0) {
      const tail = `${r.stderr}\n${r.stdout}`.trim().split('\n').slice(-3).join(' | ');
      throw new Error(`QAIRT ${step.name} failed (${r.signal ?? `exit ${r.exitCode}`}): ${tail}; log: ${plan.log}`);
    }
  }
  const target = contextBinaryFacts(JSON.parse(await readFile(plan.infoJson, 'utf8')));
  if (target.socModel !== null && target.socModel !== o.arch.socModel) {
    throw new Error(`${plan.bin} targets soc_model ${target.socModel}, not ${o.arch.socModel}: the HTP config was not applied`);
  }
  if (target.dspArch !== null && target.dspArch !== o.arch.dspArch) {
    throw new Error(`${plan.bin} targets ${target.dspArch}, not ${o.arch.dspArch}: the HTP config was not applied`);
  }
  return { bin: plan.bin, bytes: (await stat(plan.bin)).size, target, seconds: (Date.now() - t0) / 1000, log: plan.log };
}
