// External data that is a checkpoint's own bytes: the reference (fp32) export points each big
// weight at its tensor inside the safetensors file (offset = 8 + header length + data_offsets[0]),
// in the dtype it is stored in, and the graph casts it to float. The file has to be reachable from
// the model's directory: ONNX Runtime (1.29 python, 1.30 node) refuses external data whose resolved
// path leaves that directory, so a symlink to the checkpoint is refused. A hard link is the same
// file under a second name there: no bytes written, it survives the cache's rename of the entry,
// and `forge clean` removing it leaves the checkpoint alone. Where a hard link cannot be made (the
// checkpoint on another filesystem, or linking refused), the file is copied once (a reflink where
// the filesystem can), and the export says so.
// At run time ONNX Runtime maps these bytes, but constant folding (any optimization level from
// 'basic') turns each Cast(initializer) into a new fp32 initializer: the fp32 copy again, in private
// memory. The session config entry `optimization.disable_specified_optimizers` = `ConstantFolding`
// keeps the weights mapped (onnxruntime-node: `extra: { optimization: { disable_specified_optimizers:
// 'ConstantFolding' } }`); the Cast then runs per call, and Gemm gets an unpacked B, whose sums round
// like the same graph run with `session.disable_prepacking` = 1 (not bit-identical to prepacked B).
import { constants, copyFileSync, linkSync, realpathSync, statSync } from 'node:fs';
import { basename, join } from 'node:path';
import type { ExternalRef } from './external.js';
import { digestAcrossLink, statKey } from '../engine/known-digests.js';

export interface LinkedFile {
  /** Its name in the export directory (what the graphs' external_data `location` holds). */
  file: string;
  bytes: number;
  /** 'hardlink': the checkpoint's own file (same inode); 'copy': a copy, or a reflink, made because linking failed. */
  how: 'hardlink' | 'copy';
}

/** Where a tensor lies in its safetensors file. */
export interface TensorBytes {
  /** Path of the .safetensors file. */
  file: string;
  /** Absolute position of the tensor's first byte in the file. */
  fileOffset: number;
  byteLength: number;
}

export type LinkFile = (from: string, to: string) => void;

export class CheckpointLinks {
  /** Real path of a checkpoint file → its link here. */
  private readonly links = new Map<string, LinkedFile>();
  private readonly taken = new Set<string>();

  /** `link` is there for tests (a refused link); by default fs.linkSync. */
  constructor(readonly dir: string, private readonly log: (message: string) => void = () => {}, private readonly link: LinkFile = linkSync) {}

  /**
   * The tensor's bytes in place, through a link to its file (made on first use). Undefined when its
   * offset is not a multiple of its element size (a safetensors file does not promise that): the
   * caller stores a copy instead, since a misaligned tensor would reach the kernels misaligned.
   */
  ref(t: TensorBytes, elemBytes: number): ExternalRef | undefined {
    if (t.fileOffset % elemBytes !== 0) return undefined;
    return { location: this.linkOf(t.file).file, offset: t.fileOffset, length: t.byteLength };
  }

  /** Every file linked (or copied) so far, in the order first used. */
  files(): LinkedFile[] {
    return [...this.links.values()];
  }

  private linkOf(file: string): LinkedFile {
    // A hub snapshot's files are symlinks into its blob store: link what they point at (link(2)
    // would link the symlink itself, which ONNX Runtime then refuses as leaving the directory).
    const real = realpathSync(file);
    const hit = this.links.get(real);
    if (hit) return hit;
    const name = this.freeName(basename(file));
    const to = join(this.dir, name);
    let how: LinkedFile['how'] = 'hardlink';
    try {
      const before = statKey(statSync(real, { bigint: true }));
      this.link(real, to);
      // The checkpoint's digest (a local source's) follows the file across this link: the cache
      // commits the link by it instead of reading the weights again.
      digestAcrossLink(before, to);
    } catch (e) {
      how = 'copy';
      copyFileSync(real, to, constants.COPYFILE_FICLONE);
      this.log(`could not hard-link ${real} into the export (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}): copied it (${statSync(to).size} bytes)`);
    }
    const entry: LinkedFile = { file: name, bytes: statSync(to).size, how };
    this.links.set(real, entry);
    return entry;
  }

  /** Two checkpoint files with one base name (shards in different folders) get distinct links. */
  private freeName(base: string): string {
    let name = base;
    for (let k = 1; this.taken.has(name); k++) name = `${k}-${base}`;
    this.taken.add(name);
    return name;
  }
}
