// Debian packages the test suite needs (headless Chromium for the report check, espeak-ng for the
// audio front-end's speech, the native build's
// headers). Installed with apt-get when missing and we are root (CI and fresh machines here);
// otherwise one error that says what to install.
import { $ } from 'zx';

async function has(cmd: string): Promise<boolean> {
  return (await $({ nothrow: true, quiet: true })`sh -c ${`command -v ${cmd} || dpkg -s ${cmd} 2>/dev/null | grep -q '^Status: install ok'`}`).exitCode === 0;
}

/** packages: Debian package name → a command or package name that shows it is installed. */
export async function ensureDebianPackages(packages: Record<string, string>, log: (m: string) => void): Promise<void> {
  const missing: string[] = [];
  for (const [pkg, probe] of Object.entries(packages)) if (!(await has(probe))) missing.push(pkg);
  if (!missing.length) return;
  const root = process.getuid?.() === 0;
  if (!root || !(await has('apt-get'))) throw new Error(`missing system packages: ${missing.join(' ')} (install them: apt-get install -y ${missing.join(' ')})`);
  log(`[forge] installing ${missing.join(', ')} with apt-get (first run only)`);
  const io = { stdio: ['ignore', 2, 2] as any, quiet: true, env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } };
  await $(io)`apt-get update -qq`;
  await $(io)`apt-get install -y -qq --no-install-recommends ${missing}`;
}
