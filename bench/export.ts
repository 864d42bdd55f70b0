// Export benchmark on a synthetic full-size checkpoint of a recipe's model (bf16; qwen3-4b by
// default, ~8 GB, or --recipe qwen3.5-4b): forge's export (the quantize stage of `forge build`:
// weights in each scheme of --quants, W8 and W4 by default, fp16 lm-head, f16 embedding table)
// side by side, in one run, with (a) `cp` of the same checkpoint and (b) onnxruntime-genai's model
// builder at int8 (its bench venv). Each contender runs in its own process under `/usr/bin/time -v`
// (peak RSS = that process's "Maximum resident set size"); wall time is measured here around it.
// With --repeat N, cp and the forge schemes run in N interleaved rounds (cp, w8, w4, cp, …), so a
// change in the machine's load hits them alike. Prints one JSON object with the figures and the
// ratios against the same run's baselines.
//
//   node --import tsx bench/export.ts [--recipe qwen3-4b|qwen3.5-4b|gemma-4-e4b|phi-tiny-moe] [--quants w8,w4] [--skip-peer] [--keep] [--repeat N]
//                                     [--peer-timeout-min M] [--peer-rss-cap-gb G (0: none)] [--out-root DIR] [--checkpoint DIR]
//
// Done-when bounds (issues 9, 15): forge peak RSS <= 1.5 GB (1.5e9 bytes) and forge time <= 2x cp, per scheme.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { cpus, totalmem, release } from 'node:os';
import { join } from 'node:path';
import { defaultCheckpointDir, ensureCheckpoint } from './gen-checkpoint.js';
import { benchArgs, median, positiveInt } from './util.js';
import { dirBytes, dropCaches, freeBytes, gb, gitState, measure, r3, srcHash, warmCache, type Measured } from './measure.js';
import { forgeHome, repoRoot } from '../src/paths.js';

// ---- arguments -----------------------------------------------------------------------------

const { values: arg, num } = benchArgs({
  'skip-peer': { type: 'boolean' }, keep: { type: 'boolean' }, repeat: { type: 'string', default: '1' },
  'peer-timeout-min': { type: 'string', default: '45' }, 'peer-rss-cap-gb': { type: 'string', default: '0' },
  'peer-min-avail-gb': { type: 'string', default: '0.75' }, 'out-root': { type: 'string', default: join(forgeHome(), 'bench', 'out') },
  recipe: { type: 'string', default: 'qwen3-4b' }, checkpoint: { type: 'string', default: '' },
  quants: { type: 'string', default: 'w8,w4' },
});
const quants = arg.quants.split(',');
for (const q of quants) if (!['w8', 'w4', 'fp16', 'fp32'].includes(q)) throw new Error(`--quants: unknown scheme '${q}'`);
const skipPeer = arg['skip-peer'] === true;
const keep = arg.keep === true;
const repeat = num('repeat', positiveInt);
const peerTimeoutS = num('peer-timeout-min') * 60;
// The box has no swap. A peer that outgrows RAM is not OOM-killed promptly: part of its RSS is the
// mmapped checkpoint, which the kernel keeps evicting and re-reading, so it thrashes and stalls the
// whole machine (seen: 17 min at 24.5 GB RSS on a 24 GiB box, no OOM kill). So this driver stops it
// when the machine's MemAvailable falls under --peer-min-avail-gb (default 0.75; 0 = never), or
// when its RSS passes --peer-rss-cap-gb (default: no cap). Its oom_score_adj is 1000 either way,
// so if the OOM killer does act, the peer and not a bystander is its victim.
const peerRssCapBytes = num('peer-rss-cap-gb') * 1e9;
const peerMinAvailBytes = num('peer-min-avail-gb') * 1e9;
const outRoot = arg['out-root'];
const recipeId = arg.recipe;
const ckptDirArg = arg.checkpoint || defaultCheckpointDir(recipeId);
const benchVenv = process.env.FORGE_BENCH_VENV ?? join(forgeHome(), 'bench-venv');
const RSS_BOUND = 1.5e9;
const TIME_BOUND = 2;

const notes: string[] = [];
const log = (m: string) => process.stderr.write(`[bench] ${m}\n`);

