// Memory and time of the trace stage's oracle (oracles/trace.py) on a checkpoint: the streamed trace
// (the default) and, with --whole-model, HF's plain fp32 load as the baseline in the same run.
// Private (RssAnon) and mapped (RssFile) memory of the Python process tree are sampled every 100 ms
// from /proc; VmHWM (the kernel's total peak) is read at the end as a cross-check of the sampling.
//
//   node --import tsx bench/trace.ts --checkpoint DIR --out-root DIR [--new-tokens 8]
//        [--prompts '["The capital of France is"]'] [--max-context 64] [--whole-model]
//
// Real-size checkpoints go through /work/prompts/heavy.sh (and -x with --whole-model: ~4 bytes per
// parameter). Prints one JSON object: per mode seconds (load, trace, per step; wall and CPU, the
// latter being what to compare on a machine shared with other jobs), peaks, the trace's
// own fp32 weight peak, and with --whole-model the streamed/whole ratios of per-step seconds and
// private peak. Outputs go under --out-root and are removed at the end.
import { sampleTree } from '../src/engine/memory.js';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { ensureVenv } from '../src/toolchain/venv.js';
import { repoRoot } from '../src/paths.js';
import { benchArgs, positiveInt } from './util.js';

const { values: a, num } = benchArgs({
  checkpoint: { type: 'string', default: '' }, 'out-root': { type: 'string', default: '' },
  'new-tokens': { type: 'string', default: '8' }, 'max-context': { type: 'string', default: '64' },
  prompts: { type: 'string', default: '["The capital of France is"]' }, 'whole-model': { type: 'boolean' },
});
if (!a.checkpoint || !a['out-root']) {
  process.stderr.write('usage: bench/trace.ts --checkpoint DIR --out-root DIR [--new-tokens N] [--max-context C] [--prompts JSON] [--whole-model]\n');
  process.exit(2);
}
const newTokens = num('new-tokens', positiveInt);
const maxContext = num('max-context', positiveInt);
const log = (m: string) => process.stderr.write(`[bench] ${m}\n`);

async function runTrace(python: string, wholeModel: boolean) {
  const root = resolve(a['out-root']);
  mkdirSync(root, { recursive: true });
  const out = join(root, wholeModel ? 'trace-whole' : 'trace-streamed');
  rmSync(out, { recursive: true, force: true });
  const promptsFile = join(root, 'prompts.json');
  writeFileSync(promptsFile, a.prompts);
  const args = [join(repoRoot(), 'oracles/trace.py'), '--model', a.checkpoint, '--out', out, '--prompts', promptsFile,
    '--new-tokens', String(newTokens), '--max-context', String(maxContext), ...(wholeModel ? ['--whole-model'] : [])];
  const t0 = performance.now();
  const child = spawn(python, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  let stdout = '';
  child.stdout.on('data', (d) => { stdout += d; });
  const peak = { anon: 0, file: 0, sum: 0 };
  let hwm = 0;
  const timer = setInterval(() => {
    const s = sampleTree(child.pid!);
    peak.anon = Math.max(peak.anon, s.privateBytes);
    peak.file = Math.max(peak.file, s.mappedBytes);
    peak.sum = Math.max(peak.sum, s.privateBytes + s.mappedBytes);
    try {
      const kb = /^VmHWM:\s+(\d+)/m.exec(readFileSync(`/proc/${child.pid}/status`, 'utf8'))?.[1];
      if (kb) hwm = Number(kb) * 1024;
    } catch { /* exited */ }
  }, 100);
  const code = await new Promise<number | null>((res) => child.on('close', res));
  clearInterval(timer);
  const seconds = (performance.now() - t0) / 1000;
  if (code !== 0) throw new Error(`trace.py ${wholeModel ? '--whole-model ' : ''}exited with ${code}`);
  const info = JSON.parse(stdout.trim().split('\n').pop()!);
  const trace = readFileSync(join(out, 'trace.safetensors'));
  rmSync(out, { recursive: true, force: true });
  return {
    mode: info.weights as string, seconds: +seconds.toFixed(1), loadSeconds: info.load_s, traceSeconds: info.trace_s,
    steps: info.steps, secondsPerStep: +(info.trace_s / info.steps).toFixed(3),
    cpuSecondsPerStep: +(info.trace_cpu_s / info.steps).toFixed(3), loadCpuSeconds: info.load_cpu_s,
    privatePeakBytes: peak.anon, mappedPeakBytes: peak.file, sampledTotalPeakBytes: peak.sum, vmHwmBytes: hwm,
    weightsFp32PeakBytes: info.weights_fp32_peak_bytes, traceBytes: trace.length, traceSha: hashOf(trace),
  };
}

const hashOf = (b: Buffer) => createHash('sha256').update(b).digest('hex').slice(0, 16);

if (!existsSync(join(a.checkpoint, 'config.json'))) throw new Error(`${a.checkpoint}: no config.json (not a checkpoint directory)`);
const python = await ensureVenv();
const runs = [];
log(`streamed trace of ${a.checkpoint}, ${newTokens} new tokens`);
runs.push(await runTrace(python, false));
if (a['whole-model']) {
  log('whole-model trace (baseline)');
  runs.push(await runTrace(python, true));
}
const [s, w] = runs;
const GB = (n: number) => +(n / 1e9).toFixed(2);
const result: Record<string, unknown> = {
  checkpoint: a.checkpoint, newTokens, prompts: JSON.parse(a.prompts).length,
  runs: runs.map((r) => ({ ...r, privatePeakGB: GB(r.privatePeakBytes), mappedPeakGB: GB(r.mappedPeakBytes), vmHwmGB: GB(r.vmHwmBytes) })),
};
if (w) {
  result.streamedOverWhole = {
    secondsPerStep: +(s.secondsPerStep / w.secondsPerStep).toFixed(3),
    cpuSecondsPerStep: +(s.cpuSecondsPerStep / w.cpuSecondsPerStep).toFixed(3),
    privatePeak: +(s.privatePeakBytes / w.privatePeakBytes).toFixed(3),
    identicalTrace: s.traceSha === w.traceSha,
  };
}
process.stdout.write(JSON.stringify(result, null, 1) + '\n');
