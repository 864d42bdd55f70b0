// The host-overhead bench's mixture-of-experts side (PhiMoE): the made tables (expert rows) of a
// synthetic bundle at their real sizes, how many of their bytes a run touches, and what a runtime
// that copied the chosen experts' rows instead of binding them in place would pay per token.
//
// Tables: sparse files (ftruncate to the real size, nothing written). Their content is never
// validated: the trivial experts graph multiplies a sum of what it reads by 0, so zeros serve as
// well as codes, and writing 2.8 GB would only add disk traffic to a shared 2-core box. Reading a
// hole still costs a page fault and a zeroed page, as a real page would once cached; those faults
// happen inside the graph's Run, so they never count as host overhead.
//
// Touched bytes are measured with util-linux `fincore` (resident pages of each table file) after a
// run that started with none resident. On a disk filesystem the kernel's readahead makes that
// "bytes read in", not "bytes touched": with this host's read_ahead_kb 8192, touching 1 MiB of a
// sparse file on ext4 left 8 MiB resident (a probe, 2026-11-25). So the phimoe shape's bundle lives
// on tmpfs (/dev/shm) when there is one: shmem has no readahead, a page becomes resident only when
// something faults it in (the same probe there: 1 MiB touched, 1 MiB + one page resident, and a
// read() of a hole allocated nothing). Emptying it before a run = truncating the all-holes file to 0
// and back. On a disk filesystem (--tables-on disk) the pages are dropped with
// `dd iflag=nocache count=0` (POSIX_FADV_DONTNEED over the file; clean pages only, which holes are).
import { spawnSync } from 'node:child_process';
import { closeSync, ftruncateSync, openSync, readSync, statSync, statfsSync, truncateSync } from 'node:fs';
import { join } from 'node:path';
import { f16BitsToF32Bits, f32FromBits } from '../src/io/dtype.js';
import { madeTableFile } from '../src/export/graphs.js';
import type { MadeTable } from '../src/families/types.js';
import { median } from './util.js';

const PAGE = 4096;
const TMPFS_MAGIC = 0x01021994;
const BYTES: Record<MadeTable['dtype'], number> = { int8: 1, float16: 2, float32: 4 };

export const isTmpfs = (path: string) => statfsSync(path).type === TMPFS_MAGIC;

/** Bytes of one [layer, expert] slab of a table [L, E, ...]. */
export const slabBytes = (t: MadeTable) => t.shape.slice(2).reduce((a, d) => a * d, 1) * BYTES[t.dtype];
export const tableBytes = (t: MadeTable) => t.shape[0] * t.shape[1] * slabBytes(t);

/**
 * Where the trivial attention+router graph of `layer` reads its E router logits from the residual
 * [1, 1, H]: a different slice per layer, so routes vary from layer to layer as well as token to token.
 */
export const routerSliceStart = (layer: number, experts: number, hidden: number) => (layer * experts) % (hidden - experts + 1);

/** Each table as a sparse file of its real size in `dir`, named as an export names it. */
export function writeSparseTables(dir: string, tables: MadeTable[]): Array<MadeTable & { file: string }> {
  return tables.map((t) => {
    const file = madeTableFile(t);
    const fd = openSync(join(dir, file), 'w');
    try {
      ftruncateSync(fd, tableBytes(t));
    } finally {
      closeSync(fd);
    }
    return { ...t, file };
  });
}

/** Makes none of `file`'s pages resident (see the header: tmpfs by re-truncating the all-holes file, a disk by DONTNEED). */
export function dropResidency(file: string): void {
  if (isTmpfs(file)) {
    const size = statSync(file).size;
    truncateSync(file, 0);
    truncateSync(file, size);
    return;
  }
  const r = spawnSync('dd', [`if=${file}`, 'iflag=nocache', 'count=0', 'status=none'], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`dd iflag=nocache on ${file} failed: ${r.error?.message ?? r.stderr.trim()}`);
}

