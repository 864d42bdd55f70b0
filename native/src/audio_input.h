// Host pre-processing of an audio file for the Gemma-4 audio encoder: a WAV/FLAC/OGG/... file →
// mono float32 (channels averaged) → resampled to the extractor's rate with libsoxr (HQ, as
// librosa.load and python-soxr do) → transformers' Gemma4AudioFeatureExtractor: zeros to a multiple
// of `pad_to_multiple_of` samples, `frame_length / 2` zeros in front (semicausal), periodic-Hann frames
// of 20 ms every 10 ms, |rFFT| over `fft_length`, an HTK mel filter bank without normalisation,
// log(mel + mel_floor), frames that reach into the padding zeroed and masked out.
//
// Checked against HF's extractor on the same file (test/audio-input.test.ts, oracles/audio_features.py;
// native/README.md, "Audio input"). Decoding is libsndfile, resampling libsoxr, the FFT KissFFT
// (kissfft.hh, in double precision); audio_input.cpp says what each step matches and why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace forge {

// The feature extractor's fields (preprocessor_config.json's "feature_extractor", names as HF's) and
// its call's padding arguments; the defaults are Gemma4AudioFeatureExtractor's.
struct AudioFrontEndConfig {
  int sampling_rate = 16000;      // Hz; the file is resampled to it when it has another rate
  int feature_size = 128;         // mel bins
  double frame_length_ms = 20.0;  // → frame_length = round(rate · ms / 1000) samples (320)
  double hop_length_ms = 10.0;    // → hop_length (160)
  double min_frequency = 0.0, max_frequency = 8000.0;  // Hz, the mel filter bank's span
  double mel_floor = 1e-3;        // log(mel + mel_floor)
  double preemphasis = 0.0;
  bool preemphasis_htk_flavor = true;
  bool fft_overdrive = false;     // fft_length = next power of two ≥ frame_length, doubled if set
  double dither = 0.0;            // must be 0: HF's dither is random noise, nothing can match it
  double input_scale_factor = 1.0;
  std::vector<double> per_bin_mean, per_bin_stddev;  // empty, or feature_size values each
  // The extractor's __call__ arguments (HF's defaults): a clip longer than max_length samples (after
  // resampling; rounded up to a multiple of pad_to_multiple_of, as HF's truncation rounds it) is
  // refused, not truncated, so no audio is dropped silently. 0 = no limit.
  int64_t max_length = 480000;
  int pad_to_multiple_of = 128;
};

// Reads the fields above from a feature extractor's JSON (preprocessor_config.json's
// "feature_extractor" object, or the file itself when it is the extractor's own config); absent
// fields keep their defaults. `what` names the source in errors. Validates (validate_audio_config).
AudioFrontEndConfig audio_config_from_json(const nlohmann::json& j, const std::string& what);

// Throws std::runtime_error("audio config: ...") for a value the extractor cannot use: a rate,
// size, frame or hop that is not positive, a frequency span that is not 0 ≤ min ≤ max, a mel floor
// that is not positive, a dither that is not 0, per-bin statistics of the wrong length or a zero
// standard deviation, a negative max_length or pad_to_multiple_of < 1.
void validate_audio_config(const AudioFrontEndConfig& config);

// features: float32 [frames, mel_bins] row-major (log-mel; 0 in masked frames); mask: one byte per
// frame, 1 where the frame's analysis window holds only real audio (HF's input_features_mask).
struct AudioFeatures {
  std::vector<float> data;
  std::vector<uint8_t> mask;
  int64_t frames = 0;
  int mel_bins = 0;
  int64_t valid_frames = 0;       // frames whose mask is 1
  int64_t samples = 0;            // mono samples at sampling_rate, before padding
  int source_rate = 0, source_channels = 0;
  int64_t source_frames = 0;      // sample frames in the file
  double decode_ms = 0, resample_ms = 0, features_ms = 0;  // wall time of each step (0: skipped)
};

// The whole pipeline. Throws std::runtime_error naming the file: missing or unreadable, not audio
// libsndfile can decode, empty (no samples), longer than max_length, too short for one full frame.
AudioFeatures load_audio_features(const std::string& path, const AudioFrontEndConfig& config);

// The steps, for tests and for callers that have samples already.

struct DecodedAudio {
  std::vector<float> mono;  // channels averaged, libsndfile's float scale (16-bit: x / 32768)
  int rate = 0, channels = 0;
};

// Decodes with libsndfile and averages the channels. Refuses a missing, unreadable, empty or
// non-audio file, naming it.
DecodedAudio decode_audio(const std::string& path);

// libsoxr at HQ quality (float32 in and out, one channel), the whole clip at once and flushed:
// the samples python-soxr's resample(x, from, to, 'HQ') gives, and librosa.load(sr=to) by default.
// The same rate returns a copy.
std::vector<float> resample_audio(const std::vector<float>& samples, int from_rate, int to_rate);

// HF's extractor on mono samples at config.sampling_rate (validated); timings left 0. Refuses a
// clip over the limit or one with no full frame; `what` names it in errors.
AudioFeatures log_mel_features(const std::vector<float>& samples, const AudioFrontEndConfig& config,
                               const std::string& what);

// HF's mel_filter_bank(fft_length / 2 + 1, feature_size, min, max, rate, norm=None, mel_scale="htk"):
// [fft_length / 2 + 1, feature_size] row-major, float64.
std::vector<double> htk_mel_filter_bank(const AudioFrontEndConfig& config);

}  // namespace forge
