// Image pre-processing for a fixed-grid vision encoder (image_input.h). What each step does and why:
//
// Decode — libjpeg-turbo (Debian libjpeg62-turbo-dev) and libpng (libpng-dev), the libraries Pillow
// itself wraps. A JPEG is decoded with libjpeg's defaults, as Pillow does (islow IDCT, fancy
// upsampling): the same bytes as Pillow's bundled libjpeg-turbo 3.x gave on every test file. libjpeg
// only warns at a premature end of data (and fills the rest with grey); Pillow refuses such a file
// ("image file is truncated"), and so does this. PNG: no gamma handling (Pillow applies none).
// Both libraries report errors through setjmp/longjmp; the C++ exception is thrown only after the
// jump has landed in the function that called setjmp, never through the libraries' C frames.
//
// Resize — stb_image_resize (Debian libstb-dev, v1 of 2022-09; header-only, compiled into this file
// with its implementation static) with the Catmull-Rom filter: PIL's bicubic kernel (Keys' cubic,
// a = −0.5), at the same pixel centres, its support scaled by the ratio when shrinking as PIL does.
// Measured against PIL 12.1 (HF's processor) on photo-like JPEGs and PNGs shrunk, grown, and both,
// to 512x512 and 96x128, in units of one uint8 step (LSB; 2/255 after normalising with 0.5/0.5):
//   stb in one call (float between the passes), clamped edges: up to 26 LSB, throughout the image
//     where the kernel overshoots at sharp edges: PIL clips each pass to uint8, stb does not;
//   stb per pass, uint8 between (clipped), clamped edges: ≤ 1 LSB inside, up to 8 LSB in the
//     outer two pixels (reflect: up to 22; zero: worse): PIL drops the taps outside the image and
//     renormalises the rest, none of stb's four edge modes does that;
//   stb per pass, edge zero, divided by the in-image taps' weight (resize_bicubic below): ≤ 1 LSB on
//     0.001–0.024 % of the values, everywhere else equal: the rest is PIL's 22-bit fixed-point
//     weights against stb's float. This is what runs.
// Not measured: libvips (8.14 in Debian; ~40 packages with glib) shrinks with a cubic of its own
// and enlarges through an affine interpolator, not PIL's convolution; OpenCV's INTER_CUBIC is
// a = −0.75 without antialiasing. Neither can beat ≤ 1 LSB; a port of PIL's resampler would be
// exact, but stb is within a rounding step of it, and one header that builds for Android unchanged.
#include "image_input.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#include <jpeglib.h>
#include <jerror.h>  // after jpeglib.h: JWRN_JPEG_EOF
#include <png.h>

#define STB_IMAGE_RESIZE_IMPLEMENTATION
#define STB_IMAGE_RESIZE_STATIC
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#include <stb_image_resize.h>
#pragma GCC diagnostic pop

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// PIL's Image.MAX_IMAGE_PIXELS · 2: over it Image.open raises DecompressionBombError.
constexpr uint64_t kMaxPixels = 2ull * 89478485ull;

[[noreturn]] void fail(const std::string& path, const std::string& why) { throw std::runtime_error(path + ": " + why); }

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, std::string("cannot open image: ") + std::strerror(errno));
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) fail(path, std::string("cannot read image: ") + std::strerror(errno));
  return bytes;
}

void check_size(const std::string& path, uint64_t w, uint64_t h) {
  if (w == 0 || h == 0) fail(path, "image has no pixels (" + std::to_string(w) + "x" + std::to_string(h) + ")");
  if (w * h > kMaxPixels)
    fail(path, "image is " + std::to_string(w) + "x" + std::to_string(h) + " = " + std::to_string(w * h) +
                   " pixels, over PIL's decompression-bomb limit of " + std::to_string(kMaxPixels));
}

// ---- JPEG ------------------------------------------------------------------------------------------

struct JpegError {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  longjmp(e->jump, 1);
}

