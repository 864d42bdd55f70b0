// Audio pre-processing for the Gemma-4 audio encoder (audio_input.h). What each step does and why:
//
// Decode — libsndfile (Debian libsndfile1-dev): WAV (PCM 8/16/24/32-bit, float, extensible), FLAC,
// OGG/Vorbis, AIFF, ... read as float with its default scale (integer samples over 2^(bits−1), as
// soundfile and librosa give them), channels averaged in double and stored as float32 (for two
// channels that is numpy's float32 mean exactly).
//
// Resample — libsoxr (libsoxr-dev) at SOXR_HQ, float32 in and out: what librosa.load(sr=16000) does
// by default (res_type "soxr_hq", through python-soxr, which wraps the same library), so a clip that
// is not at 16 kHz gets the samples the HF ecosystem feeds its extractor. The whole clip is processed
// and flushed; the output is capped at ⌊n · to / from⌋ + 1 samples as python-soxr caps it.
//
// Features — transformers' Gemma4AudioFeatureExtractor._extract_spectrogram step by step, in the
// precision HF uses for each: the waveform, pre-emphasis and window product in float32 (HF's arrays
// are float32), the FFT in double (KissFFT's C++ header, kissfft.hh; HF's numpy rfft runs in float32
// on float32 frames, so HF is the less exact side), the mel product, log and per-bin statistics in
// float64 (HF's mel matrix is float64), the result rounded to float32. The mel filter bank is HF's
// mel_filter_bank (HTK scale, triangles in Hz, no normalisation) computed with the same formulas and
// numpy's linspace arithmetic; the window numpy's hanning(frame + 1)[:frame] (periodic Hann).
// Frames that reach into the padding are not computed: HF zeroes them (features · mask).
#include "audio_input.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include <sys/stat.h>

#include <kissfft/kissfft.hh>
#include <nlohmann/json.hpp>
#include <sndfile.h>
#include <soxr.h>

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

[[noreturn]] void fail(const std::string& path, const std::string& why) { throw std::runtime_error(path + ": " + why); }

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// The sizes HF derives from the config (Gemma4AudioFeatureExtractor.__init__): Python's round() is
// half-to-even, as nearbyint in the default rounding mode.
struct Derived {
  int frame_length, hop_length, fft_length;
  int64_t limit;  // max_length rounded up to a multiple of pad_to_multiple_of; 0 = none
};

Derived derive(const AudioFrontEndConfig& c) {
  Derived d;
  d.frame_length = static_cast<int>(std::nearbyint(c.sampling_rate * c.frame_length_ms / 1000.0));
  d.hop_length = static_cast<int>(std::nearbyint(c.sampling_rate * c.hop_length_ms / 1000.0));
  d.fft_length = 1;
  while (d.fft_length < d.frame_length) d.fft_length *= 2;
  if (c.fft_overdrive) d.fft_length *= 2;
  const int64_t m = c.pad_to_multiple_of;
  d.limit = c.max_length > 0 ? (c.max_length + m - 1) / m * m : 0;
  return d;
}

std::string describe_length(int64_t samples, int rate) {
  return fixed(double(samples) / rate, 3) + " s (" + std::to_string(samples) + " samples at " + std::to_string(rate) + " Hz)";
}

struct SndfileCloser {
  void operator()(SNDFILE* f) const { sf_close(f); }
};

