// Regenerates src/bundle/manifest.schema.json from the zod schema: `npm run manifest-schema`.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { manifestJsonSchema } from './manifest.js';
import { repoRoot } from '../paths.js';

writeFileSync(join(repoRoot(), 'src', 'bundle', 'manifest.schema.json'), JSON.stringify(manifestJsonSchema(), null, 2) + '\n');