void jpeg_on_message(j_common_ptr cinfo, int level) {
  // Warnings (level −1) are ignored as Pillow ignores them (corrupt-data notes), except the premature
  // end of data: libjpeg would fill the rest of the image with grey, Pillow refuses the file.
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* e = reinterpret_cast<JpegError*>(cinfo->err);
    std::snprintf(e->message, sizeof e->message, "the data is truncated (premature end of file)");
    longjmp(e->jump, 1);
  }
}

// Fills *out (allocated here). Returns an empty string or the error. No C++ object with a destructor
// lives in this frame, so the longjmp skips nothing; *out lives in the caller's frame.
std::string decode_jpeg_into(const std::vector<unsigned char>* bytes, RgbImage* out) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_on_error;
  err.pub.emit_message = jpeg_on_message;
  err.message[0] = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return std::string(err.message[0] ? err.message : "JPEG decode failed");
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes->data(), static_cast<unsigned long>(bytes->size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    std::snprintf(err.message, sizeof err.message, "CMYK/YCCK JPEG is not supported (convert it to RGB)");
    longjmp(err.jump, 1);
  }
  cinfo.out_color_space = JCS_RGB;  // from YCbCr, RGB or greyscale (grey replicated, as PIL's convert)
  jpeg_start_decompress(&cinfo);
  if (cinfo.output_components != 3) {
    std::snprintf(err.message, sizeof err.message, "JPEG decodes to %d components, not 3", cinfo.output_components);
    longjmp(err.jump, 1);
  }
  {
    const uint64_t w = cinfo.output_width, h = cinfo.output_height;
    if (w * h > kMaxPixels) {
      std::snprintf(err.message, sizeof err.message, "image is %llux%llu pixels, over PIL's decompression-bomb limit of %llu",
                    (unsigned long long)w, (unsigned long long)h, (unsigned long long)kMaxPixels);
      longjmp(err.jump, 1);
    }
  }
  out->width = static_cast<int>(cinfo.output_width);
  out->height = static_cast<int>(cinfo.output_height);
  out->rgb.resize(static_cast<size_t>(out->width) * out->height * 3);  // bad_alloc: no libjpeg frame below us
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->rgb.data() + static_cast<size_t>(cinfo.output_scanline) * out->width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  // The image is complete: what follows the last scan (a missing EOI, trailing bytes) is not read,
  // as Pillow does not read it either.
  jpeg_destroy_decompress(&cinfo);
  return std::string();
}

RgbImage decode_jpeg(const std::string& path, const std::vector<unsigned char>& bytes) {
  RgbImage img;
  std::string why = decode_jpeg_into(&bytes, &img);
  if (!why.empty()) fail(path, "JPEG: " + why);
  if (img.width == 0 || img.height == 0) fail(path, "JPEG: image has no pixels");
  return img;
}

// ---- PNG -------------------------------------------------------------------------------------------

struct PngReader {
  const std::vector<unsigned char>* bytes;
  size_t pos;
  char message[256];
};

void png_on_error(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof r->message, "%s", msg);
  png_longjmp(png, 1);
}
void png_on_warning(png_structp, png_const_charp) {}  // benign notes (iCCP profiles, ...); Pillow ignores them too

void png_read_from_memory(png_structp png, png_bytep dst, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (n > r->bytes->size() - r->pos) png_error(png, "the data is truncated (premature end of file)");
  std::memcpy(dst, r->bytes->data() + r->pos, n);
  r->pos += n;
}

// PIL's alpha_composite(white, (r, g, b, a)) for one channel value (Pillow's AlphaComposite.c with an
// opaque white destination; equal to Pillow on all 65,536 (value, alpha) pairs).
inline uint8_t over_white(uint32_t c, uint32_t a) {
  if (a == 0) return 255;
  constexpr uint32_t kBits = 7;
  const uint32_t outa255 = a * 255 + 255 * (255 - a);
  const uint32_t coef1 = a * 255 * 255 * (1u << kBits) / outa255;
  const uint32_t coef2 = 255 * (1u << kBits) - coef1;
  const uint32_t t = c * coef1 + 255 * coef2 + (0x80u << kBits);
  return static_cast<uint8_t>((((t >> 8) + t) >> 8) >> kBits);
}

