// The family registry: a family id → its module. Families whose module is not written yet say so.
import type { FamilyId } from '../recipe/schema.js';
import type { Family } from './types.js';
import { qwen3 } from './qwen3.js';
import { qwen3_5 } from './qwen3_5.js';
import { phimoe } from './phimoe.js';
import { gemma4 } from './gemma4.js';
import { qwen3_vl } from './qwen3_vl.js';

const FAMILIES: Partial<Record<FamilyId, Family<any>>> = { qwen3, qwen3_5, phimoe, gemma4, qwen3_vl };

export function getFamily(id: FamilyId): Family<unknown> {
  const f = FAMILIES[id];
  if (!f) throw new Error(`family '${id}' has no module in src/families yet (only ${Object.keys(FAMILIES).join(', ')}); its tiny twin can be made, but it cannot be planned or exported`);
  return f;
}
