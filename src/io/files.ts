import { copyFileSync, existsSync, linkSync } from 'node:fs';

/** Hard-links `from` to `to` (no copy of gigabytes for a scratch bundle), copying across filesystems. */
export function linkOrCopy(from: string, to: string): void {
  if (existsSync(to)) return;
  try {
    linkSync(from, to);
  } catch {
    copyFileSync(from, to);
  }
}