// libsndfile decode; refuses a clip whose length at `rate` would clearly pass `limit` (0: none)
// before reading it, so an hour of audio is not decoded only to be refused.
DecodedAudio decode_checked(const std::string& path, int rate, int64_t limit) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) fail(path, std::string("cannot open audio: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail(path, "cannot open audio: it is a directory");
  if (st.st_size == 0) fail(path, "the file is empty, not audio");
  SF_INFO info;
  std::memset(&info, 0, sizeof info);
  std::unique_ptr<SNDFILE, SndfileCloser> f(sf_open(path.c_str(), SFM_READ, &info));
  if (!f) fail(path, std::string("not audio that libsndfile can decode (") + sf_strerror(nullptr) + ")");
  if (info.channels < 1 || info.samplerate < 1)
    fail(path, "audio header gives " + std::to_string(info.channels) + " channels at " + std::to_string(info.samplerate) + " Hz");
  if (info.frames <= 0) fail(path, "the audio has no samples");
  if (limit > 0 && rate > 0 && double(info.frames) * rate / info.samplerate > double(limit) + 16)
    fail(path, "audio is " + fixed(double(info.frames) / info.samplerate, 3) + " s, longer than the maximum of " +
                   describe_length(limit, rate));
  DecodedAudio out;
  out.rate = info.samplerate;
  out.channels = info.channels;
  out.mono.reserve(static_cast<size_t>(info.frames));
  const int ch = info.channels;
  std::vector<float> block(size_t(4096) * ch);
  while (true) {
    const sf_count_t got = sf_readf_float(f.get(), block.data(), 4096);
    if (got < 0) fail(path, std::string("cannot decode audio: ") + sf_strerror(f.get()));
    if (got == 0) break;
    for (sf_count_t i = 0; i < got; i++) {
      if (ch == 1) {
        out.mono.push_back(block[size_t(i)]);
        continue;
      }
      double sum = 0;
      for (int c = 0; c < ch; c++) sum += block[size_t(i) * ch + c];
      out.mono.push_back(static_cast<float>(sum / ch));
    }
  }
  if (sf_error(f.get()) != SF_ERR_NO_ERROR) fail(path, std::string("cannot decode audio: ") + sf_strerror(f.get()));
  if (out.mono.empty()) fail(path, "the audio has no samples");
  return out;
}

bool finite(double v) { return std::isfinite(v); }

}  // namespace

void validate_audio_config(const AudioFrontEndConfig& c) {
  auto bad = [](const std::string& why) { throw std::runtime_error("audio config: " + why); };
  if (c.sampling_rate <= 0) bad("sampling_rate " + std::to_string(c.sampling_rate) + " must be positive");
  if (c.feature_size <= 0) bad("feature_size " + std::to_string(c.feature_size) + " must be positive");
  if (!finite(c.frame_length_ms) || !finite(c.hop_length_ms)) bad("frame_length_ms and hop_length_ms must be finite");
  const Derived d = derive(c);
  if (d.frame_length < 2) bad("frame_length_ms " + fixed(c.frame_length_ms, 3) + " gives a frame of " + std::to_string(d.frame_length) + " samples");
  if (d.hop_length < 1) bad("hop_length_ms " + fixed(c.hop_length_ms, 3) + " gives a hop of " + std::to_string(d.hop_length) + " samples");
  if (!finite(c.min_frequency) || !finite(c.max_frequency) || c.min_frequency < 0 || c.min_frequency > c.max_frequency)
    bad("mel span " + fixed(c.min_frequency, 1) + ".." + fixed(c.max_frequency, 1) + " Hz must be finite, from 0 up");
  if (!finite(c.mel_floor) || c.mel_floor <= 0) bad("mel_floor must be positive");
  if (c.dither != 0) bad("dither " + std::to_string(c.dither) + " adds random noise (HF's np.random); only 0 is reproducible");
  if (!finite(c.preemphasis) || !finite(c.input_scale_factor)) bad("preemphasis and input_scale_factor must be finite");
  auto check_bins = [&](const std::vector<double>& v, const char* name, bool nonzero) {
    if (v.empty()) return;
    if (v.size() != size_t(c.feature_size))
      bad(std::string(name) + " has " + std::to_string(v.size()) + " values, want feature_size = " + std::to_string(c.feature_size));
    for (double x : v)
      if (!finite(x) || (nonzero && x == 0)) bad(std::string(name) + " has a value that is not finite" + (nonzero ? " or is 0" : ""));
  };
  check_bins(c.per_bin_mean, "per_bin_mean", false);
  check_bins(c.per_bin_stddev, "per_bin_stddev", true);
  if (c.max_length < 0) bad("max_length must be 0 (no limit) or positive");
  if (c.pad_to_multiple_of < 1) bad("pad_to_multiple_of must be at least 1");
}

