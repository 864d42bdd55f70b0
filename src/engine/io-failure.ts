// Disk-full failures, said as such. Node's write errors name neither the file nor (for a subprocess
// that died of it) the cause, so a stage failure is checked against the free space where it wrote.
import { statfsSync } from 'node:fs';

/** Free bytes on the filesystem holding dir, or null when it cannot be read. */
function freeBytes(dir: string): number | null {
  try {
    const s = statfsSync(dir);
    return s.bavail * s.bsize;
  } catch {
    return null;
  }
}

// A subprocess that hits a full disk often dies without saying so (SIGABRT, a truncated file): a
// failure while the output's filesystem has less than this left is reported as ENOSPC.
const NEARLY_FULL_BYTES = 16 << 20;

const NAMED = 'ENOSPC: no space left on device writing under';

/**
 * The failure's message, naming the path and ENOSPC when the disk filled: Node's write errors name
 * neither the file nor (for a subprocess) the cause, so the stage's output directory is named.
 */
export function describeFailure(err: Error & { code?: string; path?: string }, out: string, free = freeBytes(out)): string {
  const message = err.message ?? String(err);
  // Said already (by the stage's own process): once is enough.
  if (message.includes(NAMED)) return message;
  const enospc = err.code === 'ENOSPC' || /\bENOSPC\b|No space left on device/i.test(message);
  if (!enospc && (free === null || free >= NEARLY_FULL_BYTES)) return message;
  const where = err.path && !message.includes(err.path) ? err.path : out;
  const left = free === null ? '' : `, ${free} bytes free`;
  return `${message} (${NAMED} ${where}${left})`;
}
