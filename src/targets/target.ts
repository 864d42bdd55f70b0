// Where a bundle runs for the parity gate. Every target runs the same qhx_generate (the decode loop
// lives once, in C++) and returns what it generated.
export interface GenerateRequest {
  /** Bundle directory holding manifest.json and everything it names. */
  bundleDir: string;
  promptIds: number[];
  maxNewTokens: number;
  /**
   * Teacher-forced continuation (qhx_generate --force-ids): step k is fed forceIds[k-1] instead of
   * the runtime's own choice; generatedIds stays what the runtime chose at each step. At most
   * maxNewTokens ids.
   */
  forceIds?: number[];
  /** An image file for a vision bundle (qhx_generate --image): promptIds then hold its image tokens. */
  image?: string;
  /** An audio clip for a bundle with an audio encoder (qhx_generate --audio): promptIds then hold its audio tokens. */
  audio?: string;
  /** The manifest to run, a file in bundleDir (default manifest.json; a vision bundle's manifest.text.json). */
  manifest?: string;
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

/** qhx_generate's exit status when the logits it would take the argmax of hold NaN/Inf. */
export const EXIT_NON_FINITE_LOGITS = 3;

/** The runtime refused non-finite logits (its message names the generation step): a gate failure of its own, not a token mismatch. */
export class NonFiniteLogitsError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'NonFiniteLogitsError';
  }
}

/** The error for a failed qhx_generate run: NonFiniteLogitsError for exit 3, a plain Error otherwise. */
export function qhxFailure(where: string, status: number | string, stderr: string): Error {
  const last = stderr.trim().split('\n').pop() ?? '';
  if (Number(status) === EXIT_NON_FINITE_LOGITS) return new NonFiniteLogitsError(last.replace(/^qhx_generate: /, ''));
  return new Error(`qhx_generate on ${where} exited ${status}: ${last}`);
}

/** qhx_generate's argv after the program, shared by every target (paths as the target sees them). */
export function qhxArgs(manifest: string, backend: string, systemLib: string, root: string, req: GenerateRequest): string[] {
  const forced = req.forceIds?.length ? ['--force-ids', req.forceIds.join(',')] : [];
  const media = [...(req.image ? ['--image', req.image] : []), ...(req.audio ? ['--audio', req.audio] : [])];
  return [manifest, backend, systemLib, root, String(req.maxNewTokens), '--prompt-ids', req.promptIds.join(','), ...media, ...forced, '--json', '--ignore-eos'];
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
