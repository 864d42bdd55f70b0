// The Python environment (oracle, tiny twins, QNN compile): a venv outside the repo at
// FORGE_HOME/venv-<hash of its requirements file>, created on first use and marked complete only
// after pip succeeds, so a killed install is redone rather than trusted. The main one is made from
// oracles/requirements.txt; a pinned compile toolchain (toolchains/<name>.txt) gets its own, by the
// same code, keyed by its own file.
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { $ } from 'zx';
import lockfile from 'proper-lockfile';
import { forgeHome } from '../paths.js';
import { sha256Hex } from '../engine/hash.js';
import { requirementsFile } from './versions.js';

const MARKER = '.forge-complete';

/** What a venv is keyed by: the first 16 hex digits of its requirements file's sha256. */
export function requirementsHash(requirements = requirementsFile()): string {
  return sha256Hex(readFileSync(requirements)).slice(0, 16);
}

/** The venv of a requirements hash (a stage gets the hash in its params, not a path, so keys do not depend on where the repo is). */
export function venvDirOf(hash: string): string {
  return join(forgeHome(), `venv-${hash}`);
}

export function venvDir(requirements = requirementsFile()): string {
  return venvDirOf(requirementsHash(requirements));
}

export function venvPython(requirements = requirementsFile()): string {
  return join(venvDir(requirements), 'bin', 'python');
}

export function venvReady(requirements = requirementsFile()): boolean {
  return existsSync(join(venvDir(requirements), MARKER));
}

/**
 * The python of an already set-up venv, by hash: for stages, whose build made the venv before the
 * pipeline ran (a stage has no requirements path to make it from).
 */
export function readyVenvPython(hash: string): string {
  const dir = venvDirOf(hash);
  if (!existsSync(join(dir, MARKER))) throw new Error(`the toolchain venv ${dir} is not set up (forge build makes it before the pipeline runs; run the build again)`);
  return join(dir, 'bin', 'python');
}

/** A python3 >= 3.11 to build the venv with (onnxruntime-qnn ships cp311+ wheels only). */
async function basePython(): Promise<string> {
  const candidates = [process.env.FORGE_BASE_PYTHON, 'python3.11', 'python3.12', 'python3'].filter(Boolean) as string[];
  for (const c of candidates) {
    const r = await $({ nothrow: true, quiet: true })`${c} -c ${'import sys; print("%d.%d" % sys.version_info[:2])'}`;
    if (r.exitCode !== 0) continue;
    const [maj, min] = r.stdout.trim().split('.').map(Number);
    if (maj === 3 && min >= 11) return c;
  }
  throw new Error('no python3 >= 3.11 found (tried ' + candidates.join(', ') + '); install Python 3.11+ or set FORGE_BASE_PYTHON');
}

/**
 * The python a compile toolchain (compile-stage.ts's CompileToolchain) compiles and simulates with:
 * a pinned one's venv, by hash; undefined for the main venv's (the callers' default).
 */
export function toolchainPython(t: { kind: string; env?: { hash: string } }): string | undefined {
  return t.kind === 'onnxruntime-qnn' && t.env ? readyVenvPython(t.env.hash) : undefined;
}

export async function ensureVenv(log: (m: string) => void = (m) => process.stderr.write(`${m}\n`), requirements = requirementsFile()): Promise<string> {
  if (venvReady(requirements)) return venvPython(requirements);
  const dir = venvDir(requirements);
  await mkdir(forgeHome(), { recursive: true });
  const release = await lockfile.lock(forgeHome(), {
    lockfilePath: `${dir}.lock`, stale: 60_000, update: 10_000,
    retries: { retries: 10_000, minTimeout: 1_000, maxTimeout: 5_000 },
  });
  try {
    if (venvReady(requirements)) return venvPython(requirements);
    log(`[forge] setting up the Python environment in ${dir} from ${requirements} (first run only; a few minutes)`);
    await rm(dir, { recursive: true, force: true });
    const py = await basePython();
    const io = { stdio: ['ignore', 2, 2] as any, verbose: false, quiet: true };
    await $(io)`${py} -m venv ${dir}`;
    await $(io)`${join(dir, 'bin', 'python')} -m pip install --disable-pip-version-check --no-input -q -r ${requirements}`;
    await writeFile(join(dir, MARKER), new Date(0).toISOString());
    log('[forge] Python environment ready');
    return venvPython(requirements);
  } catch (e) {
    throw new Error(`could not set up the Python environment in ${dir}: ${(e as Error).message.split('\n')[0]}`);
  } finally {
    await release().catch(() => undefined);
  }
}
