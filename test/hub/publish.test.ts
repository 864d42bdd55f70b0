// `forge publish` against the loopback hub stand-in: what reaches the hub, and what never does.
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { formatPlan, publishBundle } from '../../src/hub/publish.js';
import { BUNDLE_FILES, changeFile, makeBundle, sha256 } from './fixture.js';
import { GOOD_TOKEN, HubStandin } from './standin.js';
import { forge } from '../helpers/forge-cli.js';

const REPO = 'forge-test/tiny-v81';
let hub: HubStandin;
let lines: string[];
const log = (m: string) => { lines.push(m); };
const saved = { ...process.env };

beforeEach(async () => {
  hub = await HubStandin.start();
  lines = [];
  process.env.HF_ENDPOINT = hub.url;
  process.env.HF_TOKEN = GOOD_TOKEN;
});
afterEach(async () => {
  await hub.close();
  process.env = { ...saved };
  expect(hub.unexpected).toEqual([]);
});

/** A loopback URL on which nothing listens: a hub that cannot be reached. */
async function closedPortUrl(): Promise<string> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((r) => server.close(() => r()));
  return `http://127.0.0.1:${port}`;
}

const puts = () => hub.requests.filter((r) => r.method === 'PUT');
const commitsOf = (repo = REPO) => hub.repos.get(repo)?.commits ?? [];

