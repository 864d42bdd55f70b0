// Once per test run: the Python environment (tiny twins and the oracle need it) and a private stage
// cache, so tests never touch the user's cache and start cold.
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { ensureVenv } from '../src/toolchain/venv.js';

export default async function setup(): Promise<() => void> {
  await ensureVenv();
  // `forge test` hands one private cache to vitest and then to the native suite's bundles (the same
  // tiny builds, made once); it removes it itself. A plain vitest run makes and removes its own.
  const shared = process.env.FORGE_TEST_CACHE;
  const cache = shared ?? mkdtempSync(join(tmpdir(), 'forge-test-cache-'));
  process.env.FORGE_CACHE = cache;
  return () => { if (!shared) rmSync(cache, { recursive: true, force: true }); };
}