// As decode_jpeg_into: no destructor-owning object in this frame; the rows go into out->rgb or
// *scratch, both owned by the caller.
std::string decode_png_into(const std::vector<unsigned char>* bytes, RgbImage* out, std::vector<unsigned char>* scratch,
                            std::vector<png_bytep>* rows) {
  PngReader reader;
  reader.bytes = bytes;
  reader.pos = 0;
  reader.message[0] = 0;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, png_on_error, png_on_warning);
  if (!png) return "cannot create a libpng reader";
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return "cannot create a libpng reader";
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return std::string(reader.message[0] ? reader.message : "PNG decode failed");
  }
  png_set_read_fn(png, &reader, png_read_from_memory);
  // Pillow does not refuse an image over libpng's default 1,000,000-pixel side; its own limit is
  // the pixel count, checked below.
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  const int depth = png_get_bit_depth(png, info), type = png_get_color_type(png, info);
  if (static_cast<uint64_t>(w) * h > kMaxPixels) {
    std::snprintf(reader.message, sizeof reader.message, "image is %ux%u pixels, over PIL's decompression-bomb limit of %llu",
                  (unsigned)w, (unsigned)h, (unsigned long long)kMaxPixels);
    png_longjmp(png, 1);
  }
  // PIL's view of the samples, which HF's convert_to_rgb then composites onto white when the image
  // has alpha (an alpha channel, or a tRNS chunk):
  //   palette: looked up, with the tRNS alphas (as libpng expands it);
  //   grey, RGB (colour types 0 and 2): PIL reads 8-bit samples as they are, grey below 8 bits with
  //     its bits replicated (L;1, L;2, L;4: ·255, ·85, ·17), 16-bit RGB by its high bytes, 16-bit
  //     grey whole (I;16, which convert("RGB") saturates at 255). A tRNS colour is applied the way
  //     PIL's convert_transparent does, not libpng's: after the conversion to 8 bits, a pixel is
  //     transparent when its values equal the low bytes of the chunk's values as written (so in a
  //     grey image under 8 bits only a tRNS of 0 ever matches, and in 16-bit images the written
  //     value is not what is compared);
  //   with an alpha channel: 16-bit samples by their high bytes.
  const bool trns = png_get_valid(png, info, PNG_INFO_tRNS) != 0;
  const bool keyed = (type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_RGB) && trns;
  unsigned key[3] = {0, 0, 0};
  if (keyed) {
    png_color_16p c = nullptr;
    png_get_tRNS(png, info, nullptr, nullptr, &c);
    if (type == PNG_COLOR_TYPE_GRAY) key[0] = key[1] = key[2] = c->gray & 0xff;
    else key[0] = c->red & 0xff, key[1] = c->green & 0xff, key[2] = c->blue & 0xff;
  }
  const bool grey16 = type == PNG_COLOR_TYPE_GRAY && depth == 16;
  if (type == PNG_COLOR_TYPE_PALETTE) {
    png_set_palette_to_rgb(png);
    if (trns) png_set_tRNS_to_alpha(png);
  }
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (!grey16) png_set_strip_16(png);
  if ((type & ~PNG_COLOR_MASK_ALPHA) == PNG_COLOR_TYPE_GRAY && !grey16) png_set_gray_to_rgb(png);
  const bool alpha_channel = (type & PNG_COLOR_MASK_ALPHA) || (type == PNG_COLOR_TYPE_PALETTE && trns);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t channels = png_get_channels(png, info), rowbytes = png_get_rowbytes(png, info);
  out->width = static_cast<int>(w);
  out->height = static_cast<int>(h);
  out->rgb.resize(static_cast<size_t>(w) * h * 3);
  scratch->resize(rowbytes * h);
  rows->resize(h);
  for (png_uint_32 y = 0; y < h; y++) (*rows)[y] = scratch->data() + y * rowbytes;
  png_read_image(png, rows->data());
  png_destroy_read_struct(&png, &info, nullptr);
  if (channels != (grey16 ? 1u : alpha_channel ? 4u : 3u)) return "unexpected channel count after conversion";

  uint8_t* o = out->rgb.data();
  for (png_uint_32 y = 0; y < h; y++) {
    const uint8_t* r = (*rows)[y];
    for (png_uint_32 x = 0; x < w; x++, o += 3) {
      if (grey16) {
        const unsigned v = (unsigned(r[2 * x]) << 8) | r[2 * x + 1];
        const uint8_t s = static_cast<uint8_t>(v > 255 ? 255 : v);
        o[0] = o[1] = o[2] = (keyed && s == key[0]) ? 255 : s;
      } else if (alpha_channel) {
        const uint8_t* p = r + 4 * x;
        o[0] = over_white(p[0], p[3]);
        o[1] = over_white(p[1], p[3]);
        o[2] = over_white(p[2], p[3]);
      } else {
        const uint8_t* p = r + 3 * x;
        if (keyed && p[0] == key[0] && p[1] == key[1] && p[2] == key[2]) o[0] = o[1] = o[2] = 255;  // alpha 0 → white
        else std::memcpy(o, p, 3);
      }
    }
  }
  return std::string();
}

