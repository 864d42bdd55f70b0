// Gemma 4 image input (src/gemma4_image.h): the spec's refusals name the field; the target size is
// HF's get_aspect_ratio_preserving_size (cases worked by hand from its code); the patches are
// channel-last, row-major, with (x, y) positions and zero padding at (−1, −1). The comparison with
// HF's processor on real files (decode, resize) is test/gemma4-image-input.test.ts.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gemma4_image.h"

namespace {

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

forge::Gemma4ImageSpec spec(int budget, int patch = 16, int pooling = 3) {
  forge::Gemma4ImageSpec s{budget};
  s.patch = patch;
  s.pooling = pooling;
  return s;
}

// HF's rescale of a uint8 sample: float32(float64(v) · (1/255)).
float hf_value(unsigned v) { return static_cast<float>(double(v) * (1.0 / 255.0)); }

forge::RgbImage pattern(int width, int height) {
  forge::RgbImage img;
  img.width = width;
  img.height = height;
  for (int y = 0; y < height; y++)
    for (int x = 0; x < width; x++)
      for (int c = 0; c < 3; c++) img.rgb.push_back(uint8_t(y * 31 + x * 7 + c * 80));
  return img;
}

}  // namespace

TEST(Gemma4Image, ValidatesTheSpec) {
  for (int b : {70, 140, 280, 560, 1120}) EXPECT_NO_THROW(forge::validate_gemma4_image_spec(spec(b))) << b;
  for (int b : {0, -70, 100, 71, 2240})
    EXPECT_EQ(error_of([&] { forge::validate_gemma4_image_spec(spec(b)); }),
              "gemma4 image spec: max_soft_tokens " + std::to_string(b) +
                  " must be one of 70, 140, 280, 560, 1120 (the budgets HF's Gemma 4 image processor accepts)");
  EXPECT_EQ(error_of([] { forge::validate_gemma4_image_spec(spec(70, 0)); }), "gemma4 image spec: patch 0 must be positive");
  EXPECT_EQ(error_of([] { forge::validate_gemma4_image_spec(spec(70, 16, -1)); }), "gemma4 image spec: pooling -1 must be positive");
  // 1120 · 9 · 1024² pixels: over PIL's limit; and ints whose product would overflow 64 bits.
  EXPECT_EQ(error_of([] { forge::validate_gemma4_image_spec(spec(1120, 1024)); })
                .rfind("gemma4 image spec: max_soft_tokens · pooling² · patch² = 10569646080 pixels is over", 0),
            0u);
  EXPECT_NE(error_of([] { forge::validate_gemma4_image_spec(spec(1120, 2147483647, 2147483647)); }), "");
  // Every entry point checks the spec first, before it reads a file or an image.
  EXPECT_EQ(error_of([] { forge::preprocess_gemma4_image("/nonexistent.png", spec(100)); }).rfind("gemma4 image spec: max_soft_tokens 100", 0), 0u);
  EXPECT_EQ(error_of([] { forge::patchify_gemma4_image(pattern(48, 48), spec(70, 16, 0)); }), "gemma4 image spec: pooling 0 must be positive");
  EXPECT_EQ(error_of([] { forge::gemma4_target_size(48, 48, spec(7)); }).rfind("gemma4 image spec: ", 0), 0u);
}

TEST(Gemma4Image, RefusesAMissingFileNamingIt) {
  const std::string p = "/nonexistent-dir/photo.jpg";
  const std::string e = error_of([&] { forge::preprocess_gemma4_image(p, spec(70)); });
  EXPECT_EQ(e.rfind(p + ": cannot open image: ", 0), 0u) << e;
}

// (height, width) → HF's target, worked from get_aspect_ratio_preserving_size with side = 48.
TEST(Gemma4Image, TargetSizeIsHfs) {
  struct Case {
    int h, w, budget, th, tw;
  };
  for (const Case& c : std::vector<Case>{
           {336, 480, 70, 336, 480},    // exactly the budget (7x10 blocks): kept
           {672, 960, 280, 672, 960},   // 14x20 blocks: kept
           {672, 960, 70, 336, 480},    // halved
           {336, 480, 280, 672, 960},   // doubled
           {20, 30, 70, 288, 480},      // tiny, enlarged: factor √268.8 = 16.4 → 327.9x491.8
           {500, 1200, 280, 480, 1200}, // factor 1.0369 → 518.5x1244.3: only the height changes
           {1, 1, 70, 384, 384},        // factor 401.6 → 8 blocks a side
           {12, 2000, 70, 48, 3360},    // height rounds to 0: one block, ⌊2000/12⌋ = 166 blocks capped at 70
           {2000, 12, 70, 3360, 48},
           {1, 100000, 1120, 48, 53760},
       }) {
    const forge::ImageSize t = forge::gemma4_target_size(c.h, c.w, spec(c.budget));
    EXPECT_EQ(t.height, c.th) << c.h << "x" << c.w << " at " << c.budget;
    EXPECT_EQ(t.width, c.tw) << c.h << "x" << c.w << " at " << c.budget;
  }
  EXPECT_EQ(error_of([] { forge::gemma4_target_size(0, 5, spec(70)); }), "image size 0x5 (HxW) must be positive");
}