AudioFrontEndConfig audio_config_from_json(const nlohmann::json& in, const std::string& what) {
  const nlohmann::json& j = in.contains("feature_extractor") ? in.at("feature_extractor") : in;
  if (!j.is_object()) throw std::runtime_error(what + ": the feature extractor config is not a JSON object");
  AudioFrontEndConfig c;
  auto num = [&](const char* key, auto& field) {
    if (!j.contains(key) || j.at(key).is_null()) return;
    if (!j.at(key).is_number()) throw std::runtime_error(what + ": " + key + " is not a number");
    field = j.at(key).get<std::remove_reference_t<decltype(field)>>();
  };
  auto flag = [&](const char* key, bool& field) {
    if (!j.contains(key) || j.at(key).is_null()) return;
    if (!j.at(key).is_boolean()) throw std::runtime_error(what + ": " + key + " is not true/false");
    field = j.at(key).get<bool>();
  };
  auto list = [&](const char* key, std::vector<double>& field) {
    if (!j.contains(key) || j.at(key).is_null()) return;
    if (!j.at(key).is_array()) throw std::runtime_error(what + ": " + key + " is not a list of numbers");
    for (const auto& v : j.at(key)) {
      if (!v.is_number()) throw std::runtime_error(what + ": " + key + " is not a list of numbers");
      field.push_back(v.get<double>());
    }
  };
  num("sampling_rate", c.sampling_rate);
  num("feature_size", c.feature_size);
  num("frame_length_ms", c.frame_length_ms);
  num("hop_length_ms", c.hop_length_ms);
  num("min_frequency", c.min_frequency);
  num("max_frequency", c.max_frequency);
  num("mel_floor", c.mel_floor);
  num("preemphasis", c.preemphasis);
  flag("preemphasis_htk_flavor", c.preemphasis_htk_flavor);
  flag("fft_overdrive", c.fft_overdrive);
  num("dither", c.dither);
  num("input_scale_factor", c.input_scale_factor);
  list("per_bin_mean", c.per_bin_mean);
  list("per_bin_stddev", c.per_bin_stddev);
  num("max_length", c.max_length);
  num("pad_to_multiple_of", c.pad_to_multiple_of);
  if (j.contains("padding_value") && j.at("padding_value").is_number() && j.at("padding_value").get<double>() != 0)
    throw std::runtime_error(what + ": padding_value must be 0 (the extractor's frame mask assumes silence)");
  try {
    validate_audio_config(c);
  } catch (const std::exception& e) {
    throw std::runtime_error(what + ": " + e.what());
  }
  return c;
}

std::vector<double> htk_mel_filter_bank(const AudioFrontEndConfig& c) {
  const Derived d = derive(c);
  const int bins = d.fft_length / 2 + 1, mels = c.feature_size;
  auto hz_to_mel = [](double f) { return 2595.0 * std::log10(1.0 + f / 700.0); };
  auto mel_to_hz = [](double m) { return 700.0 * (std::pow(10.0, m / 2595.0) - 1.0); };
  // numpy's linspace: start + i · ((stop − start) / (num − 1)), the last point set to stop.
  auto linspace = [](double start, double stop, int num) {
    std::vector<double> y(static_cast<size_t>(num));
    const double step = (stop - start) / (num - 1);
    for (int i = 0; i < num; i++) y[size_t(i)] = i * step + start;
    y[size_t(num) - 1] = stop;
    return y;
  };
  std::vector<double> filter_hz = linspace(hz_to_mel(c.min_frequency), hz_to_mel(c.max_frequency), mels + 2);
  for (double& f : filter_hz) f = mel_to_hz(f);
  const std::vector<double> fft_hz = linspace(0.0, double(c.sampling_rate / 2), bins);  // HF: sampling_rate // 2
  std::vector<double> w(static_cast<size_t>(bins) * mels);
  for (int k = 0; k < bins; k++)
    for (int m = 0; m < mels; m++) {
      const double down = -(filter_hz[size_t(m)] - fft_hz[size_t(k)]) / (filter_hz[size_t(m) + 1] - filter_hz[size_t(m)]);
      const double up = (filter_hz[size_t(m) + 2] - fft_hz[size_t(k)]) / (filter_hz[size_t(m) + 2] - filter_hz[size_t(m) + 1]);
      w[size_t(k) * mels + m] = std::max(0.0, std::min(down, up));
    }
  return w;
}