RgbImage decode_png(const std::string& path, const std::vector<unsigned char>& bytes) {
  RgbImage img;
  std::vector<unsigned char> scratch;
  std::vector<png_bytep> rows;
  std::string why = decode_png_into(&bytes, &img, &scratch, &rows);
  if (!why.empty()) fail(path, "PNG: " + why);
  return img;
}

// ---- resize ----------------------------------------------------------------------------------------
//
// PIL's Image.resize(BICUBIC) is two separable passes, horizontal then vertical (a pass whose side
// keeps its size is skipped), each stored as uint8 (rounded half up, clipped to 0..255): the clip
// matters, the kernel overshoots at sharp edges. Per output pixel a pass takes the taps within the
// kernel's support that fall inside the image, and divides by the sum of their weights: the taps
// outside the image are dropped and the rest renormalised. stb_image_resize does the convolution
// (the same kernel and pixel centres, support scaled by the ratio when shrinking) with pixels
// outside the image taken as zero (STBIR_EDGE_ZERO); dividing its output by the weight the in-image
// taps carry (stb's result on a line of ones) gives PIL's border rule. stb is called on float
// strips of rows (horizontal) or columns (vertical), which keeps its buffers small; along the other
// axis the scale is 1 and the kernel is the identity (Catmull-Rom is 1 at 0 and 0 at ±1, ±2).

constexpr int kStrip = 128;

void stb_convolve(const float* src, int in_w, int in_h, float* dst, int out_w, int out_h, int channels) {
  if (!stbir_resize(src, in_w, in_h, 0, dst, out_w, out_h, 0, STBIR_TYPE_FLOAT, channels, STBIR_ALPHA_CHANNEL_NONE, 0,
                    STBIR_EDGE_ZERO, STBIR_EDGE_ZERO, STBIR_FILTER_CATMULLROM, STBIR_FILTER_CATMULLROM,
                    STBIR_COLORSPACE_LINEAR, nullptr))
    throw std::runtime_error("resize_bicubic: stb_image_resize failed (out of memory?)");
}

// The weight carried by each output pixel's in-image taps along an axis of in_len → out_len.
std::vector<float> in_image_weight(int in_len, int out_len) {
  std::vector<float> ones(static_cast<size_t>(in_len), 1.0f), w(static_cast<size_t>(out_len));
  stb_convolve(ones.data(), in_len, 1, w.data(), out_len, 1, 1);
  return w;
}

inline uint8_t store_u8(float v, float weight) {
  if (weight == 0.0f) return 0;  // no tap carries weight (PIL leaves the sum at 0 too)
  v = std::floor(v / weight + 0.5f);
  return v <= 0.0f ? 0 : v >= 255.0f ? 255 : static_cast<uint8_t>(v);
}

