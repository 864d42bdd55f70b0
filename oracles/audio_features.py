#!/usr/bin/env python3
"""HF's Gemma-4 audio features for one WAV file: the reference for forge's C++ front-end
(native/src/audio_input.cpp: decode, downmix, resample, log-mel).

    python oracles/audio_features.py --config preprocessor_config.json --audio FILE.wav --out FILE.bin
                                     [--mask-out FILE.bin]

reference_features(path, extractor_config) -> (features float32 [frames, mel_bins], mask bool [frames]):
  1. the WAV file is read (read_wav: PCM 8/16/24/32-bit, IEEE float 32/64, plain or
     WAVE_FORMAT_EXTENSIBLE) as float32 on the usual scale (signed integers over 2^(bits-1), 8-bit
     (x - 128) / 128), and its channels averaged (numpy's float32 mean, as librosa's to_mono);
  2. a clip not at the extractor's sampling_rate is resampled with python-soxr at HQ
     (soxr.resample(x, rate, sampling_rate, "HQ")): what librosa.load(path, sr=sampling_rate) does by
     default (res_type "soxr_hq"), i.e. what the HF ecosystem feeds the extractor;
  3. transformers' Gemma4AudioFeatureExtractor(**extractor_config) on the clip, with its call's
     defaults (padding to a multiple of 128 samples, max_length 480000), unless extractor_config
     carries max_length / pad_to_multiple_of. A clip longer than max_length is a ValueError naming the
     file (HF would truncate it; forge refuses, so no audio is dropped silently).
extractor_config is the feature extractor's dict (preprocessor_config.json's "feature_extractor", or
the extractor's own config); keys the extractor does not take (processor_class, ...) are ignored.
The CLI writes the features as raw little-endian float32 (row-major), the mask as one byte per frame,
and prints one JSON line {"frames", "mel_bins", "valid_frames", "samples"}.
"""
import argparse
import inspect
import json
import os
import struct
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor  # noqa: E402

WAVE_FORMAT_PCM, WAVE_FORMAT_IEEE_FLOAT, WAVE_FORMAT_EXTENSIBLE = 1, 3, 0xFFFE
CALL_KEYS = ("max_length", "pad_to_multiple_of")


def read_wav(path):
    """(samples float32 [frames, channels], rate) of a RIFF/WAVE file; ValueError naming the file for
    anything else. Python's wave module reads integer PCM only (not float, not extensible in 3.11)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(f"{path}: not a RIFF/WAVE file")
    fmt = body = None
    pos = 12
    while pos + 8 <= len(data):
        cid, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        chunk = data[pos + 8:pos + 8 + size]
        if cid == b"fmt ":
            fmt = chunk
        elif cid == b"data":
            body = chunk
        pos += 8 + size + (size & 1)
    if fmt is None or body is None:
        raise ValueError(f"{path}: no fmt or data chunk")
    tag, channels, rate, _, block, bits = struct.unpack("<HHIIHH", fmt[:16])
    if tag == WAVE_FORMAT_EXTENSIBLE:
        tag = struct.unpack("<H", fmt[24:26])[0]  # the sub-format GUID's first two bytes
    width = bits // 8
    frames = len(body) // block
    raw = np.frombuffer(body[:frames * block], dtype=np.uint8).reshape(frames, channels, block // channels)[..., :width]
    if tag == WAVE_FORMAT_IEEE_FLOAT and bits in (32, 64):
        x = raw.copy().view("<f4" if bits == 32 else "<f8")[..., 0].astype(np.float32)
    elif tag == WAVE_FORMAT_PCM and bits == 8:
        x = (raw[..., 0].astype(np.float32) - 128) / 128
    elif tag == WAVE_FORMAT_PCM and bits in (16, 24, 32):
        # little-endian two's complement, widened to int32 by placing the bytes at the top
        wide = np.zeros((frames, channels, 4), np.uint8)
        wide[..., 4 - width:] = raw
        x = (wide.view("<i4")[..., 0].astype(np.float64) / 2.0**31).astype(np.float32)
    else:
        raise ValueError(f"{path}: WAV format tag {tag} with {bits}-bit samples is not read here")
    return x, rate


def extractor_kwargs(extractor_config):
    accepted = inspect.signature(Gemma4AudioFeatureExtractor.__init__).parameters
    return {k: v for k, v in extractor_config.items() if k in accepted and k not in ("self", "kwargs")}


def resample(mono, rate, sampling_rate):
    if rate == sampling_rate:
        return mono
    try:
        import soxr  # python-soxr: libsoxr, as librosa.load resamples by default
    except ImportError:
        raise ImportError("python-soxr is not installed in this venv (oracles/requirements.txt pins soxr)") from None

    return soxr.resample(mono, rate, sampling_rate, "HQ").astype(np.float32)


def reference_samples(path, extractor_config):
    """The mono float32 clip at the extractor's rate that the extractor is given (steps 1 and 2)."""
    x, rate = read_wav(path)
    if x.shape[0] == 0:
        raise ValueError(f"{path}: the audio has no samples")
    mono = x.mean(axis=1, dtype=np.float32) if x.shape[1] > 1 else x[:, 0]
    return resample(np.ascontiguousarray(mono, dtype=np.float32), rate, extractor_config.get("sampling_rate", 16000))


def extract(samples, extractor_config, what):
    """Gemma4AudioFeatureExtractor on a mono float32 clip already at its rate (step 3)."""
    fe = Gemma4AudioFeatureExtractor(**extractor_kwargs(extractor_config))
    call = {k: extractor_config[k] for k in CALL_KEYS if k in extractor_config}
    max_length, multiple = call.get("max_length", 480_000), call.get("pad_to_multiple_of", 128)
    if max_length:
        limit = -(-max_length // multiple) * multiple
        if len(samples) > limit:
            raise ValueError(f"{what}: audio is {len(samples)} samples at {fe.sampling_rate} Hz, longer than the maximum of {limit}")
    # a batch of one: the extractor fails on a bare 1-D array in transformers 5.23 (squeeze(0) of
    # [n, 1]); HF's processor always passes a list
    out = fe([samples], return_tensors="np", **call)
    return out["input_features"][0].astype(np.float32), out["input_features_mask"][0].astype(bool)


def reference_features(path, extractor_config):
    """(features float32 [frames, mel_bins], mask bool [frames]) for the file, as the module docstring says."""
    return extract(reference_samples(path, extractor_config), extractor_config, path)


def load_config(path):
    with open(path) as f:
        j = json.load(f)
    return j.get("feature_extractor", j)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="preprocessor_config.json (or the feature extractor's JSON)")
    ap.add_argument("--audio", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mask-out")
    a = ap.parse_args()
    config = load_config(a.config)
    try:
        samples = reference_samples(a.audio, config)
        feats, mask = extract(samples, config, a.audio)
    except ValueError as e:
        print(f"audio_features.py: error: {e}", file=sys.stderr)
        return 1
    feats.astype("<f4").tofile(a.out)
    if a.mask_out:
        mask.astype(np.uint8).tofile(a.mask_out)
    print(json.dumps({"frames": int(feats.shape[0]), "mel_bins": int(feats.shape[1]), "valid_frames": int(mask.sum()), "samples": len(samples)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
