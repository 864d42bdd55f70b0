"""A Gemma 4 audio input of trace.py: HF's features for a clip padded to the recipe's budget, the
prompt ids with the clip's audio tokens, and trace.json's record of it.

gemma4_audio_prompt(model_dir, config, tok, path, text, max_seconds) -> (media, ids, record):
  media   {"audio": {"input_features" [1, F, mel] float32, "input_features_mask" [1, F] bool}}, what
          trace_families.steps_gemma4 takes; F is the frame count of a clip of max_seconds: the clip
          goes through audio_features.reference_samples (WAV read, downmix, resample) and
          Gemma4AudioFeatureExtractor with padding to max_seconds (zero features, mask 0 past the
          clip, as the extractor pads a batch), so the features are what the encoder graph, compiled
          for that many frames, takes. A clip longer than max_seconds is a ValueError naming the file.
  ids     the text's ids with the clip's block after its BOS: <start_of_audio>, one audio token per
          soft token, <end_of_audio>; the count is Gemma4Processor's (its mask through the two
          stride-2 subsampling convs, counted), which is the tower's output mask.
  record  {file, sha256, frames (F), valid_frames (the clip's own), tokens, start (first audio token)}.
The extractor's settings are the checkpoint's preprocessor_config.json's when it has one, else HF's
defaults (16 kHz, 10 ms hop).
"""
import hashlib
import json
import os

import torch

from audio_features import Gemma4AudioFeatureExtractor, extractor_kwargs, reference_samples


def extractor_config(model_dir):
    path = os.path.join(model_dir, "preprocessor_config.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        j = json.load(f)
    return j.get("feature_extractor", j)


def processor_tokens(mask):
    """Gemma4Processor's audio token count: the frame mask through two stride-2, kernel-3, pad-1
    convs (each keeps every other frame of the first (t - 1) // 2 + 1), then its valid entries."""
    m = mask
    for _ in range(2):
        m = m[::2][:(len(m) - 1) // 2 + 1]
    return int(m.sum())


def gemma4_audio_prompt(model_dir, config, tok, path, text, max_seconds):
    fc = extractor_config(model_dir)
    samples = reference_samples(path, fc)
    fe = Gemma4AudioFeatureExtractor(**extractor_kwargs(fc))
    budget = int(max_seconds * fe.sampling_rate + 0.5)
    name = os.path.basename(path)
    if len(samples) > budget:
        raise ValueError(f"{name}: the clip is {len(samples) / fe.sampling_rate:.3f} s ({len(samples)} samples at "
                         f"{fe.sampling_rate} Hz), longer than the recipe's audio budget of {max_seconds:g} s "
                         f"(arch setting audio.maxSeconds)")
    out = fe([samples], padding="max_length", max_length=budget, truncation=False,
             pad_to_multiple_of=fc.get("pad_to_multiple_of", 128), return_tensors="np")
    features = torch.from_numpy(out["input_features"]).to(torch.float32).contiguous()
    mask = torch.from_numpy(out["input_features_mask"]).to(torch.bool).contiguous()
    n = processor_tokens(mask[0].numpy())
    if n == 0:
        raise ValueError(f"{name}: the clip is too short for one audio token ({len(samples)} samples)")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    text_ids = tok(text)["input_ids"]
    head = text_ids[:1] if text_ids and text_ids[0] == tok.bos_token_id else []
    ids = head + [config.boa_token_id] + [config.audio_token_id] * n + [config.eoa_token_index] + text_ids[len(head):]
    record = {"file": name, "sha256": digest, "frames": int(mask.shape[1]), "valid_frames": int(mask.sum()),
              "tokens": n, "start": ids.index(config.audio_token_id)}
    return {"audio": {"input_features": features, "input_features_mask": mask}}, ids, record