RgbImage resample_horizontal(const RgbImage& in, int width) {
  const std::vector<float> weight = in_image_weight(in.width, width);
  RgbImage out;
  out.width = width;
  out.height = in.height;
  out.rgb.resize(size_t(width) * in.height * 3);
  std::vector<float> src, dst(size_t(width) * kStrip * 3);
  const size_t in_row = size_t(in.width) * 3, out_row = size_t(width) * 3;
  for (int y0 = 0; y0 < in.height; y0 += kStrip) {
    const int rows = std::min(kStrip, in.height - y0);
    src.assign(in.rgb.begin() + y0 * in_row, in.rgb.begin() + (y0 + rows) * in_row);
    stb_convolve(src.data(), in.width, rows, dst.data(), width, rows, 3);
    uint8_t* o = out.rgb.data() + y0 * out_row;
    for (int r = 0; r < rows; r++)
      for (int x = 0; x < width; x++)
        for (int c = 0; c < 3; c++, o++) *o = store_u8(dst[(size_t(r) * width + x) * 3 + c], weight[x]);
  }
  return out;
}

RgbImage resample_vertical(const RgbImage& in, int height) {
  const std::vector<float> weight = in_image_weight(in.height, height);
  RgbImage out;
  out.width = in.width;
  out.height = height;
  out.rgb.resize(size_t(in.width) * height * 3);
  std::vector<float> src(size_t(kStrip) * in.height * 3), dst(size_t(kStrip) * height * 3);
  for (int x0 = 0; x0 < in.width; x0 += kStrip) {
    const int cols = std::min(kStrip, in.width - x0);
    const size_t strip_row = size_t(cols) * 3;
    for (int y = 0; y < in.height; y++) {
      const uint8_t* p = in.rgb.data() + (size_t(y) * in.width + x0) * 3;
      std::copy(p, p + strip_row, src.begin() + y * strip_row);
    }
    stb_convolve(src.data(), cols, in.height, dst.data(), cols, height, 3);
    for (int y = 0; y < height; y++) {
      uint8_t* o = out.rgb.data() + (size_t(y) * in.width + x0) * 3;
      const float* d = dst.data() + y * strip_row;
      for (size_t i = 0; i < strip_row; i++) o[i] = store_u8(d[i], weight[y]);
    }
  }
  return out;
}

bool finite_positive(float v) { return std::isfinite(v) && v > 0; }

}  // namespace

void validate_image_spec(const ImageSpec& s) {
  auto bad = [](const std::string& why) { throw std::runtime_error("image spec: " + why); };
  if (s.patch <= 0) bad("patch " + std::to_string(s.patch) + " must be positive");
  if (s.merge <= 0) bad("merge " + std::to_string(s.merge) + " must be positive");
  if (s.temporal <= 0) bad("temporal " + std::to_string(s.temporal) + " must be positive");
  if (s.height <= 0 || s.width <= 0)
    bad("size " + std::to_string(s.height) + "x" + std::to_string(s.width) + " (HxW) must be positive");
  const int64_t unit = int64_t(s.patch) * s.merge;
  if (s.height % unit || s.width % unit)
    bad("size " + std::to_string(s.height) + "x" + std::to_string(s.width) + " (HxW) must be a multiple of patch·merge = " +
        std::to_string(unit) + " on each side");
  if (uint64_t(s.height) * uint64_t(s.width) > kMaxPixels) bad("size " + std::to_string(s.height) + "x" + std::to_string(s.width) + " is too large");
  for (int c = 0; c < 3; c++) {
    if (!std::isfinite(s.mean[c])) bad("mean[" + std::to_string(c) + "] is not finite");
    if (!finite_positive(s.std[c])) bad("std[" + std::to_string(c) + "] = " + std::to_string(s.std[c]) + " must be positive and finite");
  }
}

RgbImage decode_image(const std::string& path) {
  const std::vector<unsigned char> bytes = read_file(path);
  static const unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  RgbImage img;
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) img = decode_jpeg(path, bytes);
  else if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) img = decode_png(path, bytes);
  else if (bytes.empty()) fail(path, "the file is empty, not a JPEG or PNG image");
  else fail(path, "not a JPEG or PNG image (no JPEG or PNG signature at the start of the file)");
  check_size(path, uint64_t(img.width), uint64_t(img.height));
  return img;
}

