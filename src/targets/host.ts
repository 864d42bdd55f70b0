// The host target: qhx_generate on this machine, CPU EP on the bundle's ONNX graphs.
import { join } from 'node:path';
import { $ } from 'zx';
import { parseQhxJson, qhxArgs, qhxFailure, type GenerateRequest, type Target } from './target.js';

export function hostTarget(qhxGenerate: string, timeoutSeconds = 600): Target {
  return {
    name: 'host',
    async generate(req: GenerateRequest) {
      const args = qhxArgs(join(req.bundleDir, 'manifest.json'), 'cpu', '-', req.bundleDir, req);
      const r = await $({ nothrow: true, quiet: true, timeout: `${timeoutSeconds}s` as const, env: { ...process.env, FORGE_ORT_THREADS: process.env.FORGE_ORT_THREADS ?? '1' } })`${qhxGenerate} ${args}`;
      if (r.exitCode !== 0) throw qhxFailure('host', r.signal ?? r.exitCode ?? 'no status', r.stderr);
      return parseQhxJson(r.stdout, 'host');
    },
  };
}