// ---- run -----------------------------------------------------------------------------------

mkdirSync(outRoot, { recursive: true });
const ckpt = await ensureCheckpoint(ckptDirArg, { recipe: recipeId, log });
if (!ckpt.reused) notes.push(`checkpoint generated in this run (${ckpt.seconds.toFixed(0)} s), cached at ${ckpt.dir}`);
const need = ckpt.bytes * 2.2; // cp copy + forge (~0.65x) or peer output at a time, with margin
if (freeBytes(outRoot) < need) throw new Error(`not enough disk under ${outRoot}: ${gb(freeBytes(outRoot))} GB free, want ${gb(need)} GB`);

const canDrop = dropCaches();
notes.push(canDrop
  ? 'page cache dropped (sync; echo 3 > drop_caches) before each contender: cold reads'
  : 'page cache could not be dropped here (drop_caches not permitted): the checkpoint was read once before each contender, so every contender reads it from page cache (warm)');
const prepare = async () => {
  if (canDrop) dropCaches();
  else await warmCache(ckpt.dir);
};

const outDir = (name: string) => join(outRoot, name);
const clean = (name: string) => rmSync(outDir(name), { recursive: true, force: true });

const srcHashes: string[] = [];
type Figures = { seconds: number; peakRssBytes: number | null; bytesWritten: number; filesWritten: number; runs?: number[]; userSeconds?: number | null; systemSeconds?: number | null };

interface Contender {
  name: string;
  cmd: (out: string) => string[];
  mkOut: boolean;
  secs: number[];
  peak: number;
  written: { bytes: number; files: number };
  last: Measured | null;
}
const contender = (name: string, cmd: (out: string) => string[], mkOut: boolean): Contender => ({ name, cmd, mkOut, secs: [], peak: 0, written: { bytes: 0, files: 0 }, last: null });

async function runOnce(c: Contender, round: number): Promise<void> {
  if (c.name.startsWith('forge')) srcHashes.push(srcHash());
  clean(c.name);
  if (c.mkOut) mkdirSync(outDir(c.name), { recursive: true });
  await prepare();
  log(`${c.name}: run ${round + 1}/${repeat}`);
  const m = await measure(c.cmd(outDir(c.name)), { logFile: join(outRoot, `${c.name}.log`) });
  if (m.status !== 'ok') throw new Error(`${c.name} failed (${m.status}, exit ${m.exitCode}):\n${m.stderrTail}`);
  c.secs.push(m.seconds);
  c.peak = Math.max(c.peak, m.peakRssBytes ?? 0);
  c.written = dirBytes(outDir(c.name));
  c.last = m;
  log(`${c.name}: ${m.seconds.toFixed(1)} s, peak RSS ${gb(m.peakRssBytes)} GB, ${gb(c.written.bytes)} GB written`);
  if (!keep) clean(c.name);
}

const figures = (c: Contender): Figures => ({
  seconds: r3(median(c.secs)), peakRssBytes: c.peak, bytesWritten: c.written.bytes, filesWritten: c.written.files,
  userSeconds: c.last!.userSeconds, systemSeconds: c.last!.systemSeconds, ...(repeat > 1 ? { runs: c.secs.map(r3) } : {}),
});

// (a) cp of the same bytes, fsynced like forge's commit() fsyncs its data files; then forge's
// export in each scheme, round after round.
const cpRun = contender('cp', (out) => ['sh', '-c', 'cp -r --reflink=never "$1" "$2" && sync "$2"/*', 'sh', ckpt.dir, out], false);
notes.push('cp = `cp -r --reflink=never CKPT OUT && sync OUT/*` (ext4: in-kernel copy_file_range; the sync matches forge fsyncing its data files)');
const forgeRuns = quants.map((q) => contender(`forge-${q}`, (out) => ['node', '--import', 'tsx', join('bench', 'run-export.ts'), ckpt.dir, out, '--recipe', recipeId, '--quant', q], true));
for (let i = 0; i < repeat; i++) for (const c of [cpRun, ...forgeRuns]) await runOnce(c, i);
if (new Set(srcHashes).size > 1) notes.push(`src/ changed between forge runs (hashes ${srcHashes.join(', ')}): the runs measured different code`);
const cp = { fig: figures(cpRun) };
const forgeByQuant = Object.fromEntries(forgeRuns.map((c, i) => {
  const self = JSON.parse(c.last!.stdout.trim().split('\n').pop() ?? '{}') as { maxRssBytes?: number; contexts?: unknown; plan?: unknown };
  return [quants[i], { ...figures(c), selfReportedMaxRssBytes: self.maxRssBytes ?? null, plan: self.plan, contexts: self.contexts }];
}));

