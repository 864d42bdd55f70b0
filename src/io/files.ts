import { copyFileSync, existsSync, linkSync, readdirSync } from 'node:fs';
import { join, relative, sep } from 'node:path';

/** Hard-links `from` to `to` (no copy of gigabytes for a scratch bundle), copying across filesystems. */
export function linkOrCopy(from: string, to: string): void {
  if (existsSync(to)) return;
  try {
    linkSync(from, to);
  } catch {
    copyFileSync(from, to);
  }
}

/** Every file below dir as a sorted, '/'-separated path relative to it (a checkpoint's file names). */
export function listFilesBelow(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out.push(relative(dir, p).split(sep).join('/'));
    }
  };
  walk(dir);
  return out.sort();
}
