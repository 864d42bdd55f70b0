// Checks a checkpoint against its family before anything else reads it: every header and index is
// well-formed, config.json parses, and every tensor the graphs will read exists with the shape the
// config implies. A damaged download fails here, with one error naming the file and tensor, rather
// than deep inside the oracle or the export.
import { readFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { openCheckpoint } from '../io/checkpoint.js';
import type { FamilyId } from '../recipe/schema.js';
import { getFamily } from './index.js';
import type { Family, TensorSpec } from './types.js';
import { allTensors, modelTensors } from './tensors.js';

/**
 * `tensors`: how many distinct tensors the graphs and host tables read; `reads`: their names (what
 * fetch's NaN/Inf check covers).
 */
export async function validateCheckpoint(familyId: FamilyId, dir: string): Promise<{ tensors: number; reads: string[] }> {
  const family = getFamily(familyId) as Family<unknown>;
  const configFile = join(dir, 'config.json');
  if (!existsSync(configFile)) throw new Error(`${configFile}: missing (every checkpoint needs its config.json)`);
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(configFile, 'utf8'));
  } catch (e) {
    throw new Error(`${configFile}: not valid JSON (${(e as Error).message})`);
  }
  const config = family.parseConfig(raw, configFile);
  // What the graph builders and the host tables read (families/tensors.ts).
  const specs: TensorSpec[] = allTensors(await modelTensors(family, config));
  const ckpt = await openCheckpoint(dir);
  try {
    for (const t of specs) ckpt.expectShape(t.name, t.shape);
  } finally {
    await ckpt.close();
  }
  const reads = [...new Set(specs.map((t) => t.name))];
  return { tensors: reads.length, reads };
}
