// A stage's code is part of its cache key: the content of its module and every local module it
// imports, transitively, and the local files they read as code (`new URL('./x.wat',
// import.meta.url)`). Editing any of them re-runs the stage; editing unrelated code does not.
// (A manual `version` bump alone is too easy to forget.)
import { readFileSync, existsSync } from 'node:fs';
import { dirname, relative, resolve } from 'node:path';
import { repoRoot } from '../paths.js';
import { createHash } from 'node:crypto';

// `import type` / `export type` lines are left out: types are erased before anything runs, and
// following them would tie a stage's key to every module whose types it names.
const IMPORT = /(?:import|export)\s(?!type\s)[^'"]*?from\s*['"](\.{1,2}\/[^'"]+)['"]|import\(\s*['"](\.{1,2}\/[^'"]+)['"]\s*\)|new URL\(\s*['"](\.{1,2}\/[^'"]+)['"]\s*,\s*import\.meta\.url\s*\)/g;

function resolveLocal(from: string, spec: string): string | null {
  const base = resolve(dirname(from), spec);
  for (const candidate of [base.replace(/\.js$/, '.ts'), base, `${base}.ts`]) if (existsSync(candidate)) return candidate;
  return null;
}

const memo = new Map<string, string>();

/** The module and every local file it depends on as code, transitively (absolute paths, sorted). */
export function codeFiles(modulePath: string): string[] {
  const seen = new Set<string>();
  const stack = [resolve(modulePath)];
  while (stack.length) {
    const file = stack.pop()!;
    if (seen.has(file)) continue;
    seen.add(file);
    const text = readFileSync(file, 'utf8');
    for (const m of text.matchAll(IMPORT)) {
      const dep = resolveLocal(file, m[1] ?? m[2] ?? m[3]);
      if (dep && !dep.includes('/node_modules/')) stack.push(dep);
    }
  }
  return [...seen].sort();
}

export function codeHash(modulePath: string): string {
  const hit = memo.get(modulePath);
  if (hit) return hit;
  const h = createHash('sha256');
  for (const file of codeFiles(modulePath)) h.update(relative(repoRoot(), file)).update('\0').update(readFileSync(file)).update('\0');
  const digest = h.digest('hex');
  memo.set(modulePath, digest);
  return digest;
}
