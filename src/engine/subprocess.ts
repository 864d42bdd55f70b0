// Every subprocess forge starts (compile helpers, the simulator, qhx_generate, Python helpers, the
// native build) goes through runOwned, so none outlives the build:
// - it leads its own process group, which whatever it spawns inherits, so one kill takes them all
//   (a timeout, a cancelled stage);
// - the kernel SIGKILLs it when the process that started it dies, however that died (setpriv
//   --pdeathsig: kill -9 of a stage process or of the build itself);
// - killOwnedGroups() kills every group still running: child.ts calls it when its build goes away
//   or tells it to stop, the build's own signal handler calls it for what the build spawned itself.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';

const SETPRIV = '/usr/bin/setpriv';
const hasSetpriv = process.platform === 'linux' && existsSync(SETPRIV);

/** Process group ids of the subprocesses this process started that have not exited yet. */
const groups = new Set<number>();

export interface OwnedOptions {
  cwd?: string;
  /** Added to process.env. */
  env?: Record<string, string>;
  /** Past this, the whole group gets SIGKILL and the result says timedOut. */
  timeoutSeconds?: number;
}

export interface OwnedResult {
  stdout: string;
  stderr: string;
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  timedOut: boolean;
  seconds: number;
  /** Set when the command could not be started at all (missing binary …). */
  spawnError?: string;
}

function killGroup(pgid: number, signal: NodeJS.Signals): void {
  // Only the group: after the leader is reaped its pid may belong to an unrelated process, while a
  // group id stays reserved for as long as any member of it lives.
  try { process.kill(-pgid, signal); } catch { /* the group is gone */ }
}

/** Kills every subprocess group this process started (synchronous: safe in exit and signal handlers). */
export function killOwnedGroups(signal: NodeJS.Signals = 'SIGKILL'): void {
  for (const pgid of groups) killGroup(pgid, signal);
  groups.clear();
}

/** How many subprocess groups this process has running (tests and diagnostics). */
export const ownedGroupCount = () => groups.size;

/** Runs cmd with args in its own process group that dies with this process; never throws. */
export function runOwned(cmd: string, args: string[], opts: OwnedOptions = {}): Promise<OwnedResult> {
  const t0 = Date.now();
  const [file, argv] = hasSetpriv ? [SETPRIV, ['--pdeathsig', 'KILL', '--', cmd, ...args]] : [cmd, args];
  return new Promise((resolve) => {
    const child = spawn(file, argv, {
      cwd: opts.cwd,
      env: { ...process.env, ...opts.env },
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const pgid = child.pid;
    if (pgid !== undefined) groups.add(pgid);
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout!.on('data', (b: Buffer) => out.push(b));
    child.stderr!.on('data', (b: Buffer) => err.push(b));
    let timedOut = false;
    let spawnError: string | undefined;
    const timer = opts.timeoutSeconds
      ? setTimeout(() => {
          timedOut = true;
          if (pgid !== undefined) killGroup(pgid, 'SIGKILL');
        }, Math.max(1, opts.timeoutSeconds) * 1000)
      : undefined;
    child.on('error', (e) => { spawnError = e.message; });
    child.on('exit', () => {
      // The leader is gone; anything it left running in its group goes with it.
      if (pgid !== undefined) {
        killGroup(pgid, 'SIGKILL');
        groups.delete(pgid);
      }
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      let stderr = Buffer.concat(err).toString('utf8');
      // setpriv reports a command it could not exec on stderr with exit 127 (126: not executable).
      if (!spawnError && hasSetpriv && (code === 127 || code === 126) && /setpriv: failed to execute/.test(stderr)) {
        spawnError = stderr.trim().split('\n').pop()!.replace(/^setpriv: /, '');
        stderr = '';
      }
      resolve({
        stdout: Buffer.concat(out).toString('utf8'), stderr, exitCode: spawnError ? null : code, signal, timedOut,
        seconds: (Date.now() - t0) / 1000, ...(spawnError ? { spawnError } : {}),
      });
    });
  });
}
