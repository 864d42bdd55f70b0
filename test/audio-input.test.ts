// The runtime's audio pre-processing (native/src/audio_input.cpp, run by the qhx_features tool) held to
// HF's: the same WAV file through oracles/audio_features.py's reference_features — the file read and
// its channels averaged, resampled to 16 kHz with python-soxr at HQ when it has another rate (what
// librosa.load does by default), then transformers' Gemma4AudioFeatureExtractor with HF's defaults
// (Gemma-4's) — on files made here at test time: speech synthesised by espeak-ng (22.05 kHz) and
// signals written in code at 8, 11.025, 16, 44.1 and 48 kHz, 1 to 3 channels, 8/16/24-bit PCM and
// 32-bit float, plain and WAVE_FORMAT_EXTENSIBLE, from 0.3 s to exactly the 30 s maximum.
//
// Bounds, measured (transformers 5.23, numpy 2.3.5, python-soxr 1.1.0 against Debian's libsndfile
// 1.2.0 / libsoxr 0.1.3 / KissFFT 131.1.0): the samples the extractor is given are bit-identical on
// both sides, resampled or not (python-soxr wraps the same libsoxr); the features then differ only
// by HF's float32 FFT against forge's double one: max abs error 2.4e-7 (16 kHz tones) to 4.8e-7 (one
// float32 step at |x| in [4, 8); log-mel values lie in [log 1e-3, ~6]) on every file, mean abs
// 1.4e-8 to 2.6e-8, cosine 1 to 13 digits; the frame mask is equal. The test allows 1e-6 / 5e-8 /
// 1 − 1e-10.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runOwned } from '../src/engine/subprocess.js';
import { ensureNative } from '../src/toolchain/native.js';
import { runPython } from '../src/toolchain/python.js';
import { ensureDebianPackages } from '../src/toolchain/system-deps.js';

const BOUNDS = { maxAbs: 1e-6, meanAbs: 5e-8, cosine: 0.9999999999 };

// Test signals, written with numpy + struct (RIFF by hand: the forms Python's wave module cannot
// write, float and extensible, included). Prints {file name: [rate, channels, format]}.
const GEN = String.raw`
import json, struct, sys
import numpy as np

out = sys.argv[1]
rng = np.random.default_rng(7)
files = {}

def write_wav(name, x, rate, fmt, extensible=False):
    """x float64 [frames, channels] in [-1, 1); fmt: u8, s16, s24, s32, f32."""
    frames, ch = x.shape
    if fmt == 'f32':
        tag, bits, body = 3, 32, x.astype('<f4').tobytes()
    elif fmt == 'u8':
        tag, bits, body = 1, 8, np.clip(np.round(x * 128 + 128), 0, 255).astype(np.uint8).tobytes()
    else:
        bits = int(fmt[1:])
        q = np.clip(np.round(x * 2.0 ** (bits - 1)), -2 ** (bits - 1), 2 ** (bits - 1) - 1).astype('<i4')
        tag = 1
        body = q.view(np.uint8).reshape(frames, ch, 4)[..., :bits // 8].tobytes()
    block = ch * bits // 8
    if extensible:
        guid = struct.pack('<H', tag) + bytes.fromhex('000000001000800000aa00389b71')
        fmt_chunk = struct.pack('<HHIIHHHHI', 0xFFFE, ch, rate, rate * block, block, bits, 22, bits, (1 << ch) - 1) + guid
    else:
        fmt_chunk = struct.pack('<HHIIHH', tag, ch, rate, rate * block, block, bits)
    chunks = b'fmt ' + struct.pack('<I', len(fmt_chunk)) + fmt_chunk + b'data' + struct.pack('<I', len(body)) + body + (b'\0' if len(body) & 1 else b'')
    open(f'{out}/{name}', 'wb').write(b'RIFF' + struct.pack('<I', 4 + len(chunks)) + b'WAVE' + chunks)
    files[name] = [rate, ch, fmt + ('-extensible' if extensible else '')]

def t(rate, seconds=None, frames=None):
    return np.arange(frames if frames is not None else int(round(rate * seconds))) / rate

# 16 kHz, no resampling: tones, noise and a stretch of hard zeros (the log floor).
x = t(16000, 2.5)
sig = 0.3 * np.sin(2 * np.pi * 440 * x) + 0.2 * np.sin(2 * np.pi * 3150 * x) * (x > 1) + 0.05 * rng.standard_normal(x.size)
sig[8000:12000] = 0
write_wav('tones-16k-s16.wav', sig[:, None], 16000, 's16')
# 44.1 kHz stereo float: a logarithmic chirp 50 Hz → 20 kHz on the left (past the 8 kHz band: the
# resampler's anti-aliasing shows), noise on the right.
x = t(44100, 4.0)
chirp = 0.5 * np.sin(2 * np.pi * 50 * 4.0 / np.log(400) * (np.power(400, x / 4.0) - 1))
write_wav('chirp-44k1-stereo-f32.wav', np.stack([chirp, 0.1 * rng.standard_normal(x.size)], 1), 44100, 'f32')
# 8 kHz, 0.3 s: bursts of a vowel-like harmonic stack.
x = t(8000, 0.3)
f0 = 120 + 30 * np.sin(2 * np.pi * 3 * x)
voice = sum(np.sin(2 * np.pi * k * np.cumsum(f0) / 8000) / k for k in range(1, 12)) * (np.sin(2 * np.pi * 5 * x) > -0.3)
write_wav('short-8k-s16.wav', 0.2 * voice[:, None], 8000, 's16')
# 48 kHz, 3 channels, 24-bit extensible, a length that is not a multiple of anything.
x = t(48000, frames=81_517)
write_wav('tones-48k-3ch-s24.wav', np.stack([0.4 * np.sin(2 * np.pi * 220 * x), 0.3 * np.sin(2 * np.pi * 1800 * x), 0.05 * rng.standard_normal(x.size)], 1), 48000, 's24', extensible=True)
# 11.025 kHz unsigned 8-bit.
x = t(11025, 1.1)
write_wav('sweep-11k025-u8.wav', (0.6 * np.sin(2 * np.pi * (200 + 1500 * x) * x))[:, None], 11025, 'u8')
# Exactly the maximum: 480,000 samples at 16 kHz (30 s), float.
x = t(16000, frames=480_000)
write_wav('max-30s-16k-f32.wav', (0.3 * np.sin(2 * np.pi * 700 * x) * np.sin(2 * np.pi * 0.5 * x) + 0.02 * rng.standard_normal(x.size))[:, None], 16000, 'f32')
# Refused: one sample over the maximum (decoded, then refused), two minutes at 8 kHz (refused from
# the header, before decoding), 100 samples (no full frame).
write_wav('over-max-16k-s16.wav', 0.1 * rng.standard_normal((480_001, 1)), 16000, 's16')
write_wav('long-2min-8k-s16.wav', 0.1 * rng.standard_normal((960_000, 1)), 8000, 's16')
write_wav('tiny-100-16k-s16.wav', 0.1 * rng.standard_normal((100, 1)), 16000, 's16')
print(json.dumps(files))
`;

