// Where a bundle runs for the parity gate. Every target runs the same qhx_generate (the decode loop
// lives once, in C++) and returns what it generated.
export interface GenerateRequest {
  /** Bundle directory holding manifest.json and everything it names. */
  bundleDir: string;
  promptIds: number[];
  maxNewTokens: number;
}

export interface GenerateResult {
  generatedIds: number[];
  timings: { load_ms: number; prefill_ms: number; decode_ms_per_token: number; host_overhead_ms_per_token: number };
  backend: string;
}

export interface Target {
  /** 'host' or 'adb:<serial>', as the run record shows it. */
  name: string;
  generate(req: GenerateRequest): Promise<GenerateResult>;
}

/** qhx_generate's argv after the program, shared by every target (paths as the target sees them). */
export function qhxArgs(manifest: string, backend: string, systemLib: string, root: string, req: GenerateRequest): string[] {
  return [manifest, backend, systemLib, root, String(req.maxNewTokens), '--prompt-ids', req.promptIds.join(','), '--json', '--ignore-eos'];
}

export function parseQhxJson(stdout: string, where: string): GenerateResult {
  const line = stdout.trim().split('\n').pop() ?? '';
  try {
    const j = JSON.parse(line) as { generated_ids: number[]; timings: GenerateResult['timings']; backend: string };
    if (!Array.isArray(j.generated_ids)) throw new Error('no generated_ids');
    return { generatedIds: j.generated_ids, timings: j.timings, backend: j.backend };
  } catch (e) {
    throw new Error(`${where}: qhx_generate printed no result (${(e as Error).message}): ${line.slice(0, 200)}`);
  }
}
