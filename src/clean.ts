import { readdirSync, rmSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { cacheRoot, forgeHome } from './paths.js';
import { RemoteCache } from './engine/remote-cache.js';
import { mb } from './units.js';

/** Removes the stage cache; with `all`, the Python environments and the tiny twins as well. Returns what it did. */
export async function clean(all: boolean): Promise<string> {
  const removed: string[] = [];
  if (existsSync(cacheRoot())) {
    rmSync(cacheRoot(), { recursive: true, force: true });
    removed.push(cacheRoot());
  }
  if (all && existsSync(forgeHome())) {
    for (const name of readdirSync(forgeHome()).filter((n) => n.startsWith('venv-') || n === 'twins')) {
      rmSync(join(forgeHome(), name), { recursive: true, force: true });
      removed.push(join(forgeHome(), name));
    }
  }
  return removed.length ? `removed ${removed.join(', ')}` : 'nothing to remove';
}

/**
 * `forge clean --sweep s3://bucket/prefix`: removes the shared cache's orphaned uploads older than
 * `hours` (RemoteCache.sweep); committed entries stay. Returns what it did, or would do (dry run).
 */
export async function sweepShared(url: string, hours: number, dryRun: boolean): Promise<string> {
  if (!Number.isFinite(hours) || hours < 0) throw new Error(`--older-than wants hours (a number ≥ 0), got '${hours}'`);
  const remote = await RemoteCache.open(url);
  const r = await remote.sweep({ olderThanMs: hours * 3600_000, dryRun });
  const lines = [
    `${remote.url}: ${r.entries} entries; ${r.orphans.length} orphaned upload${r.orphans.length === 1 ? '' : 's'} older than ${hours} h ${dryRun ? 'would be removed' : 'removed'} (${r.objects} objects, ${mb(r.bytes)})`,
    ...r.orphans.map((o) => `  ${o}`),
  ];
  if (r.young) lines.push(`kept ${r.young} younger upload${r.young === 1 ? '' : 's'} without a meta.json naming them (maybe still uploading)`);
  if (r.unreadable.length) lines.push(`left alone: ${r.unreadable.length} entr${r.unreadable.length === 1 ? 'y' : 'ies'} whose meta.json cannot be read (${r.unreadable.join(', ')}); the next build of each replaces it`);
  return lines.join('\n');
}
