// Cost of fetch's NaN/Inf weight scan (src/io/finite.ts) on a full-size synthetic checkpoint
// (qwen3-4b by default, ~8 GB bf16), against, in the same run: a plain read of the same files
// (the I/O floor of any scan) and forge's export of the same checkpoint (bench/run-export.ts, the
// quantize stage of `forge build`). Target (issue 11): the scan costs at most 10% of the export.
//
//   node --import tsx bench/finite-check.ts [--recipe qwen3-4b|qwen3.5-4b] [--checkpoint DIR] [--repeat N] [--out-root DIR]
//
// Each measurement starts from a dropped page cache where that is permitted ("cold"), otherwise from
// a warm one (noted). The scan is also timed right after a plain read ("warm": the file in page
// cache, as after a download fetch just wrote), over bytes already in memory ("in memory": the
// exponent test alone), and as a build runs it: cold scan, then the export, which then reads from
// the page cache the scan filled. Prints one JSON object; nothing is written to the repo.
import { spawnSync } from 'node:child_process';
import { open } from 'node:fs/promises';
import { existsSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { defaultCheckpointDir, ensureCheckpoint } from './gen-checkpoint.js';
import { benchArgs, median, positiveInt } from './util.js';
import { checkFinite, firstNonFinite } from '../src/io/finite.js';
import { openCheckpoint } from '../src/io/checkpoint.js';
import { Bf16W8 } from '../src/quant/w8-simd.js';
import { forgeHome, repoRoot } from '../src/paths.js';

const { values: arg, num } = benchArgs({
  recipe: { type: 'string', default: 'qwen3-4b' }, checkpoint: { type: 'string', default: '' },
  repeat: { type: 'string', default: '1' }, 'out-root': { type: 'string', default: join(forgeHome(), 'bench', 'out') },
});
const repeat = num('repeat', positiveInt);
const log = (m: string) => process.stderr.write(`[bench] ${m}\n`);
const notes: string[] = [];

function dropCaches(): boolean {
  spawnSync('sync');
  return spawnSync('sh', ['-c', 'echo 3 > /proc/sys/vm/drop_caches']).status === 0;
}

const ckpt = await ensureCheckpoint(arg.checkpoint || defaultCheckpointDir(arg.recipe), { recipe: arg.recipe, log });
const opened = await openCheckpoint(ckpt.dir);
const shardFiles = [...opened.files];
await opened.close();
const totalBytes = shardFiles.reduce((a, f) => a + statSync(f).size, 0);
const canDrop = dropCaches();
if (!canDrop) notes.push('page cache could not be dropped: every "cold" figure read from page cache');

/** The I/O floor: every shard read once, front to back, as the scan reads it (16 MiB chunks, one read ahead), nothing computed. */
async function plainRead(): Promise<number> {
  const bufs = [Buffer.allocUnsafeSlow(16 << 20), Buffer.allocUnsafeSlow(16 << 20)];
  const t = performance.now();
  for (const f of shardFiles) {
    const fh = await open(f, 'r');
    try {
      const size = (await fh.stat()).size;
      const read = (k: number) => fh.read(bufs[k & 1], 0, Math.min(16 << 20, size - k * (16 << 20)), k * (16 << 20));
      const chunks = Math.ceil(size / (16 << 20));
      let pending = chunks ? read(0) : undefined;
      for (let k = 0; k < chunks; k++) {
        await pending;
        pending = k + 1 < chunks ? read(k + 1) : undefined;
      }
    } finally {
      await fh.close();
    }
  }
  return (performance.now() - t) / 1000;
}

async function scan(): Promise<number> {
  const t = performance.now();
  const r = await checkFinite(shardFiles);
  if (r.bytes === 0) throw new Error('the scan read nothing');
  return (performance.now() - t) / 1000;
}

/**
 * The exponent test alone over 16 MiB of finite bf16 already in memory (the scan's SIMD kernel, and
 * the JS fallback for comparison), scaled to the checkpoint's bytes.
 */
function inMemory(): { simd: number; js: number } {
  const w = new Bf16W8([16 << 20]);
  const h = new Uint16Array(w.regions[0].buffer, w.regions[0].byteOffset, 8 << 20);
  for (let i = 0; i < h.length; i++) h[i] = 0x3c00 + (i & 0xff);
  const time = (f: () => boolean, reps: number) => {
    const t = performance.now();
    for (let k = 0; k < reps; k++) if (!f()) throw new Error('finite data reported non-finite');
    return ((performance.now() - t) / 1000 / (reps * h.byteLength)) * totalBytes;
  };
  return { simd: time(() => w.maxMagnitude(h) < 0x7f80, 64), js: time(() => firstNonFinite('BF16', w.regions[0]) === -1, 4) };
}

function exportOnce(): number {
  const out = join(arg['out-root'], 'finite-check-export');
  rmSync(out, { recursive: true, force: true });
  mkdirSync(out, { recursive: true });
  const r = spawnSync(process.execPath, ['--import', 'tsx', join(repoRoot(), 'bench', 'run-export.ts'), ckpt.dir, out, '--recipe', arg.recipe], { encoding: 'utf8', maxBuffer: 64 << 20 });
  rmSync(out, { recursive: true, force: true });
  if (r.status !== 0) throw new Error(`run-export failed (${r.status}): ${r.stderr.trim().split('\n').pop()}`);
  return (JSON.parse(r.stdout.trim().split('\n').pop()!) as { seconds: number }).seconds;
}

const runs = {
  read: [] as number[], scan: [] as number[], warmScan: [] as number[], inMemory: [] as number[], inMemoryJs: [] as number[], export: [] as number[],
  /** A build's order: the cold scan, then the export reading what the scan left in page cache. */
  scanThenExport: [] as number[],
};
for (let i = 0; i < repeat; i++) {
  dropCaches();
  runs.read.push(await plainRead());
  log(`read ${runs.read.at(-1)!.toFixed(2)} s`);
  runs.warmScan.push(await scan()); // the read above left the files in page cache
  log(`warm scan ${runs.warmScan.at(-1)!.toFixed(2)} s`);
  dropCaches();
  runs.scan.push(await scan());
  log(`cold scan ${runs.scan.at(-1)!.toFixed(2)} s`);
  const mem = inMemory();
  runs.inMemory.push(mem.simd);
  runs.inMemoryJs.push(mem.js);
  dropCaches();
  runs.export.push(exportOnce());
  log(`export ${runs.export.at(-1)!.toFixed(2)} s`);
  dropCaches();
  runs.scanThenExport.push((await scan()) + exportOnce());
  log(`scan, then export ${runs.scanThenExport.at(-1)!.toFixed(2)} s`);
}
const m = Object.fromEntries(Object.entries(runs).map(([k, v]) => [k, Math.round(median(v) * 1000) / 1000])) as Record<keyof typeof runs, number>;
const ratio = (a: number, b: number) => Math.round((a / b) * 1000) / 1000;
if (existsSync(arg['out-root']) && readdirSync(arg['out-root']).length === 0) rmSync(arg['out-root'], { recursive: true });
process.stdout.write(JSON.stringify({
  checkpoint: { dir: ckpt.dir, recipe: arg.recipe, bytes: totalBytes, files: shardFiles.length },
  seconds: m, runs,
  ratios: {
    scanOverExport: ratio(m.scan, m.export), warmScanOverExport: ratio(m.warmScan, m.export), inMemoryOverExport: ratio(m.inMemory, m.export),
    scanOverRead: ratio(m.scan, m.read), scanGBps: ratio(totalBytes / 1e9, m.scan),
    /** What the scan adds to a build that exports right after fetch: (scan + export) over export alone, minus 1. */
    addedToScanThenExport: ratio(m.scanThenExport - m.export, m.export),
  },
  target: { scanOverExportAtMost: 0.1, met: m.scan / m.export <= 0.1, warmMet: m.warmScan / m.export <= 0.1 },
  notes, machine: { cpus: cpus().length, memGB: Math.round(totalmem() / 1e9) },
}, null, 1) + '\n');