// (b) the peer: onnxruntime-genai model builder, int8, CPU.
let peer: Record<string, unknown>;
if (skipPeer) {
  peer = { status: 'skipped' };
} else {
  const py = join(benchVenv, 'bin', 'python');
  if (!existsSync(py)) {
    peer = { status: 'not-installed', error: `${py} missing: create the bench venv (see bench/README.md)` };
  } else {
    const ver = spawnSync(py, ['-c', 'import onnxruntime_genai as g, transformers as t, torch; print(g.__version__, t.__version__, torch.__version__)'], { encoding: 'utf8' });
    clean('peer');
    await prepare();
    const cacheDir = join(outDir('peer'), 'cache_dir');
    const builder = [py, '-m', 'onnxruntime_genai.models.builder', '-i', ckpt.dir, '-o', join(outDir('peer'), 'model'), '-p', 'int8', '-e', 'cpu', '-c', cacheDir];
    // exec keeps the builder the direct child of /usr/bin/time; oom_score_adj 1000 makes it the OOM victim.
    const cmd = ['sh', '-c', 'echo 1000 > /proc/self/oom_score_adj; exec "$@"', 'sh', ...builder];
    log(`peer: ${builder.join(' ')} (timeout ${peerTimeoutS / 60} min${peerRssCapBytes ? `, RSS cap ${gb(peerRssCapBytes)} GB` : ''}${peerMinAvailBytes ? `, stopped if MemAvailable < ${gb(peerMinAvailBytes)} GB` : ''})`);
    const m = await measure(cmd, { timeoutS: peerTimeoutS, rssCapBytes: peerRssCapBytes, minAvailBytes: peerMinAvailBytes, logFile: join(outRoot, 'peer.log') });
    const lastStep = m.stderrTail.split('\n').reverse().find((l) => /start to quantize|complete quantization|Saving|save/i.test(l));
    const w = dirBytes(join(outDir('peer'), 'model'));
    const c = dirBytes(cacheDir);
    peer = {
      status: m.status,
      versions: ver.stdout.trim() || undefined,
      command: builder.join(' '),
      seconds: r3(m.seconds),
      peakRssBytes: m.peakRssBytes,
      sampledPeakGroupRssBytes: m.sampledPeakGroupRssBytes,
      sampledPeakAnonBytes: m.sampledPeakAnonBytes,
      sampledPeakFileBytes: m.sampledPeakFileBytes,
      minMemAvailableBytes: m.minMemAvailableBytes,
      userSeconds: m.userSeconds,
      systemSeconds: m.systemSeconds,
      bytesWritten: w.bytes,
      filesWritten: w.files,
      cacheDirBytesLeft: c.bytes,
      ...(m.status !== 'ok' ? { exitCode: m.exitCode, signal: m.signal, oomKillsDuring: m.oomKillsDuring, lastStep, error: m.stderrTail } : {}),
    };
    if (m.status === 'killed-rss-cap') notes.push(`peer stopped by this driver when its RSS passed ${gb(peerRssCapBytes)} GB (--peer-rss-cap-gb)`);
    if (m.status === 'killed-low-memory') notes.push(`peer stopped by this driver when the machine's MemAvailable fell under ${gb(peerMinAvailBytes)} GB (${gb(totalmem())} GB RAM, no swap; --peer-min-avail-gb): past that it thrashes rather than being OOM-killed`);
    if (m.status === 'killed-signal' && m.signal === 'signal 9' && m.oomKillsDuring) notes.push(`peer killed by the kernel OOM killer (signal 9, /proc/vmstat oom_kill +${m.oomKillsDuring}; ${gb(totalmem())} GB RAM, no swap)`);
    if (m.status === 'timed-out') notes.push(`peer stopped after the ${peerTimeoutS / 60}-minute timeout`);
    log(`peer: ${m.status}, ${m.seconds.toFixed(1)} s, peak RSS ${gb(m.peakRssBytes)} GB, ${gb(w.bytes)} GB written`);
    if (!keep) clean('peer');
  }
}

