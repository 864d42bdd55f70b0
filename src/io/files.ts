import { constants, copyFileSync, existsSync, linkSync, mkdirSync, readdirSync, statSync } from 'node:fs';
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

/** How placeTree put a file: its own copy-on-write clone, a second name of the same file, or a copy. */
export type Placed = 'reflink' | 'hardlink' | 'copy';

/**
 * Puts `from` at `to` without copying its bytes where the filesystem allows: a reflink (a file of its
 * own sharing the blocks, so an edit of either leaves the other alone), else a hard link (the same
 * file: nothing may write into either in place afterwards), else a copy.
 */
export function placeFile(from: string, to: string): Placed {
  try {
    copyFileSync(from, to, constants.COPYFILE_FICLONE_FORCE);
    return 'reflink';
  } catch {
    try {
      linkSync(from, to);
      return 'hardlink';
    } catch {
      copyFileSync(from, to);
      return 'copy';
    }
  }
}

/**
 * Copies the tree `from` into `to`, placing files of `linkAtLeast` bytes or more with placeFile
 * (a multi-GB context binary costs no copy) and copying the rest (the small files a user may edit,
 * such as README.md, stay files of their own). `skip` names paths relative to `from` left out.
 * Returns how many bytes went each way.
 */
export function placeTree(from: string, to: string, opts: { linkAtLeast: number; skip?: ReadonlySet<string> }): Record<Placed, number> {
  const bytes: Record<Placed, number> = { reflink: 0, hardlink: 0, copy: 0 };
  const walk = (rel: string) => {
    mkdirSync(join(to, rel), { recursive: true });
    for (const e of readdirSync(join(from, rel), { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (opts.skip?.has(r)) continue;
      if (e.isDirectory()) walk(r);
      else {
        const size = statSync(join(from, r)).size;
        const how = size >= opts.linkAtLeast ? placeFile(join(from, r), join(to, r)) : (copyFileSync(join(from, r), join(to, r)), 'copy' as const);
        bytes[how] += size;
      }
    }
  };
  walk('');
  return bytes;
}
