// The audio front-end, in one run: the runtime's C++ pre-processing (qhx_features: libsndfile decode,
// downmix, libsoxr HQ resample, Gemma-4's log-mel) against the same steps in Python, the peer:
// oracles/audio_features.py's reference_features (the WAV read with numpy, python-soxr HQ, transformers'
// Gemma4AudioFeatureExtractor), on the same files, with the error between the two.
//
//   node --import tsx bench/audio.ts [--runs 7] [--json] [FILE.wav ...]
//
// Without files it makes its own: espeak-ng speech (22.05 kHz mono), 30 s of 44.1 kHz stereo float,
// 30 s at 16 kHz (no resampling), 10 s at 48 kHz. Both sides are timed in process (qhx_features'
// own timings; Python per call after a warm-up, imports excluded); the C++ tool's process wall
// time (start-up included) is printed too.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import { ensureNative } from '../src/toolchain/native.js';
import { ensureVenv } from '../src/toolchain/venv.js';
import { ensureDebianPackages } from '../src/toolchain/system-deps.js';
import { benchArgs, median, positiveInt } from './util.js';

const { values: arg, num, positionals } = benchArgs({ runs: { type: 'string', default: '7' }, json: { type: 'boolean' } });
const runs = num('runs', positiveInt);
const work = mkdtempSync(join(tmpdir(), 'forge-bench-audio-'));

const GEN = String.raw`
import struct, sys
import numpy as np
out = sys.argv[1]
rng = np.random.default_rng(3)
def wav(name, x, rate, float32):
    ch = x.shape[1]
    body = x.astype('<f4').tobytes() if float32 else np.clip(np.round(x * 32768), -32768, 32767).astype('<i2').tobytes()
    bits = 32 if float32 else 16
    fmt = struct.pack('<HHIIHH', 3 if float32 else 1, ch, rate, rate * ch * bits // 8, ch * bits // 8, bits)
    data = b'fmt ' + struct.pack('<I', 16) + fmt + b'data' + struct.pack('<I', len(body)) + body
    open(f'{out}/{name}', 'wb').write(b'RIFF' + struct.pack('<I', 4 + len(data)) + b'WAVE' + data)
def sig(rate, seconds, ch):
    t = np.arange(int(rate * seconds)) / rate
    return np.stack([0.3 * np.sin(2 * np.pi * (200 + 50 * c + 400 * t) * t) + 0.05 * rng.standard_normal(t.size) for c in range(ch)], 1)
wav('stereo-30s-44k1-f32.wav', sig(44100, 30, 2), 44100, True)
wav('mono-30s-16k-s16.wav', sig(16000, 30, 1), 16000, False)
wav('mono-10s-48k-s16.wav', sig(48000, 10, 1), 48000, False)
`;

try {
  const python = await ensureVenv();
  const native = await ensureNative();
  const qhx = join(native.buildDir, 'qhx_features');
  const config = join(work, 'preprocessor_config.json');
  writeFileSync(config, JSON.stringify({ feature_extractor: { feature_extractor_type: 'Gemma4AudioFeatureExtractor' } }));
  let files = positionals.map((f) => resolve(f));
  if (!files.length) {
    await ensureDebianPackages({ 'espeak-ng': 'espeak-ng' }, (m) => process.stderr.write(`${m}\n`));
    const speech = join(work, 'speech-22k-s16.wav');
    await $({ quiet: true })`espeak-ng -w ${speech} ${'Forge turns a checkpoint into a bundle for the phone, and proves every step against the reference. The quick brown fox jumps over the lazy dog.'}`;
    writeFileSync(join(work, 'gen.py'), GEN);
    await $({ quiet: true })`${python} ${join(work, 'gen.py')} ${work}`;
    files = [speech, ...['stereo-30s-44k1-f32.wav', 'mono-30s-16k-s16.wav', 'mono-10s-48k-s16.wav'].map((n) => join(work, n))];
  }
  const rows: Array<{ file: string; seconds: number; cppMs: number; cppProcessMs: number; hfMs: number; ratio: number; maxAbs: number; cosine: number }> = [];
  for (const file of files) {
    const cpp: number[] = [];
    const wall: number[] = [];
    let seconds = 0;
    for (let i = 0; i < runs; i++) {
      const t0 = performance.now();
      const r = await $({ quiet: true })`${qhx} ${file} --config ${config} --out ${join(work, 'c.bin')} --json`;
      wall.push(performance.now() - t0);
      const j = JSON.parse(r.stdout.trim()) as { samples: number; timings: { decode_ms: number; resample_ms: number; features_ms: number } };
      cpp.push(j.timings.decode_ms + j.timings.resample_ms + j.timings.features_ms);
      seconds = j.samples / 16000;
    }
    const script = `import sys, time, json; sys.path.insert(0, 'oracles'); import audio_features as af
c = af.load_config(${JSON.stringify(config)})
f, m = af.reference_features(${JSON.stringify(file)}, c)
f.astype('<f4').tofile(${JSON.stringify(join(work, 'h.bin'))})
ts = []
for _ in range(${runs}):
    t = time.perf_counter(); af.reference_features(${JSON.stringify(file)}, c); ts.append((time.perf_counter() - t) * 1000)
print(json.dumps(ts))`;
    const hf = JSON.parse((await $({ quiet: true })`${python} -c ${script}`).stdout.trim().split('\n').pop()!) as number[];
    const a = new Float32Array(readFileSync(join(work, 'c.bin')).buffer.slice(0));
    const b = new Float32Array(readFileSync(join(work, 'h.bin')).buffer.slice(0));
    if (a.length !== b.length) throw new Error(`${file}: qhx_features gave ${a.length} values, HF ${b.length}`);
    let maxAbs = 0, dot = 0, na = 0, nb = 0;
    for (let i = 0; i < a.length; i++) {
      maxAbs = Math.max(maxAbs, Math.abs(a[i] - b[i]));
      dot += a[i] * b[i];
      na += a[i] * a[i];
      nb += b[i] * b[i];
    }
    rows.push({ file: basename(file), seconds, cppMs: median(cpp), cppProcessMs: median(wall), hfMs: median(hf), ratio: median(hf) / median(cpp), maxAbs, cosine: dot / Math.sqrt(na * nb) });
  }
  if (arg.json) console.log(JSON.stringify({ runs, rows }));
  else {
    console.log(`audio pre-processing (median of ${runs}): C++ (qhx_features) vs Python (read + python-soxr + HF's Gemma4AudioFeatureExtractor), decode + downmix + resample + log-mel`);
    for (const r of rows)
      console.log(`  ${r.file.padEnd(26)} ${r.seconds.toFixed(1).padStart(5)} s   C++ ${r.cppMs.toFixed(2).padStart(7)} ms (process ${r.cppProcessMs.toFixed(0)} ms)   HF ${r.hfMs.toFixed(2).padStart(7)} ms   HF/C++ ${r.ratio.toFixed(1)}×   max abs ${r.maxAbs.toExponential(2)} cos ${r.cosine.toFixed(12)}`);
  }
} finally {
  rmSync(work, { recursive: true, force: true });
}
