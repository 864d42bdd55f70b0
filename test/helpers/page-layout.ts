// What a person sees of a static report at 1280 × 900: the page is copied with a script that
// measures it (the reports carry no script of their own) and laid out by headless Chromium.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { dumpDom } from '../../src/toolchain/chromium.js';

export interface PageLayout {
  /** The page's width in CSS pixels: wider than the window means a horizontal scroll bar. */
  scrollWidth: number;
  /** Where the element asked for ends, from the top of the page (900: the fold). */
  bottom: number;
  /** The text of every table cell. */
  cells: string[];
  /** The DOM as loaded. */
  dom: string;
}

const MEASURE = (selector: string) => `<script>
const el = document.querySelector(${JSON.stringify(selector)});
const out = { scrollWidth: document.documentElement.scrollWidth, bottom: el ? el.getBoundingClientRect().bottom : -1,
  cells: [...document.querySelectorAll('td, th')].map((c) => c.textContent) };
const pre = document.createElement('pre'); pre.id = 'page-layout'; pre.textContent = JSON.stringify(out); document.body.append(pre);
</script>`;

export async function pageLayout(html: string, dir: string, selector: string): Promise<PageLayout> {
  const file = join(dir, 'measured.html');
  writeFileSync(file, html.replace('</body>', `${MEASURE(selector)}</body>`));
  const dom = await dumpDom(pathToFileURL(file).href, join(dir, 'chromium-profile'), { windowSize: '1280,900' });
  const m = /<pre id="page-layout">([\s\S]*?)<\/pre>/.exec(dom);
  if (!m) throw new Error('the page did not measure itself');
  const unescape = (s: string) => s.replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;/g, '"').replace(/&amp;/g, '&');
  return { ...(JSON.parse(unescape(m[1])) as Omit<PageLayout, 'dom'>), dom };
}

/** A cell a person should never see: text that parses as a JSON object or array, or holds one's opening. */
export function jsonCells(cells: string[]): string[] {
  return cells.filter((c) => {
    const t = c.trim();
    if (t.includes('{"') || t.includes('":')) return true;
    if (!/^[[{]/.test(t)) return false;
    try {
      return typeof JSON.parse(t) === 'object';
    } catch {
      return false;
    }
  });
}
