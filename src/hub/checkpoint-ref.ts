// What the fetch stage leaves: checkpoint.json naming where the weights are. Tiny twins live inside
// the cache entry (relative path); local and hub checkpoints stay where they are (absolute path) so
// an 8 GB model is never copied into the cache.
import { readFileSync } from 'node:fs';
import { isAbsolute, join } from 'node:path';
import type { PinnedSource } from '../recipe/schema.js';

export interface CheckpointRef {
  dir: string;
  source: PinnedSource;
  /** Relative path → size of every file, as seen when fetched. */
  files: Record<string, number>;
  /**
   * Local checkpoints: relative path → sha256. The weights stay outside the cache, so this is what
   * makes an edit in place (even one that keeps every size and the mtime) a new input downstream.
   */
  digest?: Record<string, string>;
}

export const CHECKPOINT_REF = 'checkpoint.json';

export function readCheckpointRef(fetchOutput: string): CheckpointRef & { absDir: string } {
  const ref = JSON.parse(readFileSync(join(fetchOutput, CHECKPOINT_REF), 'utf8')) as CheckpointRef;
  return { ...ref, absDir: isAbsolute(ref.dir) ? ref.dir : join(fetchOutput, ref.dir) };
}
