// Headless Chromium (Debian's package) to check what a person would see in report.html.
import { $ } from 'zx';

const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];

export async function chromiumPath(): Promise<string | null> {
  for (const c of ['chromium', 'chromium-browser', 'google-chrome']) {
    const r = await $({ nothrow: true, quiet: true })`sh -c ${`command -v ${c}`}`;
    if (r.exitCode === 0) return r.stdout.trim();
  }
  return null;
}

/**
 * The DOM of a page after it loaded, as Chromium serialises it. `windowSize` (`1280,900`) lays the
 * page out as on a laptop screen, for a page whose own script measures it.
 */
export async function dumpDom(url: string, userDataDir: string, opts: { windowSize?: string } = {}): Promise<string> {
  const bin = await chromiumPath();
  if (!bin) throw new Error('chromium is not installed (apt-get install chromium); ./forge test installs it when run as root');
  const size = opts.windowSize ? [`--window-size=${opts.windowSize}`] : [];
  const r = await $({ quiet: true, timeout: '60s' })`${bin} ${FLAGS} ${size} --user-data-dir=${userDataDir} --dump-dom ${url}`;
  return r.stdout;
}
