// The host target: qhx_generate on this machine, CPU EP on the bundle's ONNX graphs.
import { join } from 'node:path';
import { runOwned } from '../engine/subprocess.js';
import { parseQhxJson, qhxArgs, qhxFailure, type GenerateRequest, type Target } from './target.js';

export function hostTarget(qhxGenerate: string, timeoutSeconds = 600): Target {
  return {
    name: 'host',
    async generate(req: GenerateRequest) {
      const args = qhxArgs(join(req.bundleDir, req.manifest ?? 'manifest.json'), 'cpu', '-', req.bundleDir, req);
      const r = await runOwned(qhxGenerate, args, { timeoutSeconds, env: { FORGE_ORT_THREADS: process.env.FORGE_ORT_THREADS ?? '1' } });
      if (r.spawnError) throw new Error(`cannot run ${qhxGenerate}: ${r.spawnError}`);
      if (r.timedOut) throw new Error(`qhx_generate on host timed out after ${timeoutSeconds} s and was killed`);
      if (r.exitCode !== 0) throw qhxFailure('host', r.signal ?? r.exitCode ?? 'no status', r.stderr);
      return parseQhxJson(r.stdout, 'host');
    },
  };
}
