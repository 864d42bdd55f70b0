// Export+W8 benchmark on a synthetic full-size checkpoint of a recipe's model (bf16; qwen3-4b by
// default, ~8 GB, or --recipe qwen3.5-4b): forge's
// export (the quantize stage of `forge build`, W8 weights, fp16 lm-head, f16 embedding table)
// side by side, in one run, with (a) `cp` of the same checkpoint and (b) onnxruntime-genai's model
// builder at int8 (its bench venv). Each contender runs in its own process under `/usr/bin/time -v`
// (peak RSS = that process's "Maximum resident set size"); wall time is measured here around it.
// Prints one JSON object with the figures and the ratios against the same run's baselines.
//
//   node --import tsx bench/export.ts [--recipe qwen3-4b|qwen3.5-4b] [--skip-peer] [--keep] [--repeat N] [--peer-timeout-min M]
//                                     [--peer-rss-cap-gb G (0: none)] [--out-root DIR] [--checkpoint DIR]
//
// Done-when bounds (issue): forge peak RSS <= 1.5 GB (1.5e9 bytes) and forge time <= 2x cp.
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
});
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

async function contender(name: string, cmd: (out: string) => string[], mkOut: boolean): Promise<{ fig: Figures; last: Measured }> {
  const secs: number[] = [];
  let last: Measured | null = null;
  let peak = 0;
  let written = { bytes: 0, files: 0 };
  for (let i = 0; i < repeat; i++) {
    if (name === 'forge') srcHashes.push(srcHash());
    clean(name);
    if (mkOut) mkdirSync(outDir(name), { recursive: true });
    await prepare();
    log(`${name}: run ${i + 1}/${repeat}`);
    const m = await measure(cmd(outDir(name)), { logFile: join(outRoot, `${name}.log`) });
    if (m.status !== 'ok') throw new Error(`${name} failed (${m.status}, exit ${m.exitCode}):\n${m.stderrTail}`);
    secs.push(m.seconds);
    peak = Math.max(peak, m.peakRssBytes ?? 0);
    written = dirBytes(outDir(name));
    last = m;
    log(`${name}: ${m.seconds.toFixed(1)} s, peak RSS ${gb(m.peakRssBytes)} GB, ${gb(written.bytes)} GB written`);
    if (!keep) clean(name);
  }
  return {
    fig: { seconds: r3(median(secs)), peakRssBytes: peak, bytesWritten: written.bytes, filesWritten: written.files, userSeconds: last!.userSeconds, systemSeconds: last!.systemSeconds, ...(repeat > 1 ? { runs: secs.map(r3) } : {}) },
    last: last!,
  };
}

// (a) cp of the same bytes, fsynced like forge's commit() fsyncs its data files.
const cp = await contender('cp', (out) => ['sh', '-c', 'cp -r --reflink=never "$1" "$2" && sync "$2"/*', 'sh', ckpt.dir, out], false);
notes.push('cp = `cp -r --reflink=never CKPT OUT && sync OUT/*` (ext4: in-kernel copy_file_range; the sync matches forge fsyncing its data files)');

// forge export+W8.
const forge = await contender('forge', (out) => ['node', '--import', 'tsx', join('bench', 'run-export.ts'), ckpt.dir, out, '--recipe', recipeId], true);
if (new Set(srcHashes).size > 1) notes.push(`src/ changed between forge runs (hashes ${srcHashes.join(', ')}): the runs measured different code`);
const forgeSelf = JSON.parse(forge.last.stdout.trim().split('\n').pop() ?? '{}') as { maxRssBytes?: number; contexts?: unknown; plan?: unknown };

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

const forgeOverCpTime = forge.fig.seconds / cp.fig.seconds;
const forgeRss = forge.fig.peakRssBytes ?? Infinity;
const peerOk = peer.status === 'ok';
const peerStopped = ['killed-rss-cap', 'killed-low-memory', 'killed-signal', 'timed-out'].includes(peer.status as string);
const peerPeakSeen = Math.max((peer.peakRssBytes as number | null) ?? 0, (peer.sampledPeakGroupRssBytes as number | undefined) ?? 0);
const ratios: Record<string, number | null> = {
  forgeOverCpTime: r3(forgeOverCpTime),
  forgePeakRssGB: gb(forge.fig.peakRssBytes),
  forgeOverPeerTime: peerOk ? r3(forge.fig.seconds / (peer.seconds as number)) : null,
  forgeOverPeerPeakRss: peerOk && peer.peakRssBytes ? r3(forgeRss / (peer.peakRssBytes as number)) : null,
  peerOverCpTime: peerOk ? r3((peer.seconds as number) / cp.fig.seconds) : null,
  peerPeakRssGB: peerOk ? gb(peer.peakRssBytes as number) : null,
  // A peer stopped before finishing still bounds the comparison: it used at least this much.
  ...(peerStopped ? {
    peerPeakRssGBAtLeast: gb(peerPeakSeen),
    forgeOverPeerPeakRssAtMost: r3(forgeRss / peerPeakSeen),
    peerSecondsAtLeast: peer.seconds as number,
  } : {}),
  forgeThroughputGBps: r3(ckpt.bytes / 1e9 / forge.fig.seconds),
  cpThroughputGBps: r3(ckpt.bytes / 1e9 / cp.fig.seconds),
};
const report = {
  benchmark: `export+W8, synthetic ${recipeId} (bf16), forge vs cp${skipPeer ? '' : ' vs onnxruntime-genai builder int8'}`,
  checkpoint: { dir: ckpt.dir, bytes: ckpt.bytes, files: ckpt.files, weightFiles: ckpt.weightFiles },
  forge: { ...forge.fig, code: { ...gitState(), srcHash: srcHashes[srcHashes.length - 1] }, selfReportedMaxRssBytes: forgeSelf.maxRssBytes ?? null, plan: forgeSelf.plan, contexts: forgeSelf.contexts },
  cp: cp.fig,
  peer,
  ratios,
  bounds: {
    peakRssLimitBytes: RSS_BOUND,
    timeLimitOverCp: TIME_BOUND,
    rssOk: forgeRss <= RSS_BOUND,
    timeOk: forgeOverCpTime <= TIME_BOUND,
    met: forgeRss <= RSS_BOUND && forgeOverCpTime <= TIME_BOUND,
  },
  notes: [
    ...notes,
    'peak RSS = /usr/bin/time -v "Maximum resident set size" of each contender process (the largest single process of its tree); seconds = wall time around it, process start-up included',
    `forge = bench/run-export.ts: runExport() with the ${recipeId} recipe on v81 (W8 weights, fp16 lm-head, f16 embedding table, the recipe\'s prefill + decode graphs), as the quantize stage runs it`,
    repeat > 1 ? `cp and forge each ran ${repeat} times; seconds is the median` : 'one run per contender',
  ],
  machine: {
    cpus: cpus().length, cpuModel: cpus()[0]?.model, memGB: gb(totalmem()), node: process.version, kernel: release(),
    date: new Date().toISOString(),
  },
};
process.stdout.write(JSON.stringify(report, null, 2) + '\n');
