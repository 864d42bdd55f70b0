// The output directory gets the bundle's big files from the stage cache by link, not by copy, and
// nothing forge writes there (or a user edits there) reaches the cache entry.
import { describe, it, expect, onTestFinished } from 'vitest';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { sha256OfFile } from '../src/engine/hash.js';
import { placeFile } from '../src/io/files.js';

describe('output directory', () => {
  it('links the bundle\'s big files from the cache (copies the small ones), and writing the output never reaches the cache', { timeout: 900_000 }, async () => {
    const work = mkdtempSync(join(tmpdir(), 'forge-out-links-'));
    onTestFinished(() => rmSync(work, { recursive: true, force: true }));
    const out = join(work, 'out');
    const linkAtLeastBytes = 100_000; // the tiny twin's context binaries and embedding table
    const first = await build({ recipe: 'tiny-qwen3', arch: 'v81', out, progress: silentProgress, linkAtLeastBytes });
    expect(first.ok, first.error).toBe(true);
    const entry = join(cacheRoot(), 'bundle', first.stages.find((s) => s.name === 'bundle')!.key!);
    const recorded = (JSON.parse(readFileSync(join(entry, 'meta.json'), 'utf8')) as { files: Record<string, { sha256: string }> }).files;
    const files = readdirSync(out).filter((f) => f !== 'build');
    const big = files.filter((f) => statSync(join(out, f)).size >= linkAtLeastBytes);
    expect(big.sort()).toEqual(['embedding.f16.bin', 'lm_head.bin', 'shard0.bin']);
    // What this filesystem does with a big file: a reflink is a file of its own, a hard link the cache's own file.
    const probe = join(entry, '..', `.probe-${process.pid}`);
    writeFileSync(probe, 'x');
    const how = placeFile(probe, `${probe}.placed`);
    rmSync(probe);
    rmSync(`${probe}.placed`);
    for (const f of files) {
      expect(readFileSync(join(out, f)).equals(readFileSync(join(entry, f))), f).toBe(true);
      expect(statSync(join(out, f)).ino === statSync(join(entry, f)).ino, f).toBe(big.includes(f) && how === 'hardlink');
    }
    // A user's edit of a copied file stays in out/; a rebuild replaces out/ whole, and the cache is as recorded.
    writeFileSync(join(out, 'README.md'), 'edited');
    const again = await build({ recipe: 'tiny-qwen3', arch: 'v81', out, progress: silentProgress, linkAtLeastBytes });
    expect(again.ok, again.error).toBe(true);
    for (const [f, d] of Object.entries(recorded)) expect(await sha256OfFile(join(entry, f)), f).toBe(d.sha256);
    for (const f of files) expect(readFileSync(join(out, f)).equals(readFileSync(join(entry, f))), f).toBe(true);
  });
});