// The reference for each file: <name>.hf.bin (features), .hf.mask (one byte per frame), .hf.samples
// (the mono 16 kHz clip given to the extractor), and the median wall time of reference_features (read +
// downmix + resample + extract) over 5 runs. Prints {name: {frames, valid, samples, ms}}.
const REF = String.raw`
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import audio_features as af
config = af.load_config(sys.argv[2])
res = {}
for f in json.loads(sys.argv[3]):
    samples = af.reference_samples(f, config)
    feats, mask = af.extract(samples, config, f)
    feats.astype('<f4').tofile(f + '.hf.bin')
    mask.astype(np.uint8).tofile(f + '.hf.mask')
    samples.astype('<f4').tofile(f + '.hf.samples')
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        af.reference_features(f, config)
        times.append((time.perf_counter() - t0) * 1000)
    res[os.path.basename(f)] = {'frames': int(feats.shape[0]), 'valid': int(mask.sum()), 'samples': len(samples), 'ms': sorted(times)[2]}
print(json.dumps(res))
`;

// Gemma-4's feature extractor as its preprocessor_config.json spells it (HF's defaults).
const PREPROCESSOR = {
  feature_extractor: {
    feature_extractor_type: 'Gemma4AudioFeatureExtractor',
    feature_size: 128,
    sampling_rate: 16000,
    padding_value: 0.0,
    return_attention_mask: true,
    frame_length_ms: 20.0,
    hop_length_ms: 10.0,
    min_frequency: 0.0,
    max_frequency: 8000.0,
    preemphasis: 0.0,
    preemphasis_htk_flavor: true,
    fft_overdrive: false,
    dither: 0.0,
    input_scale_factor: 1.0,
    mel_floor: 0.001,
    per_bin_mean: null,
    per_bin_stddev: null,
  },
};

interface Ref { frames: number; valid: number; samples: number; ms: number }
interface Qhx { frames: number; mel_bins: number; valid_frames: number; samples: number; source: { rate: number; channels: number; frames: number }; timings: Record<string, number> }

function floats(path: string): Float32Array {
  const b = readFileSync(path);
  return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4);
}

