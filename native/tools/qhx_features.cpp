// qhx_features <audio> [--config preprocessor_config.json] --out FILE.bin [--mask-out FILE.bin]
//              [--samples-out FILE.bin] [--json]
// Runs the runtime's audio pre-processing (src/audio_input.h) on one file: decode (libsndfile),
// channels averaged, resampled to the extractor's rate (libsoxr HQ) when the file has another, then
// Gemma4AudioFeatureExtractor's log-mel features. The extractor's fields come from --config (a
// preprocessor_config.json, its "feature_extractor" object or the extractor's own JSON; HF's
// defaults without it). Writes the features as raw little-endian float32 [frames, mel_bins] to
// FILE.bin, the frame mask as one byte per frame (0/1) to --mask-out, the mono samples the features
// were computed from (float32, at the extractor's rate, before padding) to --samples-out, and prints
// one line: with --json {"frames", "mel_bins", "valid_frames", "samples", "source": {"rate",
// "channels", "frames"}, "timings": {"decode_ms", "resample_ms", "features_ms"}}.
// Any error: one line on stderr, exit status 1.
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "audio_input.h"

namespace {

const char* kUsage =
    "usage: qhx_features <audio> [--config preprocessor_config.json] --out FILE.bin [--mask-out FILE.bin] "
    "[--samples-out FILE.bin] [--json]";

void write_raw(const std::string& path, const void* data, size_t bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error(path + ": cannot write: " + std::strerror(errno));
  const bool ok = bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes;
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
}

int run(int argc, char** argv) {
  std::string audio, out, mask_out, samples_out, config_path;
  bool as_json = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value; " + kUsage);
      return argv[++i];
    };
    if (a == "--config") config_path = value();
    else if (a == "--out") out = value();
    else if (a == "--mask-out") mask_out = value();
    else if (a == "--samples-out") samples_out = value();
    else if (a == "--json") as_json = true;
    else if (a == "--help" || a == "-h") { std::cout << kUsage << "\n"; return 0; }
    else if (a.rfind("--", 0) == 0) throw std::runtime_error("unknown option " + a + "; " + kUsage);
    else if (audio.empty()) audio = a;
    else throw std::runtime_error("more than one audio file given ('" + audio + "', '" + a + "'); " + kUsage);
  }
  if (audio.empty()) throw std::runtime_error(std::string("no audio file given; ") + kUsage);
  if (out.empty()) throw std::runtime_error(std::string("--out FILE.bin is required; ") + kUsage);

  forge::AudioFrontEndConfig config;
  if (!config_path.empty()) {
    std::ifstream f(config_path);
    if (!f) throw std::runtime_error(config_path + ": cannot open: " + std::strerror(errno));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(config_path + ": not JSON: " + e.what());
    }
    config = forge::audio_config_from_json(j, config_path);
  }

  static_assert(sizeof(float) == 4, "float32");
  const uint32_t probe = 1;
  if (*reinterpret_cast<const uint8_t*>(&probe) != 1) throw std::runtime_error("big-endian host: --out would not be little-endian");

  forge::AudioFeatures feats;
  std::vector<float> samples;
  if (samples_out.empty()) {
    feats = forge::load_audio_features(audio, config);
  } else {
    // The same steps as load_audio_features, keeping the samples in between.
    using Clock = std::chrono::steady_clock;
    auto ms = [](Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); };
    forge::validate_audio_config(config);
    auto t0 = Clock::now();
    forge::DecodedAudio d = forge::decode_audio(audio);
    const double decode_ms = ms(t0);
    t0 = Clock::now();
    samples = forge::resample_audio(d.mono, d.rate, config.sampling_rate);
    const double resample_ms = d.rate == config.sampling_rate ? 0 : ms(t0);
    t0 = Clock::now();
    feats = forge::log_mel_features(samples, config, audio);
    feats.features_ms = ms(t0);
    feats.decode_ms = decode_ms;
    feats.resample_ms = resample_ms;
    feats.source_rate = d.rate;
    feats.source_channels = d.channels;
    feats.source_frames = static_cast<int64_t>(d.mono.size());
    write_raw(samples_out, samples.data(), samples.size() * sizeof(float));
  }
  write_raw(out, feats.data.data(), feats.data.size() * sizeof(float));
  if (!mask_out.empty()) write_raw(mask_out, feats.mask.data(), feats.mask.size());

  if (as_json) {
    nlohmann::json j = {{"frames", feats.frames},
                        {"mel_bins", feats.mel_bins},
                        {"valid_frames", feats.valid_frames},
                        {"samples", feats.samples},
                        {"source", {{"rate", feats.source_rate}, {"channels", feats.source_channels}, {"frames", feats.source_frames}}},
                        {"timings", {{"decode_ms", feats.decode_ms}, {"resample_ms", feats.resample_ms}, {"features_ms", feats.features_ms}}}};
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%lld frames x %d mel bins (%lld valid) from %lld samples; source %d Hz x %d channels; decode %.2f ms, resample %.2f ms, features %.2f ms\n",
                static_cast<long long>(feats.frames), feats.mel_bins, static_cast<long long>(feats.valid_frames),
                static_cast<long long>(feats.samples), feats.source_rate, feats.source_channels, feats.decode_ms, feats.resample_ms,
                feats.features_ms);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    for (char& c : msg)
      if (c == '\n') c = ' ';
    std::cerr << "qhx_features: error: " << msg << "\n";
    return 1;
  }
}
