// Gemma 4's image pre-processing (gemma4_image.h), step by step as transformers'
// Gemma4ImageProcessorPil (image_processing_pil_gemma4.py) does it:
//   1. RGB as HF converts it: image_input.cpp's decode_image (transparency onto white, ...);
//   2. get_aspect_ratio_preserving_size → gemma4_target_size; the resize is transformers'
//      image_transforms.resize with the processor's resample, PIL BICUBIC (PIL's
//      Image.resize((w, h), BICUBIC) on the uint8 image, no reducing_gap), skipped when the size
//      is already the target: image_input.cpp's resize_bicubic;
//   3. rescale: float32(float64(v) · (1/255)); do_normalize is off (mean 0, std 1: Gemma 4 was
//      trained on [0, 1]), so that is the value;
//   4. convert_image_to_patches: (C, H, W) reshaped to (C, gh, p, gw, p), transposed to
//      (gh, gw, p, p, C): rows row-major over the patch grid, each patch channel-last — which is
//      the decoded RGB bytes of the patch's rows, in order;
//   5. positions (x, y) = (column, row) of each patch (meshgrid indexing "xy"), then
//      pad_along_first_dim to max_soft_tokens · k² rows: pixel values 0, positions −1.
#include "gemma4_image.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// PIL's decompression-bomb limit (image_input.cpp): no budget may ask for a larger resized image.
constexpr double kMaxPixels = 2.0 * 89478485.0;

std::string hw(int64_t h, int64_t w) { return std::to_string(h) + "x" + std::to_string(w) + " (HxW)"; }

}  // namespace

const int kGemma4SoftTokenBudgets[5] = {70, 140, 280, 560, 1120};

void validate_gemma4_image_spec(const Gemma4ImageSpec& s) {
  auto bad = [](const std::string& why) { throw std::runtime_error("gemma4 image spec: " + why); };
  bool known = false;
  for (int b : kGemma4SoftTokenBudgets) known = known || s.max_soft_tokens == b;
  if (!known)
    bad("max_soft_tokens " + std::to_string(s.max_soft_tokens) +
        " must be one of 70, 140, 280, 560, 1120 (the budgets HF's Gemma 4 image processor accepts)");
  if (s.patch <= 0) bad("patch " + std::to_string(s.patch) + " must be positive");
  if (s.pooling <= 0) bad("pooling " + std::to_string(s.pooling) + " must be positive");
  // In double: the product of four ints may not fit in 64 bits, and near the limit it is exact.
  const double area = double(s.max_soft_tokens) * s.pooling * s.pooling * s.patch * s.patch;
  if (area > kMaxPixels) {
    char n[64];
    std::snprintf(n, sizeof n, "%.0f", area);  // may be past any integer type
    bad("max_soft_tokens · pooling² · patch² = " + std::string(n) +
        " pixels is over PIL's decompression-bomb limit of 178956970 (patch " + std::to_string(s.patch) + ", pooling " +
        std::to_string(s.pooling) + ")");
  }
}

ImageSize gemma4_target_size(int height, int width, const Gemma4ImageSpec& s) {
  validate_gemma4_image_spec(s);
  if (height <= 0 || width <= 0) throw std::runtime_error("image size " + hw(height, width) + " must be positive");
  const int64_t max_patches = int64_t(s.max_soft_tokens) * s.pooling * s.pooling;
  const int64_t target_px = max_patches * s.patch * s.patch;
  const int64_t side = int64_t(s.pooling) * s.patch;
  // HF's float64 steps, in its order (Python's int / int is the correctly rounded quotient, as
  // double / double of exactly held ints is): the same doubles, so the same floors.
  const double factor = std::sqrt(double(target_px) / double(int64_t(height) * width));
  const double ideal_h = factor * double(height), ideal_w = factor * double(width);
  int64_t th = int64_t(std::floor(ideal_h / double(side))) * side;
  int64_t tw = int64_t(std::floor(ideal_w / double(side))) * side;
  if (th == 0 && tw == 0)
    throw std::runtime_error("resizing " + hw(height, width) + " within " + std::to_string(max_patches) +
                             " patches leaves no side of pooling·patch = " + std::to_string(side));
  // A sliver: the short side gets one block, the long one ⌊long/short⌋ blocks, at most the budget's
  // whole row of blocks (one block high, max_soft_tokens long, = the budget exactly).
  const int64_t max_side = (max_patches / (int64_t(s.pooling) * s.pooling)) * side;
  if (th == 0) {
    th = side;
    tw = std::min(int64_t(std::floor(double(width) / double(height))) * side, max_side);
  } else if (tw == 0) {
    tw = side;
    th = std::min(int64_t(std::floor(double(height) / double(width))) * side, max_side);
  }
  if (th * tw > target_px)
    throw std::runtime_error("resizing " + hw(height, width) + " to " + hw(th, tw) + " exceeds " + std::to_string(max_patches) +
                             " patches of " + std::to_string(s.patch) + "x" + std::to_string(s.patch));
  return ImageSize{int(th), int(tw)};
}

