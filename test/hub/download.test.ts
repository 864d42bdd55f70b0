// Fetching a pinned revision into the HF cache layout from the loopback hub stand-in.
import { randomBytes } from 'node:crypto';
import { existsSync, lstatSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { cachedSnapshotDir, fetchHubSnapshot, hubCacheDir, hubSnapshotFiles } from '../../src/hub/download.js';
import { sha256 } from './fixture.js';
import { knownDigest } from '../../src/engine/known-digests.js';
import { GOOD_TOKEN, HubStandin } from './standin.js';

const REPO = 'org/tiny-model';
let hub: HubStandin;
let home: string;
let lines: string[];
const log = (m: string) => { lines.push(m); };
const saved = { ...process.env };
const files = {
  'config.json': Buffer.from('{"hidden_size": 8}\n'),
  'model.safetensors': randomBytes(300_000),
  'tokenizer/tokenizer.json': Buffer.from('{"model": {}}'),
  'sub/weights.bin': randomBytes(50_000),
};

beforeEach(async () => {
  hub = await HubStandin.start();
  lines = [];
  home = mkdtempSync(join(tmpdir(), 'forge-hf-home-'));
  process.env = { ...saved, HF_ENDPOINT: hub.url, HF_HOME: home };
  delete process.env.HF_HUB_CACHE;
  delete process.env.HF_HUB_OFFLINE;
  delete process.env.HF_TOKEN;
});
afterEach(async () => {
  await hub.close();
  process.env = { ...saved };
  expect(hub.unexpected).toEqual([]);
});

const repoDir = () => join(home, 'hub', 'models--org--tiny-model');

describe('fetch from the hub', () => {
  it('downloads a pinned revision into the HF cache layout, then reuses it with no network', async () => {
    const rev = hub.seed(REPO, files);
    const snap = await fetchHubSnapshot(REPO, rev, log);
    expect(snap).toBe(join(repoDir(), 'snapshots', rev));
    expect(hubCacheDir()).toBe(join(home, 'hub'));
    const head = hub.head(REPO)!;
    for (const [p, b] of Object.entries(files)) {
      expect(readFileSync(join(snap, p)), p).toEqual(b);
      expect(lstatSync(join(snap, p)).isSymbolicLink(), p).toBe(true);
      const stored = head.files.get(p)!;
      // The blob is named by the etag: the LFS sha256 for LFS files, the git blob id otherwise.
      const etag = stored.lfs ? sha256(b) : stored.oid;
      expect(readlinkSync(join(snap, p)).endsWith(`blobs/${etag}`), p).toBe(true);
      expect(readFileSync(join(repoDir(), 'blobs', etag))).toEqual(b);
      // A checked LFS blob's sha256 is kept by inode: the export's links to it are committed unread.
      expect(knownDigest(join(repoDir(), 'blobs', etag)), p).toBe(stored.lfs ? etag : undefined);
    }
    expect(readdirSync(join(repoDir(), 'blobs')).some((f) => f.endsWith('.incomplete'))).toBe(false);

    const listing = await hubSnapshotFiles(REPO, rev);
    expect(listing.revision).toBe(rev);
    expect(listing.files.find((f) => f.path === 'model.safetensors')!.sha256).toBe(sha256(files['model.safetensors']));
    expect(listing.files.find((f) => f.path === 'config.json')!.oid).toBe(head.files.get('config.json')!.oid);

    const n = hub.requests.length;
    expect(await fetchHubSnapshot(REPO, rev, log)).toBe(snap);
    expect(await hubSnapshotFiles(REPO, rev)).toEqual(listing);
    expect(hub.requests.length).toBe(n);
  });

  it('honours HF_HUB_CACHE over HF_HOME and sends HF_TOKEN for a private repo', async () => {
    const rev = hub.seed(REPO, files, { private: true });
    const cache = mkdtempSync(join(tmpdir(), 'forge-hub-cache-'));
    process.env.HF_HUB_CACHE = cache;
    await expect(fetchHubSnapshot(REPO, rev, log)).rejects.toThrow(/the hub refused the token \(401\) while listing org\/tiny-model@[0-9a-f]{40}: check HF_TOKEN \(none is set\)/);
    process.env.HF_TOKEN = GOOD_TOKEN;
    const snap = await fetchHubSnapshot(REPO, rev, log);
    expect(snap).toBe(join(cache, 'models--org--tiny-model', 'snapshots', rev));
    expect(readFileSync(join(snap, 'model.safetensors'))).toEqual(files['model.safetensors']);
    expect(existsSync(repoDir())).toBe(false);
    expect(lines.join('\n')).not.toContain(GOOD_TOKEN);
  });

  it('resumes a partial file with a Range request', async () => {
    const rev = hub.seed(REPO, files);
    hub.faults.dropDownload = { path: 'model.safetensors', afterBytes: 120_000 };
    await expect(fetchHubSnapshot(REPO, rev, log)).rejects.toThrow(/model\.safetensors: the transfer broke at .* run again to resume/);
    const incomplete = join(repoDir(), 'blobs', `${sha256(files['model.safetensors'])}.incomplete`);
    const partial = statSync(incomplete).size;
    expect(partial).toBeGreaterThan(0);
    expect(partial).toBeLessThan(files['model.safetensors'].length);

    const n = hub.requests.length;
    const snap = await fetchHubSnapshot(REPO, rev, log);
    expect(readFileSync(join(snap, 'model.safetensors'))).toEqual(files['model.safetensors']);
    const ranged = hub.requests.slice(n).filter((r) => r.path.startsWith('/cdn/') && r.range !== 'bytes=0-0');
    expect(ranged.map((r) => [r.range, r.status])).toEqual([[`bytes=${partial}-`, 206]]);
    expect(lines.join('\n')).toMatch(/resuming model\.safetensors at/);
    expect(existsSync(incomplete)).toBe(false);
  });

  it('refuses a download that does not match its hash, naming the file, and keeps nothing of it', async () => {
    const rev = hub.seed(REPO, files);
    hub.faults.corrupt = 'model.safetensors';
    const oid = sha256(files['model.safetensors']);
    await expect(fetchHubSnapshot(REPO, rev, log)).rejects.toThrow(new RegExp(`model\\.safetensors does not match the hub's sha256 \\(LFS oid\\): expected ${oid}`));
    expect(existsSync(join(repoDir(), 'blobs', oid))).toBe(false);
    expect(existsSync(join(repoDir(), 'blobs', `${oid}.incomplete`))).toBe(false);
    expect(existsSync(join(repoDir(), 'snapshots', rev, 'model.safetensors'))).toBe(false);
    // A corrupted regular file is caught by its git blob id the same way (in a fresh cache).
    process.env.HF_HUB_CACHE = mkdtempSync(join(tmpdir(), 'forge-hub-cache-'));
    hub.faults.corrupt = 'config.json';
    await expect(fetchHubSnapshot(REPO, rev, log)).rejects.toThrow(/config\.json does not match the hub's git blob id/);
    // Once the hub serves the right bytes, the fetch completes.
    hub.faults.corrupt = undefined;
    expect(readFileSync(join(await fetchHubSnapshot(REPO, rev, log), 'config.json'))).toEqual(files['config.json']);
  });

  it('re-checks blobs it did not finish itself, and fetches a bad one again', async () => {
    const rev = hub.seed(REPO, files);
    await fetchHubSnapshot(REPO, rev, log);
    // As if another tool had left the cache: no completion record, one blob damaged (same size).
    rmSync(join(repoDir(), '.forge-complete'), { recursive: true });
    const blob = join(repoDir(), 'blobs', sha256(files['model.safetensors']));
    writeFileSync(blob, randomBytes(files['model.safetensors'].length));
    const snap = await fetchHubSnapshot(REPO, rev, log);
    expect(readFileSync(join(snap, 'model.safetensors'))).toEqual(files['model.safetensors']);
    expect(lines.join('\n')).toContain('cached blob of model.safetensors does not match its hash; fetching it again');
  });

  it('offline mode reads the cache without a request and says clearly when it is not there', async () => {
    const rev = hub.seed(REPO, files);
    process.env.HF_HUB_OFFLINE = '1';
    await expect(fetchHubSnapshot(REPO, rev, log)).rejects.toThrow(`HF_HUB_OFFLINE is set and ${REPO}@${rev} is not in the HF cache (${cachedSnapshotDir(REPO, rev)})`);
    await expect(hubSnapshotFiles(REPO, rev)).rejects.toThrow(/HF_HUB_OFFLINE is set/);
    expect(hub.requests).toEqual([]);

    delete process.env.HF_HUB_OFFLINE;
    await fetchHubSnapshot(REPO, rev, log);
    const n = hub.requests.length;
    process.env.HF_HUB_OFFLINE = 'true';
    const snap = await fetchHubSnapshot(REPO, rev, log);
    expect(readFileSync(join(snap, 'sub/weights.bin'))).toEqual(files['sub/weights.bin']);
    const listing = await hubSnapshotFiles(REPO, rev);
    expect(listing.files.length).toBe(4);
    // A snapshot without forge's completion record (Python made it): hashes come from the blob names.
    rmSync(join(repoDir(), '.forge-complete'), { recursive: true });
    expect(await hubSnapshotFiles(REPO, rev)).toEqual(listing);
    expect(hub.requests.length).toBe(n);
  });
});