DecodedAudio decode_audio(const std::string& path) { return decode_checked(path, 0, 0); }

std::vector<float> resample_audio(const std::vector<float>& in, int from_rate, int to_rate) {
  if (from_rate <= 0 || to_rate <= 0)
    throw std::runtime_error("resample_audio: rates " + std::to_string(from_rate) + " → " + std::to_string(to_rate) + " must be positive");
  if (from_rate == to_rate || in.empty()) return in;
  soxr_error_t err = nullptr;
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
  std::unique_ptr<soxr, void (*)(soxr_t)> s(soxr_create(from_rate, to_rate, 1, &err, &io, &quality, nullptr), soxr_delete);
  if (err || !s) throw std::runtime_error(std::string("resample_audio: libsoxr: ") + (err ? err : "soxr_create failed"));
  // python-soxr's bound on the output (csoxr_divide_proc): ⌊n · to / from⌋ + 1.
  const size_t cap = static_cast<size_t>(double(in.size()) * double(to_rate) / double(from_rate) + 1);
  std::vector<float> out(cap);
  size_t in_pos = 0, out_pos = 0;
  while (in_pos < in.size() && out_pos < cap) {
    size_t used = 0, made = 0;
    err = soxr_process(s.get(), in.data() + in_pos, in.size() - in_pos, &used, out.data() + out_pos, cap - out_pos, &made);
    if (err) throw std::runtime_error(std::string("resample_audio: libsoxr: ") + err);
    in_pos += used;
    out_pos += made;
    if (used == 0 && made == 0) break;
  }
  while (out_pos < cap) {  // flush: the input has ended
    size_t made = 0;
    err = soxr_process(s.get(), nullptr, 0, nullptr, out.data() + out_pos, cap - out_pos, &made);
    if (err) throw std::runtime_error(std::string("resample_audio: libsoxr: ") + err);
    if (made == 0) break;
    out_pos += made;
  }
  out.resize(out_pos);
  return out;
}

