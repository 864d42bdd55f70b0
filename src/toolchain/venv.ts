// The Python environment (oracle, tiny twins, QNN compile): a venv outside the repo at
// FORGE_HOME/venv-<hash of requirements.txt>, created on first use and marked complete only after
// pip succeeds, so a killed install is redone rather than trusted.
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { $ } from 'zx';
import lockfile from 'proper-lockfile';
import { forgeHome } from '../paths.js';
import { sha256Hex } from '../engine/hash.js';
import { requirementsFile } from './versions.js';

const MARKER = '.forge-complete';

export function venvDir(): string {
  return join(forgeHome(), `venv-${sha256Hex(readFileSync(requirementsFile())).slice(0, 16)}`);
}

export function venvPython(): string {
  return join(venvDir(), 'bin', 'python');
}

export function venvReady(): boolean {
  return existsSync(join(venvDir(), MARKER));
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

export async function ensureVenv(log: (m: string) => void = (m) => process.stderr.write(`${m}\n`)): Promise<string> {
  if (venvReady()) return venvPython();
  const dir = venvDir();
  await mkdir(forgeHome(), { recursive: true });
  const release = await lockfile.lock(forgeHome(), {
    lockfilePath: `${dir}.lock`, stale: 60_000, update: 10_000,
    retries: { retries: 10_000, minTimeout: 1_000, maxTimeout: 5_000 },
  });
  try {
    if (venvReady()) return venvPython();
    log(`[forge] setting up the Python environment in ${dir} (first run only; downloads torch etc., a few minutes)`);
    await rm(dir, { recursive: true, force: true });
    const py = await basePython();
    const io = { stdio: ['ignore', 2, 2] as any, verbose: false, quiet: true };
    await $(io)`${py} -m venv ${dir}`;
    await $(io)`${join(dir, 'bin', 'python')} -m pip install --disable-pip-version-check --no-input -q -r ${requirementsFile()}`;
    await writeFile(join(dir, MARKER), new Date(0).toISOString());
    log('[forge] Python environment ready');
    return venvPython();
  } catch (e) {
    throw new Error(`could not set up the Python environment in ${dir}: ${(e as Error).message.split('\n')[0]}`);
  } finally {
    await release().catch(() => undefined);
  }
}
