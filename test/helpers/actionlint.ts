// actionlint for the workflow test: a pinned release built from source with Go's module proxy into
// FORGE_HOME/bin once (a minute or so), then reused. One clear error when Go is missing.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { $ } from 'zx';
import lockfile from 'proper-lockfile';
import { mkdirSync } from 'node:fs';
import { forgeHome } from '../../src/paths.js';

export const ACTIONLINT_VERSION = 'v1.7.12';

async function goBinary(): Promise<string> {
  for (const go of [process.env.GO, 'go', '/usr/local/go/bin/go'].filter(Boolean) as string[]) {
    if ((await $({ nothrow: true, quiet: true })`${go} version`).exitCode === 0) return go;
  }
  throw new Error(`actionlint ${ACTIONLINT_VERSION} is built with Go, and no go was found (tried $GO, go on PATH, /usr/local/go/bin/go): install Go >= 1.24 or put actionlint ${ACTIONLINT_VERSION} at ${join(forgeHome(), 'bin', 'actionlint')}`);
}

/** The actionlint binary at the pinned version, installed on first use. */
export async function ensureActionlint(): Promise<string> {
  const bin = join(forgeHome(), 'bin');
  const exe = join(bin, 'actionlint');
  const ok = async () => existsSync(exe) && (await $({ nothrow: true, quiet: true })`${exe} -version`).stdout.split('\n')[0].trim() === ACTIONLINT_VERSION;
  if (await ok()) return exe;
  mkdirSync(bin, { recursive: true });
  // Parallel test files (or machines sharing FORGE_HOME) build it once.
  const release = await lockfile.lock(bin, { lockfilePath: `${exe}.lock`, stale: 60_000, update: 10_000, retries: { retries: 600, minTimeout: 1_000, maxTimeout: 2_000 } });
  try {
    if (await ok()) return exe;
    const go = await goBinary();
    const r = await $({ nothrow: true, quiet: true, env: { ...process.env, GOBIN: bin } })`${go} install github.com/rhysd/actionlint/cmd/actionlint@${ACTIONLINT_VERSION}`;
    if (r.exitCode !== 0) throw new Error(`go install actionlint@${ACTIONLINT_VERSION} failed: ${r.stderr.trim().split('\n').slice(-5).join('\n')}`);
    return exe;
  } finally {
    await release().catch(() => undefined);
  }
}
