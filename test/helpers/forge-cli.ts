// Runs the `./forge` launcher as a user would (CI=1: plain progress lines), for tests of the CLI.
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { promisify } from 'node:util';

const exec = promisify(execFile);

export interface Run { code: number; stdout: string; stderr: string }

/** `./forge <args>` with extra environment; a non-zero exit is returned, not thrown. */
export async function forge(args: string[], env: Record<string, string> = {}): Promise<Run> {
  try {
    const r = await exec(resolve('forge'), args, { env: { ...process.env, CI: '1', ...env }, maxBuffer: 64 << 20 });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}

/** The last line of stdout as JSON (where `--json` prints the run record or report). */
export const lastJson = (stdout: string) => JSON.parse(stdout.trim().split('\n').pop()!);
