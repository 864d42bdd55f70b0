// Hub downloads with @huggingface/hub into the standard HF cache layout (HF_HOME / HF_HUB_CACHE),
// honouring HF_HUB_OFFLINE (cache only), HF_ENDPOINT and HF_TOKEN. The token is passed to the
// library and never printed.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { homedir } from 'node:os';
import { snapshotDownload } from '@huggingface/hub';

export function hubCacheDir(): string {
  if (process.env.HF_HUB_CACHE) return process.env.HF_HUB_CACHE;
  return join(process.env.HF_HOME ?? join(homedir(), '.cache', 'huggingface'), 'hub');
}

export function cachedSnapshotDir(repo: string, revision: string): string {
  return join(hubCacheDir(), `models--${repo.replace('/', '--')}`, 'snapshots', revision);
}

export async function fetchHubSnapshot(repo: string, revision: string, log: (m: string) => void): Promise<string> {
  const cached = cachedSnapshotDir(repo, revision);
  const offline = ['1', 'true', 'yes'].includes((process.env.HF_HUB_OFFLINE ?? '').toLowerCase());
  if (offline) {
    if (!existsSync(cached)) throw new Error(`HF_HUB_OFFLINE is set and ${repo}@${revision} is not in the HF cache (${cached})`);
    return cached;
  }
  log(`downloading ${repo}@${revision} into ${hubCacheDir()}`);
  try {
    return await snapshotDownload({
      repo: { type: 'model', name: repo },
      revision,
      cacheDir: hubCacheDir(),
      hubUrl: process.env.HF_ENDPOINT,
      accessToken: process.env.HF_TOKEN,
    });
  } catch (e) {
    throw new Error(`could not download ${repo}@${revision}: ${(e as Error).message}`);
  }
}
