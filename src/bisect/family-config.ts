// A checkpoint's family module and its parsed config.json: what every bisect step that rebuilds or
// re-runs graphs outside the stages starts from (the stages parse it themselves).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { getFamily } from '../families/index.js';
import type { Family } from '../families/types.js';

export function familyConfig(familyId: string, checkpointDir: string): { family: Family<unknown>; config: unknown; configFile: string } {
  const family = getFamily(familyId as never) as Family<unknown>;
  const configFile = join(checkpointDir, 'config.json');
  return { family, config: family.parseConfig(JSON.parse(readFileSync(configFile, 'utf8')), configFile), configFile };
}