RgbImage resize_bicubic(const RgbImage& in, int width, int height) {
  if (width <= 0 || height <= 0) throw std::runtime_error("resize_bicubic: target " + std::to_string(width) + "x" + std::to_string(height) + " is empty");
  if (in.width <= 0 || in.height <= 0 || in.rgb.size() != size_t(in.width) * in.height * 3)
    throw std::runtime_error("resize_bicubic: the input image is empty or its buffer does not match its size");
  if (in.width == width && in.height == height) return in;  // PIL: a copy
  if (in.width == width) return resample_vertical(in, height);
  RgbImage horizontal = resample_horizontal(in, width);
  if (in.height == height) return horizontal;
  return resample_vertical(horizontal, height);
}

Pixels patchify_image(const RgbImage& img, const ImageSpec& spec) {
  validate_image_spec(spec);
  if (img.width != spec.width || img.height != spec.height)
    throw std::runtime_error("patchify_image: image is " + std::to_string(img.height) + "x" + std::to_string(img.width) +
                             " (HxW), the spec wants " + std::to_string(spec.height) + "x" + std::to_string(spec.width));
  const int P = spec.patch, M = spec.merge, T = spec.temporal, W = img.width;
  Pixels px;
  px.grid_h = spec.height / P;
  px.grid_w = spec.width / P;
  px.patches = int64_t(px.grid_h) * px.grid_w;
  px.patch_dim = int64_t(3) * T * P * P;
  px.data.resize(size_t(px.patches * px.patch_dim));
  px.decode_ms = px.resize_ms = px.patchify_ms = 0;

  // HF: rescale = float32(float64(v) · (1/255)), then normalize in float32: (x − mean) / std. Every
  // uint8 value maps to one float per channel, so a table gives HF's value bit for bit.
  float lut[3][256];
  for (int c = 0; c < 3; c++)
    for (int v = 0; v < 256; v++) lut[c][v] = (static_cast<float>(double(v) * (1.0 / 255.0)) - spec.mean[c]) / spec.std[c];

  // Row order (Qwen2-VL's patchify): block row, block col, row in block, col in block; column order:
  // channel, temporal copy, row in patch, col in patch.
  const size_t plane = size_t(P) * P;
  float* o = px.data.data();
  for (int bh = 0; bh < px.grid_h / M; bh++)
    for (int bw = 0; bw < px.grid_w / M; bw++)
      for (int mh = 0; mh < M; mh++)
        for (int mw = 0; mw < M; mw++) {
          const int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
          for (int c = 0; c < 3; c++) {
            float* dst = o;
            for (int py = 0; py < P; py++) {
              const uint8_t* src = img.rgb.data() + (size_t(y0 + py) * W + x0) * 3 + c;
              for (int pxi = 0; pxi < P; pxi++) *dst++ = lut[c][src[3 * pxi]];
            }
            for (int t = 1; t < T; t++) std::memcpy(o + t * plane, o, plane * sizeof(float));
            o += T * plane;
          }
        }
  return px;
}

SizedImage decode_and_resize(const std::string& path, const std::function<ImageSize(int, int)>& target) {
  SizedImage out;
  auto t0 = Clock::now();
  out.img = decode_image(path);
  out.decode_ms = ms_since(t0);
  ImageSize size{};
  try {
    size = target(out.img.height, out.img.width);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  if (out.img.width != size.width || out.img.height != size.height) {
    t0 = Clock::now();
    out.img = resize_bicubic(out.img, size.width, size.height);
    out.resize_ms = ms_since(t0);
  }
  return out;
}

Pixels preprocess_image(const std::string& path, const ImageSpec& spec) {
  validate_image_spec(spec);
  const SizedImage sized = decode_and_resize(path, [&](int, int) { return ImageSize{spec.height, spec.width}; });
  const auto t0 = Clock::now();
  Pixels px = patchify_image(sized.img, spec);
  px.patchify_ms = ms_since(t0);
  px.decode_ms = sized.decode_ms;
  px.resize_ms = sized.resize_ms;
  return px;
}

}  // namespace forge
