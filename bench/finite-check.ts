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
// the page cache the scan filled. For a local checkpoint the scan rides on the content digest's
// read (src/hub/local-digest.ts): the digest alone (sha256 of every file, as before the scan was
// fused) and the digest with the scan fused are timed cold in the same run, and their difference is
// the scan's marginal cost there. Prints one JSON object; nothing is written to the repo.
import { spawnSync } from 'node:child_process';
import { open } from 'node:fs/promises';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { cpus, tmpdir, totalmem } from 'node:os';
import { join, relative } from 'node:path';
import { defaultCheckpointDir, ensureCheckpoint } from './gen-checkpoint.js';
import { benchArgs, median, positiveInt } from './util.js';
import { checkFinite, fileChunks, FiniteScanner, firstNonFinite } from '../src/io/finite.js';
import { openSafetensors, readFully } from '../src/io/safetensors.js';
import { createHash } from 'node:crypto';
import { openCheckpoint } from '../src/io/checkpoint.js';
import { Bf16W8 } from '../src/quant/w8-simd.js';
import { forgeHome, repoRoot } from '../src/paths.js';
import { listFiles, sha256OfFile } from '../src/engine/hash.js';
import { localCheckpointDigest, recordedFinite, statCacheFile } from '../src/hub/local-digest.js';

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
const statCacheRoot = mkdtempSync(join(tmpdir(), 'forge-bench-statcache-'));
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

/** The content digest as it was before the fused scan: every file through sha256, nothing else. */
async function digestAlone(): Promise<number> {
  const t = performance.now();
  for (const rel of await listFiles(ckpt.dir)) await sha256OfFile(join(ckpt.dir, rel));
  return (performance.now() - t) / 1000;
}

/**
 * The fused digest's read and hash without the test: every .safetensors file through sha256 in the
 * same chunks, one read ahead, as local-digest reads it, so fused minus this is the test alone.
 */
async function digestSameReadNoScan(): Promise<number> {
  const scanner = new FiniteScanner();
  const t = performance.now();
  for (const rel of await listFiles(ckpt.dir)) {
    const path = join(ckpt.dir, rel);
    if (!rel.endsWith('.safetensors')) { await sha256OfFile(path); continue; }
    const layout = await openSafetensors(path);
    await layout.close();
    const hash = createHash('sha256');
    const fh = await open(path, 'r');
    try {
      await scanner.readChunks(fileChunks(layout, { withHeader: true, floatOnly: false }), (c, target) => readFully(fh, target, c.position, path), (_, data) => { hash.update(data); });
    } finally {
      await fh.close();
    }
    hash.digest();
  }
  return (performance.now() - t) / 1000;
}

/** The digest as a first build of a local checkpoint runs it: every file hashed, .safetensors also scanned. */
async function digestFused(): Promise<number> {
  const saved = process.env.FORGE_CACHE;
  process.env.FORGE_CACHE = statCacheRoot; // the stat cache goes there, not into the user's cache
  try {
    rmSync(statCacheFile(ckpt.dir), { force: true });
    const t = performance.now();
    await localCheckpointDigest(ckpt.dir, { racyMs: 0 });
    const seconds = (performance.now() - t) / 1000;
    const recorded = recordedFinite(ckpt.dir);
    if (shardFiles.some((f) => recorded.get(relative(ckpt.dir, f)) !== 'ok')) throw new Error('the fused digest recorded no clean scan for every shard');
    return seconds;
  } finally {
    if (saved === undefined) delete process.env.FORGE_CACHE;
    else process.env.FORGE_CACHE = saved;
  }
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
  digestAlone: [] as number[], digestSameReadNoScan: [] as number[], digestFused: [] as number[],
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
  dropCaches();
  runs.digestAlone.push(await digestAlone());
  log(`digest alone ${runs.digestAlone.at(-1)!.toFixed(2)} s`);
  dropCaches();
  runs.digestSameReadNoScan.push(await digestSameReadNoScan());
  log(`digest alone, read as the fused one reads ${runs.digestSameReadNoScan.at(-1)!.toFixed(2)} s`);
  dropCaches();
  runs.digestFused.push(await digestFused());
  log(`digest with the scan fused ${runs.digestFused.at(-1)!.toFixed(2)} s`);
}
const m = Object.fromEntries(Object.entries(runs).map(([k, v]) => [k, Math.round(median(v) * 1000) / 1000])) as Record<keyof typeof runs, number>;
const ratio = (a: number, b: number) => Math.round((a / b) * 1000) / 1000;
rmSync(statCacheRoot, { recursive: true, force: true });
if (existsSync(arg['out-root']) && readdirSync(arg['out-root']).length === 0) rmSync(arg['out-root'], { recursive: true });
process.stdout.write(JSON.stringify({
  checkpoint: { dir: ckpt.dir, recipe: arg.recipe, bytes: totalBytes, files: shardFiles.length },
  seconds: m, runs,
  ratios: {
    scanOverExport: ratio(m.scan, m.export), warmScanOverExport: ratio(m.warmScan, m.export), inMemoryOverExport: ratio(m.inMemory, m.export),
    scanOverRead: ratio(m.scan, m.read), scanGBps: ratio(totalBytes / 1e9, m.scan),
    /** What the scan adds to a build that exports right after fetch: (scan + export) over export alone, minus 1. */
    addedToScanThenExport: ratio(m.scanThenExport - m.export, m.export),
    /** Local checkpoints: what fusing the scan into the content digest's read adds, as a share of the export. */
    fusedMarginalOverExport: ratio(m.digestFused - m.digestAlone, m.export),
    /** The test alone inside the fused read: fused minus the same read and hash without it. */
    fusedTestOverExport: ratio(m.digestFused - m.digestSameReadNoScan, m.export),
    /** The same, per repeat (each pair timed back to back, over that repeat's export): the spread under load. */
    fusedTestOverExportPerRun: runs.digestFused.map((f, i) => ratio(f - runs.digestSameReadNoScan[i], runs.export[i])),
    fusedOverDigestAlone: ratio(m.digestFused, m.digestAlone),
  },
  target: { scanOverExportAtMost: 0.1, met: m.scan / m.export <= 0.1, warmMet: m.warmScan / m.export <= 0.1, fusedMet: (m.digestFused - m.digestAlone) / m.export <= 0.1 },
  notes, machine: { cpus: cpus().length, memGB: Math.round(totalmem() / 1e9) },
}, null, 1) + '\n');
