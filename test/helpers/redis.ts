// A private redis-server for a test: a free loopback port, nothing saved to disk, stopped after.
// Installed with apt-get on a fresh Debian machine (as ./forge test does for Chromium).
import { spawn, type ChildProcess } from 'node:child_process';
import { freePort } from './free-port.js';
import { Redis } from 'ioredis';
import { ensureDebianPackages } from '../../src/toolchain/system-deps.js';

export interface RedisServer {
  /** redis://127.0.0.1:<port>, with the password in it when the server has one. */
  url: string;
  /** The same without the password (what a farm gives on the command line, the password coming from the environment). */
  bareUrl: string;
  stop(): Promise<void>;
}

/** With `password`, the server refuses clients without it (requirepass). */
export async function startRedis(o: { password?: string } = {}): Promise<RedisServer> {
  await ensureDebianPackages({ 'redis-server': 'redis-server' }, (m) => process.stderr.write(`${m}\n`));
  const port = await freePort();
  const proc: ChildProcess = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', ...(o.password ? ['--requirepass', o.password] : [])], { stdio: 'ignore' });
  const bareUrl = `redis://127.0.0.1:${port}`;
  const url = o.password ? `redis://:${encodeURIComponent(o.password)}@127.0.0.1:${port}` : bareUrl;
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
    bareUrl,
    stop: () => new Promise<void>((resolve) => {
      if (proc.exitCode !== null) return resolve();
      proc.once('exit', () => resolve());
      proc.kill('SIGTERM');
    }),
  };
}