// ---- report --------------------------------------------------------------------------------

// Per scheme: time over cp, peak RSS, and the bounds. The peer comparison is against W8 (its int8).
const perQuant = Object.fromEntries(Object.entries(forgeByQuant).map(([q, f]) => {
  const overCp = f.seconds / cp.fig.seconds;
  const rss = f.peakRssBytes ?? Infinity;
  return [q, { forgeOverCpTime: r3(overCp), forgePeakRssGB: gb(f.peakRssBytes), forgeThroughputGBps: r3(ckpt.bytes / 1e9 / f.seconds), rssOk: rss <= RSS_BOUND, timeOk: overCp <= TIME_BOUND, met: rss <= RSS_BOUND && overCp <= TIME_BOUND }];
}));
const forgeW8 = forgeByQuant.w8 ?? Object.values(forgeByQuant)[0];
const forgeRss = forgeW8.peakRssBytes ?? Infinity;
const peerOk = peer.status === 'ok';
const peerStopped = ['killed-rss-cap', 'killed-low-memory', 'killed-signal', 'timed-out'].includes(peer.status as string);
const peerPeakSeen = Math.max((peer.peakRssBytes as number | null) ?? 0, (peer.sampledPeakGroupRssBytes as number | undefined) ?? 0);
const ratios: Record<string, unknown> = {
  ...perQuant,
  forgeOverPeerTime: peerOk ? r3(forgeW8.seconds / (peer.seconds as number)) : null,
  forgeOverPeerPeakRss: peerOk && peer.peakRssBytes ? r3(forgeRss / (peer.peakRssBytes as number)) : null,
  peerOverCpTime: peerOk ? r3((peer.seconds as number) / cp.fig.seconds) : null,
  peerPeakRssGB: peerOk ? gb(peer.peakRssBytes as number) : null,
  // A peer stopped before finishing still bounds the comparison: it used at least this much.
  ...(peerStopped ? {
    peerPeakRssGBAtLeast: gb(peerPeakSeen),
    forgeOverPeerPeakRssAtMost: r3(forgeRss / peerPeakSeen),
    peerSecondsAtLeast: peer.seconds as number,
  } : {}),
  cpThroughputGBps: r3(ckpt.bytes / 1e9 / cp.fig.seconds),
};
const report = {
  benchmark: `export+${quants.join('/')}, synthetic ${recipeId} (bf16), forge vs cp${skipPeer ? '' : ' vs onnxruntime-genai builder int8'}`,
  checkpoint: { dir: ckpt.dir, bytes: ckpt.bytes, files: ckpt.files, weightFiles: ckpt.weightFiles },
  forge: { ...forgeByQuant, code: { ...gitState(), srcHash: srcHashes[srcHashes.length - 1] } },
  cp: cp.fig,
  peer,
  ratios,
  bounds: {
    peakRssLimitBytes: RSS_BOUND,
    timeLimitOverCp: TIME_BOUND,
    met: Object.values(perQuant).every((p) => p.met),
  },
  notes: [
    ...notes,
    'peak RSS = /usr/bin/time -v "Maximum resident set size" of each contender process (the largest single process of its tree); seconds = wall time around it, process start-up included',
    `forge-<scheme> = bench/run-export.ts --quant <scheme>: runExport() with the ${recipeId} recipe on v81 (its weights in that scheme, fp16 lm-head, f16 embedding table, the recipe\'s prefill + decode graphs), as the quantize stage runs it`,
    repeat > 1 ? `cp and each forge scheme ran ${repeat} times, in interleaved rounds; seconds is the median` : 'one run per contender',
  ],
  machine: {
    cpus: cpus().length, cpuModel: cpus()[0]?.model, memGB: gb(totalmem()), node: process.version, kernel: release(),
    date: new Date().toISOString(),
  },
};
process.stdout.write(JSON.stringify(report, null, 2) + '\n');
