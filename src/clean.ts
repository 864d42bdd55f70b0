import { readdirSync, rmSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { cacheRoot, forgeHome } from './paths.js';

/** Removes the stage cache; with `all`, the Python environments as well. Returns what it did. */
export async function clean(all: boolean): Promise<string> {
  const removed: string[] = [];
  if (existsSync(cacheRoot())) {
    rmSync(cacheRoot(), { recursive: true, force: true });
    removed.push(cacheRoot());
  }
  if (all && existsSync(forgeHome())) {
    for (const name of readdirSync(forgeHome()).filter((n) => n.startsWith('venv-'))) {
      rmSync(join(forgeHome(), name), { recursive: true, force: true });
      removed.push(join(forgeHome(), name));
    }
  }
  return removed.length ? `removed ${removed.join(', ')}` : 'nothing to remove';
}
