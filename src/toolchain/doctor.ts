// `forge doctor`: what is installed, which toolchains are usable, and their versions. It reports;
// it installs nothing (the first build or `./forge test` sets the Python environment up).
import { $ } from 'zx';
import { qairtSdk, qairtSdkVersion } from './qnn/qairt-sdk.js';
import { venvDir, venvPython, venvReady } from './venv.js';
import { pythonPins, toolVersions } from './versions.js';
import { cacheRoot, forgeHome } from '../paths.js';
import { listToolchains, resolveToolchain } from './toolchains.js';

export interface Toolchain { usable: boolean; detail: string }

export interface DoctorReport {
  node: { version: string; ok: boolean };
  npm: Record<string, string>;
  python: { venv: string; ready: boolean; packages: Record<string, string | null>; pinned: Record<string, string> };
  toolchains: Record<string, Toolchain>;
  /** The pinned compile toolchains of toolchains/ (forge build --toolchain), each with its venv. */
  pinned: Array<{ name: string; pins: Record<string, string>; venv: string; ready: boolean } | { name: string; error: string }>;
  forgeHome: string;
  cache: string;
}

const PROBE = `
import importlib.metadata as m, json, os
pk = {}
for p in ["torch", "transformers", "safetensors", "tokenizers", "onnx", "onnxruntime", "onnxruntime-qnn", "numpy"]:
    try: pk[p] = m.version(p)
    except Exception: pk[p] = None
qnn = None
try:
    import onnxruntime_qnn
    lib = onnxruntime_qnn.get_library_path()
    qnn = lib if os.path.exists(lib) else None
except Exception as e:
    qnn = None
print(json.dumps({"packages": pk, "qnnLib": qnn}))
`;

async function which(cmd: string): Promise<string | null> {
  const r = await $({ nothrow: true, quiet: true })`sh -c ${`command -v ${cmd}`}`;
  return r.exitCode === 0 ? r.stdout.trim() : null;
}

export async function doctor(): Promise<DoctorReport> {
  const [major, minor] = process.versions.node.split('.').map(Number);
  const tv = toolVersions();
  const report: DoctorReport = {
    node: { version: process.versions.node, ok: major > 20 || (major === 20 && minor >= 19) },
    npm: { 'onnxruntime-node': tv['onnxruntime-node'] },
    python: { venv: venvDir(), ready: venvReady(), packages: {}, pinned: pythonPins() },
    toolchains: {},
    pinned: listToolchains().map((name) => {
      try {
        const t = resolveToolchain(name);
        return { name, pins: t.pins, venv: venvDir(t.file), ready: venvReady(t.file) };
      } catch (e) {
        return { name, error: (e as Error).message };
      }
    }),
    forgeHome: forgeHome(),
    cache: cacheRoot(),
  };
  try {
    const ort = await import('onnxruntime-node');
    report.toolchains['ort-cpu'] = { usable: typeof ort.InferenceSession?.create === 'function', detail: `onnxruntime-node ${tv['onnxruntime-node']} (oracle gate graphs)` };
  } catch (e) {
    report.toolchains['ort-cpu'] = { usable: false, detail: `onnxruntime-node does not load: ${(e as Error).message}` };
  }
  let qnnLib: string | null = null;
  if (report.python.ready) {
    const r = await $({ nothrow: true, quiet: true })`${venvPython()} -c ${PROBE}`;
    if (r.exitCode === 0) {
      const probe = JSON.parse(r.stdout) as { packages: Record<string, string | null>; qnnLib: string | null };
      report.python.packages = probe.packages;
      qnnLib = probe.qnnLib;
    }
  }
  report.toolchains['qnn-aot'] = qnnLib
    ? { usable: true, detail: `onnxruntime-qnn ${report.python.packages['onnxruntime-qnn']} with onnxruntime ${report.python.packages['onnxruntime']}: ${qnnLib}` }
    : { usable: false, detail: report.python.ready ? 'onnxruntime_qnn does not import in the venv' : 'Python environment not set up yet (the first build or ./forge test makes it)' };
  // The QAIRT command-line path compiles `forge build`'s contexts while QAIRT_SDK_ROOT names a
  // complete SDK. Its tests run a stand-in SDK; say that it has not met a real one.
  let qairt: { usable: boolean; detail: string };
  try {
    const sdk = qairtSdk();
    qairt = sdk
      ? { usable: true, detail: `QAIRT ${qairtSdkVersion(sdk)} at ${sdk.root}: forge build compiles with it instead of onnxruntime-qnn (tested against a stand-in SDK only)` }
      : { usable: false, detail: 'QAIRT_SDK_ROOT is not set (optional: forge build then compiles with onnxruntime-qnn)' };
  } catch (e) {
    qairt = { usable: false, detail: (e as Error).message };
  }
  report.toolchains['qairt-cli'] = qairt;
  const cmake = await which('cmake');
  const cxx = (await which('c++')) ?? (await which('g++'));
  report.toolchains['native'] = cmake && cxx
    ? { usable: true, detail: `cmake ${cmake}, c++ ${cxx}` }
    : { usable: false, detail: `missing ${[!cmake && 'cmake', !cxx && 'a C++ compiler'].filter(Boolean).join(' and ')} (apt-get install cmake g++)` };
  return report;
}

export function formatDoctor(r: DoctorReport): string {
  const lines = [
    `node        ${r.node.version}${r.node.ok ? '' : '  (forge needs >= 20.19)'}`,
    `python env  ${r.python.venv} ${r.python.ready ? '(ready)' : '(not set up)'}`,
    ...Object.entries(r.python.packages).map(([k, v]) => `  ${k.padEnd(16)} ${v ?? 'missing'}`),
    'toolchains',
    ...Object.entries(r.toolchains).map(([k, t]) => `  ${k.padEnd(10)} ${t.usable ? 'usable ' : 'MISSING'}  ${t.detail}`),
    'pinned toolchains (forge build --toolchain NAME; toolchains/NAME.txt)',
    ...(r.pinned.length ? r.pinned : [{ name: '(none)', error: '' }]).map((t) => 'error' in t
      ? `  ${t.name.padEnd(10)} ${t.error}`
      : `  ${t.name.padEnd(10)} onnxruntime-qnn ${t.pins['onnxruntime-qnn']}, onnxruntime ${t.pins['onnxruntime']}; ${t.venv} ${t.ready ? '(ready)' : '(made on first use)'}`),
    `cache       ${r.cache}`,
  ];
  return lines.join('\n');
}