// HF's convert_image_to_patches: (C, H, W) → (C, gh, p, gw, p) → transpose (1, 3, 2, 4, 0) →
// (gh·gw, p·p·C); positions meshgrid "xy" → (x, y); pad_along_first_dim: 0 and −1.
TEST(Gemma4Image, PatchesAreChannelLastRowMajorWithXyPositions) {
  const int P = 16, H = 96, W = 144;  // 6x9 patches, 2x3 soft tokens
  const forge::RgbImage img = pattern(W, H);
  const forge::Gemma4Pixels px = forge::patchify_gemma4_image(img, spec(70));
  ASSERT_EQ(px.patches, 630);
  ASSERT_EQ(px.patch_dim, 768);
  ASSERT_EQ(px.pixel_values.size(), size_t(630 * 768));
  ASSERT_EQ(px.positions.size(), size_t(630 * 2));
  EXPECT_EQ(px.grid_h, 6);
  EXPECT_EQ(px.grid_w, 9);
  EXPECT_EQ(px.soft_tokens, 6);
  EXPECT_EQ(px.height, H);
  EXPECT_EQ(px.width, W);
  size_t i = 0;
  for (int gy = 0; gy < 6; gy++)
    for (int gx = 0; gx < 9; gx++) {
      const size_t row = size_t(gy) * 9 + gx;
      EXPECT_EQ(px.positions[2 * row], gx) << "row " << row;
      EXPECT_EQ(px.positions[2 * row + 1], gy) << "row " << row;
      for (int py = 0; py < P; py++)
        for (int pxi = 0; pxi < P; pxi++)
          for (int c = 0; c < 3; c++, i++) {
            const int y = gy * P + py, x = gx * P + pxi;
            ASSERT_EQ(px.pixel_values[i], hf_value(img.rgb[(size_t(y) * W + x) * 3 + c])) << "row " << row << " col " << i % 768;
          }
    }
  for (; i < px.pixel_values.size(); i++) ASSERT_EQ(px.pixel_values[i], 0.0f) << "padding row " << i / 768;
  for (size_t r = 54; r < 630; r++) {
    EXPECT_EQ(px.positions[2 * r], -1) << r;
    EXPECT_EQ(px.positions[2 * r + 1], -1) << r;
  }
  // Spot checks by hand: column 1 is the first pixel's green, 3 the next pixel's red, 48 the
  // patch's second row; row 1 is the patch to the right (x from 16), row 9 the one below (y from 16).
  auto at = [&](size_t row, size_t col) { return px.pixel_values[row * 768 + col]; };
  auto want = [&](int y, int x, int c) { return hf_value(img.rgb[(size_t(y) * W + x) * 3 + c]); };
  EXPECT_EQ(at(0, 1), want(0, 0, 1));
  EXPECT_EQ(at(0, 3), want(0, 1, 0));
  EXPECT_EQ(at(0, 48), want(1, 0, 0));
  EXPECT_EQ(at(1, 0), want(0, 16, 0));
  EXPECT_EQ(at(9, 0), want(16, 0, 0));
}

TEST(Gemma4Image, PatchifyRefusesSizesOffTheBlocksOrOverBudget) {
  EXPECT_EQ(error_of([] { forge::patchify_gemma4_image(pattern(144, 100), spec(70)); }),
            "patchify_gemma4_image: image is 100x144 (HxW), not a multiple of pooling·patch = 48 on each side");
  // 48 x 3408: 3 x 213 = 639 patches, over 70 · 9 = 630.
  EXPECT_EQ(error_of([] { forge::patchify_gemma4_image(pattern(3408, 48), spec(70)); }),
            "patchify_gemma4_image: image 48x3408 (HxW) has 639 patches, over the budget of 630");
  forge::RgbImage broken = pattern(48, 48);
  broken.rgb.pop_back();
  EXPECT_NE(error_of([&] { forge::patchify_gemma4_image(broken, spec(70)); }), "");
}

// The pipeline's resize and size on an in-memory image: resize_bicubic to the target, then patchify.
TEST(Gemma4Image, AFlatImageStaysFlatThroughTheResize) {
  forge::RgbImage img;
  img.width = 30;
  img.height = 20;
  for (int i = 0; i < 600; i++) img.rgb.insert(img.rgb.end(), {12, 200, 255});
  const forge::ImageSize t = forge::gemma4_target_size(img.height, img.width, spec(70));
  const forge::Gemma4Pixels px = forge::patchify_gemma4_image(forge::resize_bicubic(img, t.width, t.height), spec(70));
  EXPECT_EQ(px.soft_tokens, 60);
  for (int64_t r = 0; r < 540; r++)
    for (int k = 0; k < 768; k++) ASSERT_EQ(px.pixel_values[size_t(r) * 768 + k], hf_value(k % 3 == 0 ? 12 : k % 3 == 1 ? 200 : 255));
}
