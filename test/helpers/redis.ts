// A private redis-server for a test: a free loopback port, nothing saved to disk, stopped after.
// Installed with apt-get on a fresh Debian machine (as ./forge test does for Chromium).
import { spawn, type ChildProcess } from 'node:child_process';
import { freePort } from './free-port.js';
import { Redis } from 'ioredis';
import { ensureDebianPackages } from '../../src/toolchain/system-deps.js';

export interface RedisServer { url: string; stop(): Promise<void> }

export async function startRedis(): Promise<RedisServer> {
  await ensureDebianPackages({ 'redis-server': 'redis-server' }, (m) => process.stderr.write(`${m}\n`));
  const port = await freePort();
  const proc: ChildProcess = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  const url = `redis://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => undefined);
    try {
      await probe.connect();
      await probe.ping();
      break;
    } catch (e) {
      if (i > 100 || proc.exitCode !== null) throw new Error(`redis-server did not start on port ${port}: ${(e as Error).message}`);
      await new Promise((r) => setTimeout(r, 100));
    } finally {
      probe.disconnect();
    }
  }
  return {
    url,
    stop: () => new Promise<void>((resolve) => {
      if (proc.exitCode !== null) return resolve();
      proc.once('exit', () => resolve());
      proc.kill('SIGTERM');
    }),
  };
}