describe('publish', () => {
  it('first publish creates the repo and uploads every file in one commit', async () => {
    const dir = makeBundle();
    const r = await publishBundle({ bundleDir: dir, repo: REPO, private: true, log });
    expect(r.createsRepo).toBe(true);
    expect(r.commit?.oid).toBe(hub.head(REPO)!.oid);
    expect(hub.repos.get(REPO)!.private).toBe(true);
    // The hub's initial commit, then ours: one commit for the whole bundle.
    expect(commitsOf().map((c) => c.title)).toEqual(['initial commit', 'forge publish tiny/v81']);
    const files = hub.head(REPO)!.files;
    expect([...files.keys()].sort()).toEqual(['.gitattributes', ...BUNDLE_FILES, 'SHA256SUMS'].sort());
    expect(files.has('build/run.json')).toBe(false);
    for (const p of [...BUNDLE_FILES, 'SHA256SUMS']) {
      const f = files.get(p)!;
      const local = readFileSync(join(dir, p));
      expect(f.lfs ? f.lfs.oid : undefined, p).toBe(f.lfs ? sha256(local) : undefined);
      expect(f.lfs ? hub.lfs.get(f.lfs.oid) : f.content, p).toEqual(local);
    }
    // Binary files went through LFS, text files inline.
    expect(files.get('model.onnx')!.lfs).toBeDefined();
    expect(files.get('manifest.json')!.lfs).toBeUndefined();
    expect(puts().length).toBe(3);
    expect(r.plan.every((p) => p.action === 'upload' && p.reason === 'new')).toBe(true);
    expect(lines.join('\n')).toMatch(/committed [0-9a-f]{10}: 7 file\(s\)/);
    expect(lines.join('\n')).not.toContain(GOOD_TOKEN);
  });

  it('re-publishing an unchanged bundle uploads nothing and makes no commit; a changed file goes alone', async () => {
    const dir = makeBundle();
    await publishBundle({ bundleDir: dir, repo: REPO, log });
    const before = hub.requests.length;
    const r = await publishBundle({ bundleDir: dir, repo: REPO, log });
    expect(r.commit).toBeNull();
    expect(r.plan.every((p) => p.action === 'skip-unchanged')).toBe(true);
    expect(hub.requests.slice(before).map((q) => `${q.method} ${q.path.split('/').slice(0, 3).join('/')}`))
      .toEqual(['GET /api/whoami-v2', 'GET /api/models', 'GET /api/models']);
    expect(commitsOf().length).toBe(2);
    expect(lines.join('\n')).toContain('nothing to upload');

    changeFile(dir, 'model.data');
    const mark = hub.requests.length;
    const r2 = await publishBundle({ bundleDir: dir, repo: REPO, log });
    expect(r2.plan.filter((p) => p.action === 'upload').map((p) => [p.path, p.reason]).sort())
      .toEqual([['SHA256SUMS', 'changed'], ['model.data', 'changed']]);
    expect(hub.requests.slice(mark).filter((q) => q.method === 'PUT').length).toBe(1);
    expect(commitsOf().length).toBe(3);
    expect(hub.lfs.get(hub.head(REPO)!.files.get('model.data')!.lfs!.oid)).toEqual(readFileSync(join(dir, 'model.data')));
  });

  it('an interrupted upload resumes without sending the objects that arrived', async () => {
    const dir = makeBundle();
    const dataOid = sha256(readFileSync(join(dir, 'model.data')));
    hub.faults.failUpload = { oid: dataOid, afterBytes: 64_000, afterStored: 2 };
    await expect(publishBundle({ bundleDir: dir, repo: REPO, log })).rejects.toThrow(/nothing was committed \(run again to resume/);
    expect(commitsOf().length).toBe(1); // just the repo's initial commit
    expect(hub.lfs.size).toBe(2);
    const firstPuts = puts().map((p) => p.path);

    await publishBundle({ bundleDir: dir, repo: REPO, log });
    const secondPuts = puts().map((p) => p.path).slice(firstPuts.length);
    // Only the interrupted object travels again; the LFS batch said the others were there.
    expect(secondPuts).toEqual([`/lfs-upload/${dataOid}`]);
    expect(firstPuts.filter((p) => p !== `/lfs-upload/${dataOid}`).length).toBe(2);
    expect(commitsOf().length).toBe(2);
    expect(hub.head(REPO)!.files.get('model.data')!.lfs!.oid).toBe(dataOid);
  });

  it.each([
    ['a failed gate', { gates: { oracle: { ok: false }, parity: { ok: true } } }, /refusing to publish .*v81: gate oracle failed$/],
    ['a missing gate', { gates: { oracle: { ok: true } } }, /refusing to publish .*v81: gate parity is missing from build\/run.json although the recipe asks for it$/],
    ['a simulator gate entry removed although the recipe asks for it', { gatesRequired: ['oracle', 'parity', 'emulation'] },
      /refusing to publish .*v81: gate emulation is missing from build\/run.json although the recipe asks for it$/],
    ['a simulator gate the recipe asks for but the build did not run', { gatesRequired: ['oracle', 'parity', 'emulation'], gatesNotRun: { emulation: 'QAIRT build' } },
      /refusing to publish .*v81: gate emulation was not run \(QAIRT build\) but the recipe asks for it$/],
    ['a simulator gate that ran and failed', { gatesRequired: ['oracle', 'parity', 'emulation'], gates: { oracle: { ok: true }, parity: { ok: true }, emulation: { ok: false } } },
      /refusing to publish .*v81: gate emulation failed$/],
    ['a gate stage in the record whose gate entry and requirement were both removed',
      { record: { stages: ['fetch', 'oracle', 'parity', 'emulation', 'bundle'].map((name) => ({ name, status: 'ran', seconds: 1, peakRssBytes: null })) } },
      /refusing to publish .*v81: gate emulation is missing from build\/run.json although the recipe asks for it$/],
    ['a record that does not say which gates the recipe asks for', { gatesRequired: null },
      /refusing to publish .*v81: build\/run.json does not say which gates its recipe asks for \(gatesRequired\); rebuild it with this forge$/],
    ['a partial build (--until)', { record: { status: 'partial', until: 'export' } },
      /refusing to publish .*v81: the run was "partial", not a whole build \(build\/run.json status\); it is a partial build \(--until export\): it made no gated bundle$/],
    ['a build with a skipped stage', { record: { stages: [{ name: 'parity', status: 'skipped', seconds: 0, peakRssBytes: null }] } },
      /refusing to publish .*v81: stage parity was skipped, so this is not a whole build$/],
    // A graph's own verdict counts even where the gate-level flag says ok (issue 36): the gate and the graph are named.
    ['a failed graph verdict under an oracle gate that says ok',
      { gates: { oracle: { ok: true, graphs: { 'quantize:w8/lm_head': { minCosine: 0.9999, ok: true, top1: '270/270' }, 'quantize:w8/shard0.decode': { minCosine: 0.5, ok: false } } }, parity: { ok: true } } },
      /refusing to publish .*v81: gate oracle says ok, but a verdict inside it failed: graph quantize:w8\/shard0\.decode failed: min cosine 0\.5$/],
    ['a failed parity variant under a parity gate that says ok',
      { gates: { oracle: { ok: true }, parity: { ok: true, variants: { export: { ok: true, matched: 128, total: 128, ties: 0 }, quantize: { ok: false, matched: 90, total: 128, ties: 2 } } } } },
      /refusing to publish .*v81: gate parity says ok, but a verdict inside it failed: variant quantize failed: 90\/128 matched, 2 ties$/],
    ['failed simulator verdicts (graph and parity) under an emulation gate that says ok', {
      gatesRequired: ['oracle', 'parity', 'emulation'],
      gates: { oracle: { ok: true }, parity: { ok: true }, emulation: { ok: true, oracle: { ok: true, graphs: { lm_head: { minCosine: 0.9, ok: false, top1: '200/270' } } }, parity: { ok: false, matched: 100, total: 128 } } },
    }, /refusing to publish .*v81: gate emulation says ok, but 2 verdicts inside it failed: graph lm_head \(oracle\) failed: min cosine 0\.9, top-1 200\/270; parity failed: 100\/128 matched$/],
    ['a failed gate, naming the graph that failed it', { gates: { oracle: { ok: false, graphs: { 'export:fp32/shard0.prefill': { minCosine: 0.97, ok: false } } }, parity: { ok: true } } },
      /refusing to publish .*v81: gate oracle failed \(graph export:fp32\/shard0\.prefill failed: min cosine 0\.97\)$/],
    ['a failed build', { ok: false }, /refusing to publish .*: the build did not pass/],
    ['no run record', { noRunRecord: true }, /refusing to publish .*: build\/run.json is missing/],
  ])('refuses %s before any request', async (_name, opts, msg) => {
    const dir = makeBundle(opts);
    await expect(publishBundle({ bundleDir: dir, repo: REPO, log })).rejects.toThrow(msg);
    expect(hub.requests).toEqual([]);
  });

  it('refuses files that do not match SHA256SUMS, naming the file, before any request', async () => {
    const dir = makeBundle();
    writeFileSync(join(dir, 'model.onnx'), Buffer.from('tampered'));
    await expect(publishBundle({ bundleDir: dir, repo: REPO, log })).rejects.toThrow(/model\.onnx does not match SHA256SUMS/);
    const dir2 = makeBundle();
    rmSync(join(dir2, 'tokenizer.json'));
    await expect(publishBundle({ bundleDir: dir2, repo: REPO, log })).rejects.toThrow(/tokenizer\.json is listed in SHA256SUMS but missing/);
    const dir3 = makeBundle();
    writeFileSync(join(dir3, 'stray.bin'), 'x');
    await expect(publishBundle({ bundleDir: dir3, repo: REPO, log })).rejects.toThrow(/not covered by SHA256SUMS: stray\.bin/);
    expect(hub.requests).toEqual([]);
  });

  it('a bad token is one clear error, no commit, and its text appears nowhere', async () => {
    const secret = 'hf_thisIsAVerySecretBadToken42';
    const dir = makeBundle();
    for (const via of ['option', 'env']) {
      if (via === 'env') process.env.HF_TOKEN = secret;
      const err = await publishBundle({ bundleDir: dir, repo: REPO, log, ...(via === 'option' ? { accessToken: secret } : {}) }).catch((e: Error) => e);
      expect(err).toBeInstanceOf(Error);
      expect((err as Error).message).toMatch(/^the hub refused the token \(401\) while checking the token: check HF_TOKEN$/);
      const everything = [(err as Error).message, (err as Error).stack ?? '', ...lines].join('\n');
      expect(everything).not.toContain(secret);
      expect(everything).not.toContain(secret.slice(3, 12));
    }
    expect(hub.writes()).toEqual([]);
    expect(hub.repos.size).toBe(0);
    delete process.env.HF_TOKEN;
    await expect(publishBundle({ bundleDir: dir, repo: REPO, log })).rejects.toThrow(/needs a hub token with write access: set HF_TOKEN/);
  });

  it('will not put a bundle meant to be private into an existing public repo', async () => {
    const dir = makeBundle();
    await publishBundle({ bundleDir: dir, repo: REPO, private: false, log });
    changeFile(dir, 'model.onnx');
    const mark = hub.requests.length;
    await expect(publishBundle({ bundleDir: dir, repo: REPO, private: true, log })).rejects.toThrow(`refusing to publish to ${REPO}: it is public and a private repo was asked for`);
    expect(hub.requests.slice(mark).every((q) => q.method === 'GET')).toBe(true);
  });

  it('a dry run without a token plans against what is publicly visible', async () => {
    delete process.env.HF_TOKEN;
    const dir = makeBundle();
    const r = await publishBundle({ bundleDir: dir, repo: REPO, dryRun: true, log });
    expect(r.createsRepo).toBe(true);
    expect(hub.requests.map((q) => `${q.method} ${q.status}`)).toEqual(['GET 401']);
    expect(lines.join('\n')).toContain('is not visible (absent, or private)');
  });

  it('says which gates the build did not run, and why', async () => {
    const dir = makeBundle({ gatesNotRun: { emulation: 'tiny recipes only' } });
    await publishBundle({ bundleDir: dir, repo: REPO, dryRun: true, log });
    expect(lines.join('\n')).toContain('gates this build did not run: emulation (not run: tiny recipes only)');
  });

  it('a dry run with the hub unreachable lists every file as an upload and says it compared nothing', async () => {
    process.env.HF_ENDPOINT = await closedPortUrl();
    const dir = makeBundle();
    const r = await publishBundle({ bundleDir: dir, repo: REPO, dryRun: true, log });
    expect(r.compared).toBe(false);
    expect(r.plan.map((p) => p.path).sort()).toEqual([...BUNDLE_FILES, 'SHA256SUMS'].sort());
    expect(r.plan.every((p) => p.action === 'upload' && p.reason === 'not compared')).toBe(true);
    const text = lines.join('\n');
    expect(text).toContain(`could not reach the hub (ECONNREFUSED): not compared with what ${REPO} holds; every file is listed as an upload`);
    expect(text).toContain(`→ ${REPO} (hub not reached) [dry run]`);
    expect(text).toMatch(/upload \(not compared\)\s+150\.0 KB {2}model\.onnx/);
    expect(text).not.toContain(GOOD_TOKEN);
    // Without a token too (no whoami call: the first request is the repo lookup).
    delete process.env.HF_TOKEN;
    expect((await publishBundle({ bundleDir: dir, repo: REPO, dryRun: true, log })).compared).toBe(false);
  });

  it('forge publish --dry-run works offline from the command line (exit 0, the plan, one line saying so)', async () => {
    const dir = makeBundle();
    const run = await forge(['publish', dir, '--repo', REPO, '--dry-run'], { HF_ENDPOINT: await closedPortUrl(), HF_TOKEN: GOOD_TOKEN });
    expect(run.code).toBe(0);
    expect(run.stderr).toContain(`could not reach the hub (ECONNREFUSED): not compared with what ${REPO} holds; every file is listed as an upload`);
    expect(run.stderr).toMatch(/upload \(not compared\)\s+400\.0 KB {2}model\.data/);
    expect(run.stderr).not.toMatch(/fetch failed|\n\s+at /);
    const real = await forge(['publish', dir, '--repo', REPO], { HF_ENDPOINT: await closedPortUrl(), HF_TOKEN: GOOD_TOKEN });
    expect(real.code).toBe(1);
    expect(real.stderr.trim()).toBe('forge: could not reach the hub while checking the token (ECONNREFUSED): check the network, or HF_ENDPOINT if it is set');
  });

  it('a real publish with the hub unreachable fails in one line that says so', async () => {
    process.env.HF_ENDPOINT = await closedPortUrl();
    const err = await publishBundle({ bundleDir: makeBundle(), repo: REPO, log }).catch((e: Error) => e);
    expect((err as Error).message).toBe('could not reach the hub while checking the token (ECONNREFUSED): check the network, or HF_ENDPOINT if it is set');
  });

  it('a dry run prints the plan and makes no write request', async () => {
    const dir = makeBundle();
    const r = await publishBundle({ bundleDir: dir, repo: REPO, dryRun: true, log });
    expect(r.createsRepo).toBe(true);
    expect(hub.writes()).toEqual([]);
    const text = lines.join('\n');
    expect(text).toContain(`→ ${REPO} (new repo) [dry run]`);
    expect(text).toMatch(/upload \(new\)\s+150\.0 KB {2}model\.onnx/);
    expect(text).toContain('7 to upload (');

    await publishBundle({ bundleDir: dir, repo: REPO, log });
    changeFile(dir, 'README.md', Buffer.from('# changed\n'));
    lines = [];
    const mark = hub.requests.length;
    const r2 = await publishBundle({ bundleDir: dir, repo: REPO, dryRun: true, log });
    expect(hub.requests.slice(mark).every((q) => q.method === 'GET')).toBe(true);
    expect(commitsOf().length).toBe(2);
    expect(formatPlan(r2)).toMatch(/skip-unchanged\s+150\.0 KB {2}model\.onnx/);
    expect(formatPlan(r2)).toMatch(/upload \(changed\)\s+10 B {2}README\.md/);
    expect(lines.join('\n')).toContain('2 to upload (');
  });
});
