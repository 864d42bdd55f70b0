// Tool versions that enter cache keys. Python packages come from the pinned requirements (the venv
// is keyed by that file, so a pin is the installed version); npm ones from their package.json.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from '../paths.js';
import { sha256Hex } from '../engine/hash.js';
import { qairtSdk, qairtSdkVersion } from './qnn/qairt-sdk.js';

export function requirementsFile(): string {
  return join(repoRoot(), 'oracles', 'requirements.txt');
}

export function pythonPins(file = requirementsFile()): Record<string, string> {
  const pins: Record<string, string> = {};
  for (const raw of readFileSync(file, 'utf8').split('\n')) {
    const line = raw.replace(/#.*/, '').trim();
    if (!line) continue;
    const m = /^([A-Za-z0-9_.\-]+)==([^\s;]+)$/.exec(line);
    if (!m) throw new Error(`${file}: '${line}' is not pinned as name==version`);
    pins[m[1].toLowerCase()] = m[2];
  }
  return pins;
}

function npmVersion(pkg: string): string {
  return (JSON.parse(readFileSync(join(repoRoot(), 'node_modules', pkg, 'package.json'), 'utf8')) as { version: string }).version;
}

/** Every tool a stage may declare, by name. */
export function toolVersions(): Record<string, string> {
  const pins = pythonPins();
  return {
    node: process.versions.node,
    'python-env': sha256Hex(readFileSync(requirementsFile())).slice(0, 16),
    torch: pins['torch'],
    transformers: pins['transformers'],
    safetensors: pins['safetensors'],
    tokenizers: pins['tokenizers'],
    onnx: pins['onnx'],
    onnxruntime: pins['onnxruntime'],
    'onnxruntime-qnn': pins['onnxruntime-qnn'],
    'onnxruntime-node': npmVersion('onnxruntime-node'),
    ...qairtVersion(),
  };
}

/** The QAIRT SDK's version while QAIRT_SDK_ROOT names a usable one (the build itself reports an unusable one). */
function qairtVersion(): Record<string, string> {
  try {
    const sdk = qairtSdk();
    return sdk ? { 'qairt-sdk': qairtSdkVersion(sdk) } : {};
  } catch {
    return {};
  }
}
