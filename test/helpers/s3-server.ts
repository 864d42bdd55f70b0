// A real S3-compatible server for the shared-cache tests: s3proxy (Maven Central) on a free loopback
// port, storing objects in a temp dir through jclouds' filesystem provider. Not a mock: the SDK talks
// HTTP, SigV4 and multipart to it exactly as to AWS.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { freePort } from './free-port.js';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import { CreateBucketCommand, S3Client } from '@aws-sdk/client-s3';

const VERSION = '2.6.0';
const ARTIFACT = `org.gaul:s3proxy:${VERSION}:jar:jar-with-dependencies`;
const jarPath = () => join(homedir(), '.m2', 'repository', 'org', 'gaul', 's3proxy', VERSION, `s3proxy-${VERSION}-jar-with-dependencies.jar`);

export interface S3Server {
  endpoint: string;
  accessKeyId: string;
  secretAccessKey: string;
  region: string;
  /** The AWS_* variables a forge process needs to reach this server. */
  env: Record<string, string>;
  /** A client for the tests' own inspection and tampering. */
  client: S3Client;
  createBucket(name: string): Promise<void>;
  stop(): Promise<void>;
}

/** The s3proxy jar, fetched once into ~/.m2 by Maven (a clear error if Maven or Java is missing). */
export function s3proxyJar(): string {
  const jar = jarPath();
  if (existsSync(jar)) return jar;
  for (const tool of ['java', 'mvn']) {
    if (spawnSync(tool, ['-version'], { stdio: 'ignore' }).status !== 0) {
      throw new Error(`the shared-cache tests run s3proxy ${VERSION}, which needs '${tool}' on PATH (Java 17+ and Maven); ${jar} is not there yet`);
    }
  }
  const r = spawnSync('mvn', ['-q', 'dependency:get', `-Dartifact=${ARTIFACT}`], { encoding: 'utf8' });
  if (r.status !== 0 || !existsSync(jar)) throw new Error(`mvn dependency:get ${ARTIFACT} failed:\n${r.stdout}${r.stderr}`);
  return jar;
}

/** `port`: a given one (a server restarted where its clients expect it), else a free one. */
export async function startS3Server(o: { port?: number } = {}): Promise<S3Server> {
  const jar = s3proxyJar();
  const dir = mkdtempSync(join(tmpdir(), 'forge-s3proxy-'));
  const port = o.port ?? (await freePort());
  const endpoint = `http://127.0.0.1:${port}`;
  const accessKeyId = 'forge-test-identity';
  const secretAccessKey = `forge-test-secret-${process.pid}`;
  writeFileSync(join(dir, 's3proxy.properties'), [
    `s3proxy.endpoint=${endpoint}`,
    's3proxy.authorization=aws-v2-or-v4',
    `s3proxy.identity=${accessKeyId}`,
    `s3proxy.credential=${secretAccessKey}`,
    'jclouds.provider=filesystem',
    `jclouds.filesystem.basedir=${join(dir, 'data')}`,
  ].join('\n'));
  const log = join(dir, 's3proxy.log');
  const fd = openSync(log, 'w');
  const proc: ChildProcess = spawn('java', ['-jar', jar, '--properties', join(dir, 's3proxy.properties')], { stdio: ['ignore', fd, fd] });
  const region = 'us-east-1';
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true'; // Node 20 notice, noise here
  const client = new S3Client({
    endpoint, region, forcePathStyle: true, credentials: { accessKeyId, secretAccessKey },
    requestChecksumCalculation: 'WHEN_REQUIRED', responseChecksumValidation: 'WHEN_REQUIRED',
  });
  const stop = async () => {
    client.destroy();
    if (proc.exitCode === null) {
      const gone = new Promise((r) => proc.once('exit', r));
      proc.kill('SIGTERM');
      await gone;
    }
    rmSync(dir, { recursive: true, force: true });
  };
  // Jetty says "Started Server" once it listens (about 2 s for the JVM here).
  const deadline = Date.now() + 60_000;
  while (!readFileSync(log, 'utf8').includes('Started Server')) {
    if (proc.exitCode !== null || Date.now() > deadline) {
      const text = readFileSync(log, 'utf8');
      await stop();
      throw new Error(`s3proxy did not start on ${endpoint}:\n${text.slice(-2000)}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    endpoint, accessKeyId, secretAccessKey, region, client, stop,
    env: { AWS_ENDPOINT_URL_S3: endpoint, AWS_ACCESS_KEY_ID: accessKeyId, AWS_SECRET_ACCESS_KEY: secretAccessKey, AWS_REGION: region },
    createBucket: async (name) => void (await client.send(new CreateBucketCommand({ Bucket: name }))),
  };
}
