// Once per test run: the Python environment (tiny twins and the oracle need it) and a private stage
// cache, so tests never touch the user's cache and start cold.
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { ensureVenv } from '../src/toolchain/venv.js';

export default async function setup(): Promise<() => void> {
  await ensureVenv();
  const cache = mkdtempSync(join(tmpdir(), 'forge-test-cache-'));
  process.env.FORGE_CACHE = cache;
  return () => rmSync(cache, { recursive: true, force: true });
}