/** Resident bytes of `file` (page cache, or tmpfs pages), from `fincore --bytes --json`. */
export function residentBytes(file: string): number {
  const r = spawnSync('fincore', ['--bytes', '--json', file], { encoding: 'utf8' });
  if (r.error || r.status !== 0) throw new Error(`fincore (util-linux) on ${file}: ${r.error?.message ?? r.stderr.trim()}; the touched-bytes measurement needs it`);
  const res = (JSON.parse(r.stdout) as { fincore: Array<{ res: number | string }> }).fincore[0].res;
  return Number(res);
}

/**
 * The (layer, expert) pairs phimoe_generate routes to for the tokens it is fed, given the trivial
 * graphs: every layer's residual is the fed token's embedding row (the experts graph adds 0), its
 * router logits the E values at routerSliceStart, and sparsemixer's two experts are the largest
 * logit and the largest of the rest, the first of equal maxima winning (phimoe_route.cpp).
 */
export function routedPairs(embeddingFile: string, hidden: number, layers: number, experts: number, fed: number[]): { pairs: Set<number>; afterToken: number[] } {
  const pairs = new Set<number>();
  /** Distinct pairs after each fed token. */
  const afterToken: number[] = [];
  const row = Buffer.alloc(hidden * 2);
  const fd = openSync(embeddingFile, 'r');
  try {
    for (const id of fed) {
      if (readSync(fd, row, 0, row.length, id * hidden * 2) !== row.length) throw new Error(`${embeddingFile}: short read of row ${id}`);
      for (let l = 0; l < layers; l++) {
        const at = routerSliceStart(l, experts, hidden);
        const logit = (e: number) => f32FromBits(f16BitsToF32Bits(row.readUInt16LE((at + e) * 2)));
        let a = 0;
        for (let e = 1; e < experts; e++) if (logit(e) > logit(a)) a = e;
        let b = -1;
        for (let e = 0; e < experts; e++) if (e !== a && (b < 0 || logit(e) > logit(b))) b = e;
        pairs.add(l * experts + a).add(l * experts + b);
      }
      afterToken.push(pairs.size);
    }
  } finally {
    closeSync(fd);
  }
  return { pairs, afterToken };
}

/** Bytes of the pages of table `t` that hold the slabs of `pairs` (page-granular, as fincore counts). */
export function pagesOfPairs(t: MadeTable, pairs: Set<number>): number {
  const slab = slabBytes(t);
  const pages = new Set<number>();
  for (const p of pairs) for (let pg = Math.floor((p * slab) / PAGE); pg <= Math.floor((p * slab + slab - 1) / PAGE); pg++) pages.add(pg);
  return pages.size * PAGE;
}

/**
 * Median ms to copy, for every layer, two experts' slabs of every table (int8 rows and scales) into
 * per-slot buffers: what a runtime that copied the chosen rows instead of binding them in place
 * would pay per token. The source is one layer's slabs of all experts (not cache-resident at real
 * sizes), the experts picked per layer vary.
 */
export function timeExpertCopy(tables: MadeTable[], repeat: number): number {
  const src = tables.map((t) => new Uint8Array(t.shape[1] * slabBytes(t)).fill(1));
  const dst = tables.map((t) => [new Uint8Array(slabBytes(t)), new Uint8Array(slabBytes(t))]);
  const [L, E] = tables[0].shape;
  const copyAll = () => {
    for (let l = 0; l < L; l++) {
      for (let i = 0; i < tables.length; i++) {
        const slab = dst[i][0].length;
        for (const slot of [0, 1]) {
          const e = (2 * l + slot * 7) % E;
          dst[i][slot].set(src[i].subarray(e * slab, (e + 1) * slab));
        }
      }
    }
  };
  copyAll(); // first touch of the buffers is not a per-token cost
  const ms: number[] = [];
  for (let r = 0; r < repeat; r++) {
    const t0 = process.hrtime.bigint();
    copyAll();
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return median(ms);
}
