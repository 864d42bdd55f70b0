// What keying a local checkpoint by content costs: the first digest (every byte hashed) and a later
// one (stat cache warm), each against a plain read of the same files in the same run. Then what the
// digest saves the export stage's cache commit: the files hard-linked into an output folder as the
// fp32 export links a checkpoint's weights, hashed as a commit did before (every byte read) against
// a commit now (engine/known-digests.ts: the digests the local digest recorded).
//   node --import tsx bench/local-digest.ts [--gb 2] [--files 2] [--repeat 3] [--keep]
import { createReadStream, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { appendFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { localCheckpointDigest, statCacheFile } from '../src/hub/local-digest.js';
import { hashTree } from '../src/engine/hash.js';
import { knownDigest } from '../src/engine/known-digests.js';
import { CheckpointLinks } from '../src/onnx/linked-data.js';
import { benchArgs, median, positiveInt } from './util.js';

const { values, num } = benchArgs({ gb: { type: 'string', default: '2' }, files: { type: 'string', default: '2' }, repeat: { type: 'string', default: '3' }, keep: { type: 'boolean' } });
const gb = num('gb', (n) => n > 0);
const fileCount = num('files', positiveInt);
const repeat = num('repeat', positiveInt);

const work = mkdtempSync(join(tmpdir(), 'forge-bench-digest-'));
process.env.FORGE_CACHE = join(work, 'cache');
const dir = join(work, 'model');
const bytesPerFile = Math.floor((gb * 1e9) / fileCount);
// Non-constant bytes (a cheap xorshift stream), written once in 64 MB pieces.
let x = 0x9e3779b9;
const piece = Buffer.alloc(64 << 20);
const fill = () => { for (let i = 0; i < piece.length; i += 4) { x ^= x << 13; x ^= x >>> 17; x ^= x << 5; piece.writeUInt32LE(x >>> 0, i); } };
fill();
mkdirSync(dir, { recursive: true });
for (let f = 0; f < fileCount; f++) {
  const path = join(dir, `model-${f}.safetensors`);
  writeFileSync(path, '');
  for (let done = 0; done < bytesPerFile; done += piece.length) {
    await appendFile(path, piece.subarray(0, Math.min(piece.length, bytesPerFile - done)));
  }
}
// Let the files age past the racy window, so the stat cache may keep their digests.
await new Promise((r) => setTimeout(r, 2500));

async function plainRead(): Promise<number> {
  const t = performance.now();
  for (let f = 0; f < fileCount; f++) for await (const _ of createReadStream(join(dir, `model-${f}.safetensors`), { highWaterMark: 4 << 20 })) { /* read only */ }
  return (performance.now() - t) / 1000;
}

const read: number[] = [];
const cold: number[] = [];
const warm: number[] = [];
for (let r = 0; r < repeat; r++) {
  read.push(await plainRead());
  rmSync(statCacheFile(dir), { force: true });
  let t = performance.now();
  await localCheckpointDigest(dir);
  cold.push((performance.now() - t) / 1000);
  t = performance.now();
  await localCheckpointDigest(dir);
  warm.push((performance.now() - t) / 1000);
}
const total = bytesPerFile * fileCount;
const mr = median(read), mc = median(cold), mw = median(warm);
console.log(`${fileCount} files, ${(total / 1e9).toFixed(2)} GB (page cache warm: the files were just written and read), median of ${repeat}`);
console.log(`  plain read (baseline)        ${mr.toFixed(3)} s  ${(total / 1e9 / mr).toFixed(2)} GB/s`);
console.log(`  first digest (sha256 all)    ${mc.toFixed(3)} s  ${(total / 1e9 / mc).toFixed(2)} GB/s  ${(mc / mr).toFixed(2)}× the plain read`);
console.log(`  later digest (stat cache)    ${(mw * 1000).toFixed(2)} ms  ${(mw / mr).toFixed(5)}× the plain read`);

// The export's links, made after the last digest (as in a build), then its commit both ways.
const out = join(work, 'export');
mkdirSync(out);
const links = new CheckpointLinks(out);
for (let f = 0; f < fileCount; f++) links.ref({ file: join(dir, `model-${f}.safetensors`), fileOffset: 0, byteLength: 4 }, 4);
const before: number[] = [];
const now: number[] = [];
for (let r = 0; r < repeat; r++) {
  let t = performance.now();
  const a = await hashTree(out);
  before.push((performance.now() - t) / 1000);
  t = performance.now();
  const b = await hashTree(out, new Set(), knownDigest);
  now.push((performance.now() - t) / 1000);
  if (a.contentHash !== b.contentHash || b.reusedBytes !== total) throw new Error(`the commit by known digests differs: ${a.contentHash} vs ${b.contentHash}, ${b.reusedBytes} of ${total} bytes by digest`);
}
const mb = median(before), mn = median(now);
console.log(`  export commit, links read    ${mb.toFixed(3)} s  (what committing the export's links cost before)`);
console.log(`  export commit, known digests ${(mn * 1000).toFixed(2)} ms  ${(mn / mb).toFixed(5)}× reading them; the same content hash`);
if (!values.keep) rmSync(work, { recursive: true, force: true });
