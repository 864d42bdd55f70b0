// Audio input (src/audio_input.h): the extractor's config read from a preprocessor_config.json and
// refused where HF's extractor cannot be matched; the frame count, the mask and the zeroed masked
// frames follow HF's padding rules; silence gives log(mel_floor); the resampler's output length.
// The comparison with HF's extractor on real files (decode, resample, log-mel) is
// test/audio-input.test.ts.
#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "audio_input.h"

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(AudioConfig, ReadsTheFeatureExtractorObjectAndKeepsHfDefaults) {
  auto j = nlohmann::json::parse(R"({"processor_class": "Gemma4Processor",
    "feature_extractor": {"feature_size": 64, "sampling_rate": 8000, "max_frequency": 4000, "per_bin_mean": null}})");
  forge::AudioFrontEndConfig c = forge::audio_config_from_json(j, "pp.json");
  EXPECT_EQ(c.feature_size, 64);
  EXPECT_EQ(c.sampling_rate, 8000);
  EXPECT_EQ(c.max_frequency, 4000);
  EXPECT_EQ(c.frame_length_ms, 20.0);
  EXPECT_EQ(c.mel_floor, 1e-3);
  EXPECT_EQ(c.max_length, 480000);
  EXPECT_EQ(c.pad_to_multiple_of, 128);
  EXPECT_TRUE(c.per_bin_mean.empty());
}

TEST(AudioConfig, RefusesWhatHfsExtractorCannotBeMatchedOn) {
  auto read = [](const char* text) { return error_of([&] { forge::audio_config_from_json(nlohmann::json::parse(text), "pp.json"); }); };
  EXPECT_EQ(read(R"({"feature_size": "128"})"), "pp.json: feature_size is not a number");
  EXPECT_EQ(read(R"({"dither": 0.0001})"), "pp.json: audio config: dither 0.000100 adds random noise (HF's np.random); only 0 is reproducible");
  EXPECT_EQ(read(R"({"feature_size": 2, "per_bin_stddev": [1, 0]})"), "pp.json: audio config: per_bin_stddev has a value that is not finite or is 0");
  EXPECT_EQ(read(R"({"per_bin_mean": [1, 2]})"), "pp.json: audio config: per_bin_mean has 2 values, want feature_size = 128");
  EXPECT_EQ(read(R"({"padding_value": 1})"), "pp.json: padding_value must be 0 (the extractor's frame mask assumes silence)");
}

TEST(AudioFeatures, FramesAndMaskFollowHfsPadding) {
  forge::AudioFrontEndConfig c;
  // 16129 samples pad to 16256 (a multiple of 128); with 160 zeros in front, (16416 − 321) / 160 + 1 =
  // 101 frames, the last of which reaches past sample 16128: masked, and zero.
  std::vector<float> silence(16129, 0.0f);
  forge::AudioFeatures f = forge::log_mel_features(silence, c, "silence");
  ASSERT_EQ(f.frames, 101);
  EXPECT_EQ(f.valid_frames, 100);
  EXPECT_EQ(f.mask.front(), 1);
  EXPECT_EQ(f.mask.back(), 0);
  ASSERT_EQ(f.data.size(), size_t(101) * 128);
  const float floor = static_cast<float>(std::log(1e-3));
  for (int i = 0; i < 100 * 128; i++) ASSERT_EQ(f.data[size_t(i)], floor) << i;
  for (int i = 100 * 128; i < 101 * 128; i++) ASSERT_EQ(f.data[size_t(i)], 0.0f) << i;
}

TEST(AudioFeatures, RefusesAClipOverTheMaximumOrUnderOneFrame) {
  forge::AudioFrontEndConfig c;
  EXPECT_EQ(error_of([&] { forge::log_mel_features(std::vector<float>(480001), c, "x.wav"); }),
            "x.wav: audio is 30.000 s (480001 samples at 16000 Hz), longer than the maximum of 30.000 s (480000 samples at 16000 Hz)");
  EXPECT_NO_THROW(forge::log_mel_features(std::vector<float>(480000), c, "x.wav"));
  EXPECT_EQ(error_of([&] { forge::log_mel_features(std::vector<float>(160), c, "x.wav"); }),
            "x.wav: audio is 0.010 s (160 samples at 16000 Hz), too short for one full frame (at least 161 samples)");
  EXPECT_NO_THROW(forge::log_mel_features(std::vector<float>(161), c, "x.wav"));
}

TEST(AudioResample, GivesTheClipAtTheNewRate) {
  std::vector<float> tone(44100);
  for (size_t i = 0; i < tone.size(); i++) tone[i] = static_cast<float>(0.5 * std::sin(2 * M_PI * 440 * double(i) / 44100));
  std::vector<float> out = forge::resample_audio(tone, 44100, 16000);
  ASSERT_EQ(out.size(), 16000u);
  // Away from the ends (the filter's ramp), the tone at 16 kHz.
  for (size_t i = 1000; i < 15000; i += 997) EXPECT_NEAR(out[i], 0.5 * std::sin(2 * M_PI * 440 * double(i) / 16000), 1e-3) << i;
  EXPECT_EQ(forge::resample_audio(tone, 16000, 16000), tone);
}

TEST(AudioMelFilterBank, IsHtkTrianglesWithoutNormalisation) {
  forge::AudioFrontEndConfig c;
  std::vector<double> w = forge::htk_mel_filter_bank(c);
  ASSERT_EQ(w.size(), size_t(257) * 128);
  // Each triangle peaks at most at 1 (no area normalisation) and none reaches the 0 Hz bin.
  for (int m = 0; m < 128; m++) {
    double peak = 0;
    for (int k = 0; k < 257; k++) peak = std::max(peak, w[size_t(k) * 128 + m]);
    EXPECT_LE(peak, 1.0) << m;
  }
  for (int m = 0; m < 128; m++) EXPECT_EQ(w[size_t(m)], 0.0) << m;
}

}  // namespace
