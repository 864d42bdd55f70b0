#!/usr/bin/env python3
"""Audio clips made by code for the audio twins' gates: spectrally different, deterministic, short.

    python oracles/twin_audio.py --out DIR        # writes the test clips, prints their names

Each clip is synthesised with numpy (no recording, no speech synthesiser, no file read) and written
as 16 kHz mono 16-bit PCM WAV with Python's wave module, so the same call gives the same bytes.
TEST_CLIPS is the fixed set the recipes name (gates.audioPrompts' "made"): each under 2 s, of
different lengths (so their audio token counts differ), and with their energy in different bands:
  low-tones.wav    1.2 s  a pattern of low tones (220, 330, 165 Hz) in 0.2 s notes with soft edges
  noise-burst.wav  0.7 s  three bursts of high-passed noise (energy above ~3 kHz) with gaps between
  chirp.wav        1.6 s  a rising sweep, 300 Hz to 6 kHz, exponential in frequency
"""
import argparse
import json
import os
import wave

import numpy as np

RATE = 16_000


def low_tones():
    notes = [220.0, 330.0, 165.0, 220.0, 330.0, 165.0]
    note = int(0.2 * RATE)
    t = np.arange(note) / RATE
    edge = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.02)  # 20 ms fades: no clicks between notes
    return np.concatenate([0.5 * np.sin(2 * np.pi * f * t) * edge for f in notes])


def noise_burst():
    rng = np.random.default_rng(20261129)
    n = int(0.7 * RATE)
    x = rng.standard_normal(n)
    # Second differences: a high-pass (gain ~0 at DC, 4 at Nyquist), then three bursts.
    x = np.concatenate([[0.0, 0.0], np.diff(x, 2)]) / 4
    gate = np.zeros(n)
    for start in (0.0, 0.25, 0.5):
        gate[int(start * RATE):int((start + 0.15) * RATE)] = 1.0
    return 0.6 * x * gate


def chirp():
    n = int(1.6 * RATE)
    t = np.arange(n) / RATE
    f0, f1, d = 300.0, 6000.0, n / RATE
    k = np.log(f1 / f0) / d
    phase = 2 * np.pi * f0 * (np.exp(k * t) - 1) / k
    return 0.4 * np.sin(phase)


TEST_CLIPS = {"low-tones.wav": low_tones, "noise-burst.wav": noise_burst, "chirp.wav": chirp}


def write_wav(path, x):
    pcm = np.clip(np.round(x * 32767), -32768, 32767).astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)
    for name, make in TEST_CLIPS.items():
        write_wav(os.path.join(out, name), make())
    print(json.dumps(sorted(TEST_CLIPS)))


if __name__ == "__main__":
    main()