function compare(a: Float32Array, b: Float32Array) {
  let max = 0, sum = 0, dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (d > max) max = d;
    sum += d;
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return { maxAbs: max, meanAbs: sum / a.length, cosine: dot / Math.sqrt(na * nb) };
}

describe('audio input: qhx_features against HF\'s Gemma4AudioFeatureExtractor (oracles/audio_features.py)', () => {
  const root = mkdtempSync(join(tmpdir(), 'forge-audio-input-'));
  const config = join(root, 'preprocessor_config.json');
  let qhxFeatures = '';
  let files: Record<string, [number, number, string]> = {};
  let refs: Record<string, Ref> = {};
  const refused = ['over-max-16k-s16.wav', 'long-2min-8k-s16.wav', 'tiny-100-16k-s16.wav'];

  const features = (file: string, extra: string[] = []) =>
    runOwned(qhxFeatures, [file, '--config', config, '--out', `${file}.qhx.bin`, '--mask-out', `${file}.qhx.mask`, '--json', ...extra]);

  beforeAll(async () => {
    await ensureDebianPackages({ 'espeak-ng': 'espeak-ng' }, (m) => process.stderr.write(`${m}\n`));
    qhxFeatures = join((await ensureNative()).buildDir, 'qhx_features');
    writeFileSync(config, JSON.stringify(PREPROCESSOR, null, 1));
    writeFileSync(join(root, 'gen.py'), GEN);
    writeFileSync(join(root, 'ref.py'), REF);
    const speech = await runOwned('espeak-ng', ['-w', join(root, 'speech-22k-s16.wav'), 'Forge turns a checkpoint into a bundle for the phone, and proves every step against the reference. The quick brown fox jumps over the lazy dog.']);
    expect(speech.exitCode, speech.stderr).toBe(0);
    files = JSON.parse((await runPython(join(root, 'gen.py'), [root])).stdout);
    files['speech-22k-s16.wav'] = [22050, 1, 's16'];
    for (const r of refused) delete files[r];
    const paths = Object.keys(files).map((n) => join(root, n));
    refs = JSON.parse((await runPython(join(root, 'ref.py'), [resolve('oracles'), config, JSON.stringify(paths)])).stdout);
  }, 900_000);

  afterAll(() => rmSync(root, { recursive: true, force: true }));

  it('has the cases it was written for', () => {
    expect(Object.keys(files).sort()).toEqual([
      'chirp-44k1-stereo-f32.wav', 'max-30s-16k-f32.wav', 'short-8k-s16.wav', 'speech-22k-s16.wav', 'sweep-11k025-u8.wav', 'tones-16k-s16.wav', 'tones-48k-3ch-s24.wav',
    ]);
    // 30 s: (480000 + 160 − 321) // 160 + 1 frames, every one of them whole.
    expect([refs['max-30s-16k-f32.wav'].frames, refs['max-30s-16k-f32.wav'].valid]).toEqual([2999, 2999]);
    expect(refs['speech-22k-s16.wav'].samples).toBeGreaterThan(16000 * 3); // espeak said the sentences
  });

  it('matches HF on every file: the same samples, features within a float32 step, the same mask', async () => {
    const rows: string[] = [];
    for (const [name, [rate, channels, format]] of Object.entries(files)) {
      const file = join(root, name);
      const r = await features(file, ['--samples-out', `${file}.qhx.samples`]);
      expect(r.exitCode, `${name}: ${r.stderr}`).toBe(0);
      const j = JSON.parse(r.stdout) as Qhx;
      const ref = refs[name];
      expect([j.frames, j.mel_bins, j.valid_frames, j.samples], name).toEqual([ref.frames, 128, ref.valid, ref.samples]);
      expect([j.source.rate, j.source.channels], name).toEqual([rate, channels]);
      // The clip given to the extractor: bit-identical (libsndfile's scale, the float32 mean, libsoxr).
      expect(compare(floats(`${file}.qhx.samples`), floats(`${file}.hf.samples`)).maxAbs, `${name}: samples`).toBe(0);
      expect(readFileSync(`${file}.qhx.mask`).equals(readFileSync(`${file}.hf.mask`)), `${name}: mask`).toBe(true);
      const ours = floats(`${file}.qhx.bin`);
      const hf = floats(`${file}.hf.bin`);
      expect(ours.length, name).toBe(ref.frames * 128);
      const m = compare(ours, hf);
      rows.push(`${name.padEnd(27)} ${String(rate).padStart(5)} Hz x${channels} ${format.padEnd(14)} ${String(ref.frames).padStart(4)} frames  max ${m.maxAbs.toExponential(2)} mean ${m.meanAbs.toExponential(2)} cos ${m.cosine.toFixed(13)}`);
      expect(m.maxAbs, name).toBeLessThanOrEqual(BOUNDS.maxAbs);
      expect(m.meanAbs, name).toBeLessThanOrEqual(BOUNDS.meanAbs);
      expect(m.cosine, name).toBeGreaterThanOrEqual(BOUNDS.cosine);
    }
    console.log(`[measured] qhx_features vs HF (max abs, mean abs, cosine):\n${rows.join('\n')}`);
  }, 600_000);

  it('times each file against HF\'s path (read + downmix + resample + extractor, in Python)', async () => {
    const rows: string[] = [];
    for (const name of Object.keys(files)) {
      const runs: number[] = [];
      for (let i = 0; i < 5; i++) {
        const r = await features(join(root, name));
        expect(r.exitCode, r.stderr).toBe(0);
        const t = (JSON.parse(r.stdout) as Qhx).timings;
        runs.push(t.decode_ms + t.resample_ms + t.features_ms);
      }
      const ours = runs.sort((a, b) => a - b)[2];
      expect(ours).toBeGreaterThan(0);
      rows.push(`${name.padEnd(27)} qhx_features ${ours.toFixed(2).padStart(7)} ms  HF ${refs[name].ms.toFixed(2).padStart(7)} ms  HF/ours ${(refs[name].ms / ours).toFixed(1)}x`);
    }
    console.log(`[measured] median of 5, in-process time (no process start, no Python import):\n${rows.join('\n')}`);
  }, 300_000);

  it('refuses, in one line naming the file, what it cannot use', async () => {
    const missing = join(root, 'missing.wav');
    const text = join(root, 'notes.wav');
    writeFileSync(text, 'not audio\n');
    const empty = join(root, 'empty.wav');
    writeFileSync(empty, '');
    const dir = join(root, 'a-directory.wav');
    mkdirSync(dir);
    for (const [file, why] of [
      [missing, /cannot open audio: No such file or directory$/],
      [dir, /cannot open audio: it is a directory$/],
      [text, /not audio that libsndfile can decode \(Format not recognised\.\)$/],
      [empty, /the file is empty, not audio$/],
      [join(root, 'over-max-16k-s16.wav'), /audio is 30\.000 s \(480001 samples at 16000 Hz\), longer than the maximum of 30\.000 s \(480000 samples at 16000 Hz\)$/],
      [join(root, 'long-2min-8k-s16.wav'), /audio is 120\.000 s, longer than the maximum of 30\.000 s \(480000 samples at 16000 Hz\)$/],
      [join(root, 'tiny-100-16k-s16.wav'), /audio is 0\.006 s \(100 samples at 16000 Hz\), too short for one full frame \(at least 161 samples\)$/],
    ] as const) {
      const r = await features(file);
      expect(r.exitCode, file).toBe(1);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toContain(`qhx_features: error: ${file}: `);
      expect(r.stderr.trim()).toMatch(why);
    }
    // The reference refuses the clip over the maximum too (HF itself would truncate it).
    await expect(runPython(resolve('oracles/audio_features.py'), ['--config', config, '--audio', join(root, 'over-max-16k-s16.wav'), '--out', join(root, 'x.bin')])).rejects.toThrow(
      /longer than the maximum of 480000/,
    );
    writeFileSync(join(root, 'dither.json'), JSON.stringify({ feature_extractor: { ...PREPROCESSOR.feature_extractor, dither: 1e-4 } }));
    const bad = await runOwned(qhxFeatures, [join(root, 'tones-16k-s16.wav'), '--config', join(root, 'dither.json'), '--out', join(root, 'x.bin')]);
    expect(bad.exitCode).toBe(1);
    expect(bad.stderr.trim()).toBe(`qhx_features: error: ${join(root, 'dither.json')}: audio config: dither 0.000100 adds random noise (HF's np.random); only 0 is reproducible`);
  }, 120_000);

  it('oracles/audio_features.py\'s command line gives what its reference_features gives', async () => {
    const file = join(root, 'chirp-44k1-stereo-f32.wav');
    const r = await runPython(resolve('oracles/audio_features.py'), ['--config', config, '--audio', file, '--out', join(root, 'cli.bin'), '--mask-out', join(root, 'cli.mask')]);
    const ref = refs['chirp-44k1-stereo-f32.wav'];
    expect(JSON.parse(r.stdout)).toEqual({ frames: ref.frames, mel_bins: 128, valid_frames: ref.valid, samples: ref.samples });
    expect(compare(floats(join(root, 'cli.bin')), floats(`${file}.hf.bin`)).maxAbs).toBe(0);
    expect(readFileSync(join(root, 'cli.mask')).equals(readFileSync(`${file}.hf.mask`))).toBe(true);
  }, 120_000);
});
