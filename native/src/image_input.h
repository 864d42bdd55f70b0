// Host pre-processing of an image for a vision encoder with a fixed grid (Qwen3-VL; Qwen2-VL's
// processor): a JPEG or PNG file → 8-bit RGB as HF's processor sees it → a stretch to the recipe's
// height × width with PIL's bicubic → rescale 1/255 and (x − mean) / std per channel in float32 →
// patches in Qwen2-VL's merge-block order, the frame repeated `temporal` times.
//
// Checked against transformers' Qwen2VLImageProcessorPil on the same file (test/image-input.test.ts
// and native/README.md, "Image input"): bit-exact at the recipe size, within one uint8 step where
// resized. Decoding is libjpeg-turbo / libpng, resampling stb_image_resize (Catmull-Rom = PIL's
// a = −0.5 bicubic) pass by pass; image_input.cpp says why and how close.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace forge {

struct ImageSpec {
  int height, width, patch = 16, temporal = 2, merge = 2;
  float mean[3], std[3];
};

// data: float32 [patches, patch_dim] row-major; patches = grid_h · grid_w, patch_dim = 3 · temporal ·
// patch², rows in merge-block order. Timings are wall milliseconds of each step (resize_ms is 0 when
// the image already has the spec's size).
struct Pixels {
  std::vector<float> data;
  int64_t patches, patch_dim;
  int grid_h, grid_w;
  double decode_ms, resize_ms, patchify_ms;
  // int32 [patches, 2]: (x, y) of each row on the resized grid, (−1, −1) for padding, for an encoder
  // that takes the positions (Gemma 4: gemma4_image.h); empty for a fixed grid.
  std::vector<int32_t> positions = {};
};

// The whole pipeline. Throws std::runtime_error naming the file (or the spec field) on any error.
Pixels preprocess_image(const std::string& path, const ImageSpec& spec);

// The steps, for tests and for callers that have the pixels already.

// 8-bit RGB, row-major, interleaved (width · height · 3 bytes).
struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// Throws std::runtime_error("<what>: ...") when the spec cannot describe a fixed grid: a size that is
// not positive or not a multiple of patch · merge, a non-positive patch/temporal/merge, a std that is
// zero or not finite, a mean that is not finite.
void validate_image_spec(const ImageSpec& spec);

// Decodes a JPEG or PNG (told apart by their signatures, not the file name) into RGB the way HF's
// processor converts an image it opened with PIL (`convert_to_rgb`): an image with alpha (an alpha
// channel, or a tRNS chunk) is composited onto white with PIL's integer alpha_composite; one without
// is PIL's convert("RGB") (grey replicated, palette looked up; 16-bit samples keep their high byte,
// as PIL reads them, except 16-bit grey, which PIL holds as I;16 and convert("RGB") saturates at
// 255; a tRNS colour matched as PIL's convert_transparent matches it). A truncated or corrupt file,
// a CMYK JPEG, an image over PIL's decompression-bomb limit (178,956,970 pixels) and a file that is
// neither format are refused, naming the file. EXIF orientation is not applied (HF does not).
RgbImage decode_image(const std::string& path);

// PIL's Image.resize((width, height), BICUBIC): equal but for one uint8 step on a few values in ten
// thousand per pass (image_input.cpp says why); where both passes run, a first-pass step carried
// through the second comes out two steps off on a few values per million (measured in
// test/gemma4-image-input.test.ts). The same size returns a copy.
RgbImage resize_bicubic(const RgbImage& in, int width, int height);

// Rescale, normalise and patchify an image of exactly spec.height × spec.width (validated).
Pixels patchify_image(const RgbImage& img, const ImageSpec& spec);

struct ImageSize {
  int height, width;
};

// An image decoded and resized (PIL bicubic; kept as is when already that size) to the size
// `target` gives for its decoded height × width, with both steps' wall milliseconds: the start of
// every pre-processing here. An error of `target` is rethrown naming the file.
struct SizedImage {
  RgbImage img;
  double decode_ms = 0, resize_ms = 0;
};
SizedImage decode_and_resize(const std::string& path, const std::function<ImageSize(int height, int width)>& target);

}  // namespace forge
