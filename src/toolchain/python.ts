// Runs a Python script of forge's in the venv and reports its peak RSS (Python and anything it
// spawned), which a Node parent cannot read off a child by itself.
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runOwned } from '../engine/subprocess.js';
import { ensureVenv } from './venv.js';

const WRAPPER = [
  'import atexit, os, resource, runpy, sys',
  'def _peak():',
  '    kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)',
  '    open(os.environ["FORGE_RSS_FILE"], "w").write(str(kb * 1024))',
  'atexit.register(_peak)',
  'sys.argv = sys.argv[1:]',
  'runpy.run_path(sys.argv[0], run_name="__main__")',
].join('\n');

export interface PythonResult {
  stdout: string;
  stderr: string;
  peakRssBytes: number;
}

export class PythonError extends Error {
  constructor(script: string, code: number | string | null, stderr: string) {
    const lines = stderr.trim().split('\n');
    // forge's own scripts refuse with one "<name>: error: …" line: that line is the message. Anything
    // else (a crash) keeps the end of stderr, whose traceback is what there is to go on.
    const own = [...lines].reverse().find((l) => /^[\w.-]+: error: /.test(l));
    super(own ? `${script}: ${own}` : `${script} exited with ${code}:\n${lines.slice(-15).join('\n')}`);
    this.name = 'PythonError';
  }
}

export async function runPython(script: string, args: string[], opts: { env?: Record<string, string>; cwd?: string } = {}): Promise<PythonResult> {
  const python = await ensureVenv();
  const dir = await mkdtemp(join(tmpdir(), 'forge-py-'));
  const rssFile = join(dir, 'rss');
  try {
    const r = await runOwned(python, ['-c', WRAPPER, script, ...args], {
      cwd: opts.cwd,
      env: { ...opts.env, FORGE_RSS_FILE: rssFile, PYTHONUNBUFFERED: '1', HF_HUB_OFFLINE: '1', TRANSFORMERS_OFFLINE: '1' },
    });
    if (r.spawnError) throw new Error(`cannot run ${python}: ${r.spawnError}`);
    const peakRssBytes = Number(await readFile(rssFile, 'utf8').catch(() => '0')) || 0;
    if (r.exitCode !== 0) throw new PythonError(script, r.exitCode ?? r.signal, r.stderr);
    return { stdout: r.stdout, stderr: r.stderr, peakRssBytes };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
