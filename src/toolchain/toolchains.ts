// Pinned compile toolchains: `toolchains/<name>.txt`, requirements files for a small venv that a
// build's compile and simulator gate run in instead of the main environment's, so the same recipe
// can be built with two onnxruntime-qnn releases side by side. Data, not code: adding a toolchain is
// adding a file. The venv is venv.ts's, keyed by the file (venv-<sha256>).
import { existsSync, readdirSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { repoRoot } from '../paths.js';
import { RecipeError } from '../recipe/load.js';
import { pythonPins } from './versions.js';
import { requirementsHash } from './venv.js';

export interface Toolchain {
  /** The file's name without .txt: how builds, reports and cache keys name it. */
  name: string;
  /** The requirements file (absolute). */
  file: string;
  /** What its venv is keyed by (venvDirOf). */
  hash: string;
  pins: Record<string, string>;
}

export function toolchainsDir(): string {
  return join(repoRoot(), 'toolchains');
}

export function listToolchains(dir = toolchainsDir()): string[] {
  return existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith('.txt')).map((f) => f.slice(0, -4)).sort() : [];
}

/** What a toolchain must pin: the compile imports both (oracles/qnn_compile.py). */
const REQUIRED = ['onnxruntime-qnn', 'onnxruntime'];

/**
 * `qnn-2.6.0` (a file of toolchains/) or a path to a requirements file (anything with a slash or
 * ending in .txt). Refused with one error naming the file: missing, not pinned, or lacking a pin.
 */
export function resolveToolchain(nameOrFile: string, dir = toolchainsDir()): Toolchain {
  const isPath = nameOrFile.includes('/') || nameOrFile.endsWith('.txt');
  const file = isPath ? resolve(nameOrFile) : join(dir, `${nameOrFile}.txt`);
  if (!existsSync(file)) {
    const known = listToolchains(dir);
    throw new RecipeError(isPath ? `no toolchain requirements file at ${file}` : `no toolchain '${nameOrFile}' (no ${file}; known: ${known.join(', ') || 'none'})`);
  }
  let pins: Record<string, string>;
  try {
    pins = pythonPins(file);
  } catch (e) {
    throw new RecipeError(`invalid toolchain ${(e as Error).message}`);
  }
  const missing = REQUIRED.filter((p) => !pins[p]);
  if (missing.length) throw new RecipeError(`invalid toolchain ${file}: it must pin ${missing.join(' and ')} (name==version)`);
  return { name: basename(file, '.txt'), file, hash: requirementsHash(file), pins };
}

/**
 * The tool versions a toolchain build's stages see, over the main ones: `onnxruntime` and
 * `onnxruntime-qnn` are its pins (only compile, the simulator gate and the bundle declare them,
 * so stages before the compile keep their keys), and `toolchain` names it with its file's hash,
 * which those stages declare too (pipelines/build.ts): two toolchains never share a compile entry.
 */
export function toolchainVersions(t: Toolchain): Record<string, string> {
  return { toolchain: `${t.name}@${t.hash}`, onnxruntime: t.pins['onnxruntime'], 'onnxruntime-qnn': t.pins['onnxruntime-qnn'] };
}
