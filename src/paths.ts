// Where forge keeps things. Everything outside the repo lives under FORGE_HOME so a fresh clone
// reuses the venv and cache of an earlier one on the same machine.
import { homedir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export function repoRoot(): string {
  return resolve(dirname(fileURLToPath(import.meta.url)), '..');
}

export function forgeHome(): string {
  return process.env.FORGE_HOME ? resolve(process.env.FORGE_HOME) : join(homedir(), '.cache', 'forge');
}

/** The stage cache; FORGE_CACHE moves it (tests use a private one). */
export function cacheRoot(): string {
  return process.env.FORGE_CACHE ? resolve(process.env.FORGE_CACHE) : join(forgeHome(), 'cache');
}