AudioFeatures log_mel_features(const std::vector<float>& samples, const AudioFrontEndConfig& c, const std::string& what) {
  validate_audio_config(c);
  const Derived d = derive(c);
  const int64_t n = static_cast<int64_t>(samples.size());
  if (n == 0) fail(what, "the audio has no samples");
  if (d.limit > 0 && n > d.limit)
    fail(what, "audio is " + describe_length(n, c.sampling_rate) + ", longer than the maximum of " + describe_length(d.limit, c.sampling_rate));

  // HF: zeros to a multiple of pad_to_multiple_of, frame_length / 2 zeros in front; frames of
  // frame_length + 1 samples (the extra one feeds pre-emphasis) every hop; a frame is valid when the
  // last sample of that window is real audio.
  const int64_t m = c.pad_to_multiple_of, padded = (n + m - 1) / m * m;
  const int64_t pad_left = d.frame_length / 2, total = padded + pad_left, window_span = d.frame_length + 1;
  const int64_t frames = total >= window_span ? (total - window_span) / d.hop_length + 1 : 0;
  AudioFeatures out;
  out.frames = frames;
  out.mel_bins = c.feature_size;
  out.samples = n;
  out.mask.assign(size_t(frames), 0);
  for (int64_t i = 0; i < frames; i++) {
    const bool valid = i * d.hop_length + d.frame_length - pad_left < n;
    out.mask[size_t(i)] = valid;
    out.valid_frames += valid;
  }
  if (out.valid_frames == 0)
    fail(what, "audio is " + describe_length(n, c.sampling_rate) + ", too short for one full frame (at least " +
                   std::to_string(d.frame_length - pad_left + 1) + " samples)");
  out.data.assign(size_t(frames) * c.feature_size, 0.0f);

  // The window: numpy's hanning(frame + 1) (0.5 + 0.5 cos(π k / (M − 1)), k = 1 − M, 3 − M, ...),
  // its first frame_length values as float32.
  std::vector<float> window(static_cast<size_t>(d.frame_length));
  const int M = d.frame_length + 1;
  for (int j = 0; j < d.frame_length; j++) window[size_t(j)] = static_cast<float>(0.5 + 0.5 * std::cos(M_PI * double(1 - M + 2 * j) / (M - 1)));

  // The mel matrix's non-zero span per filter (the triangles are narrow: a few bins each).
  const std::vector<double> mel = htk_mel_filter_bank(c);
  const int bins = d.fft_length / 2 + 1, mels = c.feature_size;
  std::vector<int> lo(size_t(mels), bins), hi(size_t(mels), 0);
  for (int k = 0; k < bins; k++)
    for (int j = 0; j < mels; j++)
      if (mel[size_t(k) * mels + j] != 0) {
        lo[size_t(j)] = std::min(lo[size_t(j)], k);
        hi[size_t(j)] = k + 1;
      }

  const float scale = static_cast<float>(c.input_scale_factor);
  const float pre = static_cast<float>(c.preemphasis), pre_first = static_cast<float>(1.0 - c.preemphasis);
  auto sample_at = [&](int64_t p) -> float {  // the left-padded, zero-extended waveform, scaled
    const int64_t q = p - pad_left;
    if (q < 0 || q >= n) return 0.0f;
    return c.input_scale_factor != 1.0 ? samples[size_t(q)] * scale : samples[size_t(q)];
  };
  kissfft<double> fft(static_cast<size_t>(d.fft_length / 2), false);
  std::vector<float> raw(static_cast<size_t>(window_span));
  std::vector<double> buf(static_cast<size_t>(d.fft_length), 0.0), mag(static_cast<size_t>(bins));
  std::vector<std::complex<double>> spec(static_cast<size_t>(d.fft_length / 2));
  for (int64_t i = 0; i < out.valid_frames; i++) {
    for (int64_t j = 0; j < window_span; j++) raw[size_t(j)] = sample_at(i * d.hop_length + j);
    for (int j = 0; j < d.frame_length; j++) {
      float v;
      if (c.preemphasis <= 0) v = raw[size_t(j)];
      else if (c.preemphasis_htk_flavor) v = j == 0 ? raw[0] * pre_first : raw[size_t(j)] - pre * raw[size_t(j) - 1];
      else v = raw[size_t(j) + 1] - pre * raw[size_t(j)];
      buf[size_t(j)] = static_cast<double>(v * window[size_t(j)]);
    }
    fft.transform_real(buf.data(), spec.data());
    mag[0] = std::abs(spec[0].real());                   // DC
    mag[size_t(bins) - 1] = std::abs(spec[0].imag());    // Nyquist, packed into bin 0 by kissfft
    for (int k = 1; k < bins - 1; k++) mag[size_t(k)] = std::abs(spec[size_t(k)]);
    float* row = out.data.data() + size_t(i) * mels;
    for (int j = 0; j < mels; j++) {
      double s = 0;
      for (int k = lo[size_t(j)]; k < hi[size_t(j)]; k++) s += mag[size_t(k)] * mel[size_t(k) * mels + j];
      double v = std::log(s + c.mel_floor);
      if (!c.per_bin_mean.empty()) v -= c.per_bin_mean[size_t(j)];
      if (!c.per_bin_stddev.empty()) v /= c.per_bin_stddev[size_t(j)];
      row[j] = static_cast<float>(v);
    }
  }
  return out;
}

AudioFeatures load_audio_features(const std::string& path, const AudioFrontEndConfig& config) {
  validate_audio_config(config);
  auto t0 = Clock::now();
  DecodedAudio audio = decode_checked(path, config.sampling_rate, derive(config).limit);
  const double decode_ms = ms_since(t0);
  const int64_t source_frames = static_cast<int64_t>(audio.mono.size());
  double resample_ms = 0;
  if (audio.rate != config.sampling_rate) {
    t0 = Clock::now();
    audio.mono = resample_audio(audio.mono, audio.rate, config.sampling_rate);
    resample_ms = ms_since(t0);
  }
  t0 = Clock::now();
  AudioFeatures f = log_mel_features(audio.mono, config, path);
  f.features_ms = ms_since(t0);
  f.decode_ms = decode_ms;
  f.resample_ms = resample_ms;
  f.source_rate = audio.rate;
  f.source_channels = audio.channels;
  f.source_frames = source_frames;
  return f;
}

}  // namespace forge
