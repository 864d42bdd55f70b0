// Host pre-processing of an image for Gemma 4's vision encoder (src/families/gemma4-vision.ts): what
// transformers' Gemma4ImageProcessorPil gives for one image. Unlike the fixed grid of image_input.h
// the image keeps its aspect ratio: it is resized (PIL bicubic) to the largest sides that are
// multiples of pooling · patch within a budget of max_soft_tokens · pooling² patches, rescaled to
// float32(v / 255) (no normalisation: Gemma 4 takes pixels in [0, 1]), cut into channel-last
// patches in row-major order, and padded to the budget with zero rows at position (−1, −1).
//
// Decoding (RGB as HF converts it) and the resize are image_input.h's decode_image and
// resize_bicubic: bit-exact where the image already has the target size; where resized, one uint8
// step (1/255 here) off on a few values in ten thousand, two on a few per million (a first-pass
// step carried through the second pass) — test/gemma4-image-input.test.ts, native/README.md
// "Image input".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "image_input.h"

namespace forge {

struct Gemma4ImageSpec {
  int max_soft_tokens;  // one of HF's budgets: 70, 140, 280, 560, 1120
  int patch = 16;       // vision_config.patch_size
  int pooling = 3;      // vision_config.pooling_kernel_size
};

// pixel_values: float32 [patches, patch_dim] row-major, patches = max_soft_tokens · pooling²,
// patch_dim = 3 · patch²; row r < grid_h · grid_w is the patch at (x, y) = (r mod grid_w, r div
// grid_w) of the resized image, its values in (row in patch, column in patch, channel) order; the
// rows after are zero. positions: int32 [patches, 2] = (x, y) of each row, (−1, −1) for padding.
// soft_tokens = grid_h · grid_w / pooling² (the image's own soft tokens; the encoder's output has
// max_soft_tokens rows). height × width is the resized image. Timings are wall milliseconds of each
// step; resize_ms is 0 when the image already has the target size.
struct Gemma4Pixels {
  std::vector<float> pixel_values;
  std::vector<int32_t> positions;
  int64_t patches = 0, patch_dim = 0;
  int soft_tokens = 0;
  int height = 0, width = 0, grid_h = 0, grid_w = 0;
  double decode_ms = 0, resize_ms = 0, patchify_ms = 0;
};

// The budgets Gemma4ImageProcessorPil accepts (its _SUPPORTED_SOFT_TOKENS).
extern const int kGemma4SoftTokenBudgets[5];

// Throws std::runtime_error("gemma4 image spec: <field> ...") when max_soft_tokens is not one of
// HF's budgets, patch or pooling is not positive, or the budget's pixel area is beyond what an
// image may hold.
void validate_gemma4_image_spec(const Gemma4ImageSpec& spec);

// HF's target size (get_aspect_ratio_preserving_size) for an image of height × width: the sides
// scaled by √(budget pixels / image pixels), each rounded down to a multiple of pooling · patch; a
// side that rounds to 0 becomes one multiple, the other ⌊long / short⌋ multiples capped at the
// budget. Same double arithmetic as HF's, so the same size. Throws std::runtime_error (no file
// name: the caller adds it) where HF raises: both sides round to 0, or the size is over budget.
ImageSize gemma4_target_size(int height, int width, const Gemma4ImageSpec& spec);

// Rescale, patchify and pad an image that already has its target size (validated: sides that are
// positive multiples of pooling · patch, within the budget).
Gemma4Pixels patchify_gemma4_image(const RgbImage& img, const Gemma4ImageSpec& spec);

// The whole pipeline: decode_image, gemma4_target_size, resize_bicubic where the size differs,
// patchify_gemma4_image. Throws std::runtime_error naming the file (or the spec field).
Gemma4Pixels preprocess_gemma4_image(const std::string& path, const Gemma4ImageSpec& spec);

}  // namespace forge