Gemma4Pixels patchify_gemma4_image(const RgbImage& img, const Gemma4ImageSpec& s) {
  validate_gemma4_image_spec(s);
  if (img.width <= 0 || img.height <= 0 || img.rgb.size() != size_t(img.width) * img.height * 3)
    throw std::runtime_error("patchify_gemma4_image: the image is empty or its buffer does not match its size");
  const int p = s.patch, side = s.pooling * s.patch;
  if (img.height % side || img.width % side)
    throw std::runtime_error("patchify_gemma4_image: image is " + hw(img.height, img.width) +
                             ", not a multiple of pooling·patch = " + std::to_string(side) + " on each side");
  Gemma4Pixels px;
  px.height = img.height;
  px.width = img.width;
  px.grid_h = img.height / p;
  px.grid_w = img.width / p;
  px.patches = int64_t(s.max_soft_tokens) * s.pooling * s.pooling;
  px.patch_dim = int64_t(3) * p * p;
  const int64_t real = int64_t(px.grid_h) * px.grid_w;
  if (real > px.patches)
    throw std::runtime_error("patchify_gemma4_image: image " + hw(img.height, img.width) + " has " + std::to_string(real) +
                             " patches, over the budget of " + std::to_string(px.patches));
  px.soft_tokens = int(real / (int64_t(s.pooling) * s.pooling));
  px.pixel_values.assign(size_t(px.patches * px.patch_dim), 0.0f);  // padding rows stay 0
  px.positions.assign(size_t(px.patches) * 2, -1);                   // and at (−1, −1)

  // HF's rescale, value for value: every uint8 maps to one float32.
  float lut[256];
  for (int v = 0; v < 256; v++) lut[v] = static_cast<float>(double(v) * (1.0 / 255.0));

  const size_t patch_row = size_t(p) * 3;  // one row of a patch, channel-last: its RGB bytes as stored
  float* o = px.pixel_values.data();
  for (int gy = 0; gy < px.grid_h; gy++)
    for (int gx = 0; gx < px.grid_w; gx++) {
      const size_t r = size_t(gy) * px.grid_w + gx;
      px.positions[2 * r] = gx;
      px.positions[2 * r + 1] = gy;
      for (int py = 0; py < p; py++) {
        const uint8_t* src = img.rgb.data() + (size_t(gy * p + py) * img.width + size_t(gx) * p) * 3;
        for (size_t i = 0; i < patch_row; i++) *o++ = lut[src[i]];
      }
    }
  return px;
}

Gemma4Pixels preprocess_gemma4_image(const std::string& path, const Gemma4ImageSpec& spec) {
  validate_gemma4_image_spec(spec);
  const SizedImage sized = decode_and_resize(path, [&](int h, int w) { return gemma4_target_size(h, w, spec); });
  const auto t0 = Clock::now();
  Gemma4Pixels px = patchify_gemma4_image(sized.img, spec);
  px.patchify_ms = ms_since(t0);
  px.decode_ms = sized.decode_ms;
  px.resize_ms = sized.resize_ms;
  return px;
}

}  // namespace forge
