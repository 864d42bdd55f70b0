// The front page keeps its promises: short, the two commands first (CI runs the second: .ci/run),
// a recipe a reader can copy that forge accepts, every docs/ page reachable from it, and no relative
// link in README.md or docs/ that leads nowhere (file or heading anchor, as GitHub renders them).
import { describe, expect, it } from 'vitest';
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { Lexer, marked, type Token, type Tokens } from 'marked';
import GithubSlugger from 'github-slugger';
import { parseRecipe } from '../src/recipe/load.js';
import { repoRoot } from '../src/paths.js';

const root = repoRoot();
const read = (file: string) => readFileSync(join(root, file), 'utf8');
const docs = readdirSync(join(root, 'docs')).filter((f) => f.endsWith('.md')).sort().map((f) => `docs/${f}`);
const pages = ['README.md', ...docs];

/** The visible text of inline tokens (what GitHub slugs a heading from: markup and code ticks dropped). */
function plainText(tokens: Token[] | undefined): string {
  return (tokens ?? []).map((t) => ('tokens' in t && t.tokens ? plainText(t.tokens) : 'text' in t ? String(t.text) : '')).join('');
}

function tokensOf(file: string): Token[] {
  return new Lexer().lex(read(file));
}

/** GitHub's anchors for a page's headings, in order (a repeated heading gets -1, -2 …). */
function anchorsOf(file: string): Set<string> {
  const slugger = new GithubSlugger();
  const anchors = new Set<string>();
  marked.walkTokens(tokensOf(file), (t) => {
    if (t.type === 'heading') anchors.add(slugger.slug(plainText((t as Tokens.Heading).tokens)));
  });
  return anchors;
}

function linksOf(file: string): string[] {
  const hrefs: string[] = [];
  marked.walkTokens(tokensOf(file), (t) => {
    if (t.type === 'link' || t.type === 'image') hrefs.push((t as Tokens.Link).href);
  });
  return hrefs;
}

const isRelative = (href: string) => !/^[a-z][a-z0-9+.-]*:/i.test(href);

describe('README.md, the front page', () => {
  const readme = read('README.md');

  it('is at most 250 lines', () => {
    expect(readme.split('\n').length).toBeLessThanOrEqual(250);
  });

  it('starts with the build and test commands, in one sh block, before anything else', () => {
    expect(readme.startsWith('```sh\n./forge build tiny-qwen3 --arch v81\n./forge test\n```\n')).toBe(true);
  });

  it('gives the test command CI runs (.ci/run)', () => {
    const ci = read('.ci/run').split('\n').filter((l) => l.trim() && !l.startsWith('#'));
    expect(ci).toContain('./forge test');
  });

  it('shows a recipe that forge accepts as written, from a local checkpoint', () => {
    const json = tokensOf('README.md').filter((t): t is Tokens.Code => t.type === 'code' && t.lang === 'json');
    expect(json.length).toBeGreaterThan(0);
    const recipe = parseRecipe(JSON.parse(json[0].text), 'README.md');
    expect(recipe.source.kind).toBe('local');
  });

  it('links every page in docs/', () => {
    const linked = new Set(linksOf('README.md').filter(isRelative).map((h) => h.split('#')[0]));
    expect(docs.filter((d) => !linked.has(d))).toEqual([]);
  });
});

describe('relative links in README.md and docs/', () => {
  for (const page of pages) {
    it(`${page}: every relative link names a file that exists, and a heading it has`, () => {
      const broken: string[] = [];
      for (const href of linksOf(page).filter(isRelative)) {
        const [path, anchor] = href.split('#');
        const target = path ? resolve(root, dirname(page), decodeURIComponent(path)) : join(root, page);
        if (!existsSync(target)) {
          broken.push(`${href}: no file ${relative(root, target)}`);
          continue;
        }
        if (anchor !== undefined && (!target.endsWith('.md') || statSync(target).isDirectory() || !anchorsOf(relative(root, target)).has(anchor))) {
          broken.push(`${href}: no heading #${anchor} in ${relative(root, target)}`);
        }
      }
      expect(broken).toEqual([]);
    });
  }
});
