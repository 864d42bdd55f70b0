// One error type for everything wrong with a checkpoint on disk, so callers can
// catch it, and so every message says which file (and tensor) to go and look at.

export interface CheckpointErrorLocation {
  /** The file at fault: a .safetensors shard, or the index JSON. */
  file: string;
  /** The tensor at fault, when the problem is about one tensor. */
  tensor?: string;
  cause?: unknown;
}

export class CheckpointError extends Error {
  readonly file: string;
  readonly tensor?: string;

  /** `message` must already name the file (and tensor); use `CheckpointError.at` to get that for free. */
  constructor(message: string, location: CheckpointErrorLocation) {
    super(message, location.cause === undefined ? undefined : { cause: location.cause });
    this.name = 'CheckpointError';
    this.file = location.file;
    if (location.tensor !== undefined) this.tensor = location.tensor;
  }

  /** `<file>: tensor "<tensor>": <detail>` — the usual shape of a message (the name JSON-quoted, so one with a newline keeps it one line). */
  static at(file: string, tensor: string | undefined, detail: string, cause?: unknown): CheckpointError {
    const where = tensor === undefined ? file : `${file}: tensor ${JSON.stringify(tensor)}`;
    return new CheckpointError(`${where}: ${detail}`, { file, tensor, cause });
  }
}

/** `[a,b,c]` — how shapes appear in messages. */
export function formatShape(shape: readonly number[]): string {
  return `[${shape.join(',')}]`;
}
