// Image input (src/image_input.h): refusals name the file; PNG colour types and depths become RGB as
// HF's processor converts them (PIL's reading, then alpha composited onto white); the patch order is
// Qwen2-VL's patchify. The comparison with HF's processor on real JPEGs and PNGs (decode, resize,
// normalise) is test/image-input.test.ts; this file writes its own images with libjpeg and libpng.
#include <unistd.h>

#include <array>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>
#include <zlib.h>

#include "image_input.h"

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/forge-image-XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) throw std::runtime_error("mkdtemp failed");
    path = d;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

std::vector<unsigned char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// A PNG from samples (one value per channel, at `depth` bits; 16-bit values as given).
struct PngSpec {
  int width, height, color_type, depth;
  std::vector<unsigned> samples;  // height · width · channels
  std::vector<png_color> palette;
  std::vector<png_byte> trns_alpha;  // palette tRNS
  bool trns_colour = false;
  png_color_16 trns{};
};

void write_png(const std::string& path, const PngSpec& s) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    FAIL() << "libpng could not write " << path;
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, s.width, s.height, s.depth, s.color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!s.palette.empty()) png_set_PLTE(png, info, s.palette.data(), int(s.palette.size()));
  if (!s.trns_alpha.empty()) png_set_tRNS(png, info, s.trns_alpha.data(), int(s.trns_alpha.size()), nullptr);
  if (s.trns_colour) png_set_tRNS(png, info, nullptr, 0, &s.trns);
  png_write_info(png, info);
  const int channels = s.color_type == PNG_COLOR_TYPE_GRAY || s.color_type == PNG_COLOR_TYPE_PALETTE ? 1
                       : s.color_type == PNG_COLOR_TYPE_GRAY_ALPHA                                     ? 2
                       : s.color_type == PNG_COLOR_TYPE_RGB                                            ? 3
                                                                                                       : 4;
  const size_t per_row = size_t(s.width) * channels;
  std::vector<png_byte> row((per_row * s.depth + 7) / 8);
  for (int y = 0; y < s.height; y++) {
    std::fill(row.begin(), row.end(), 0);
    for (size_t i = 0; i < per_row; i++) {
      const unsigned v = s.samples[y * per_row + i];
      if (s.depth == 16) row[2 * i] = png_byte(v >> 8), row[2 * i + 1] = png_byte(v & 0xff);
      else if (s.depth == 8) row[i] = png_byte(v);
      else row[i * s.depth / 8] |= png_byte(v << (8 - s.depth - (i * s.depth) % 8));
    }
    png_write_row(png, row.data());
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
}

// An RGB (or CMYK) JPEG of a smooth pattern.
void write_jpeg(const std::string& path, int width, int height, bool cmyk = false) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  jpeg_stdio_dest(&c, f);
  c.image_width = width;
  c.image_height = height;
  c.input_components = cmyk ? 4 : 3;
  c.in_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 90, TRUE);
  jpeg_start_compress(&c, TRUE);
  std::vector<JSAMPLE> row(size_t(width) * c.input_components);
  for (int y = 0; y < height; y++) {
    for (int x = 0; x < width; x++)
      for (int k = 0; k < c.input_components; k++) row[size_t(x) * c.input_components + k] = JSAMPLE((x * 3 + y * 5 + k * 60) & 0xff);
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::fclose(f);
}

// The error message of f(), or "" when it does not throw std::runtime_error.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

forge::ImageSpec spec(int h, int w, int patch = 16, int temporal = 2, int merge = 2) {
  return forge::ImageSpec{h, w, patch, temporal, merge, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}};
}

// HF's value for a uint8 sample: float32(float64(v) / 255), then (x − mean) / std in float32.
float hf_value(unsigned v, float mean = 0.5f, float std = 0.5f) {
  return (static_cast<float>(double(v) * (1.0 / 255.0)) - mean) / std;
}

}  // namespace

TEST(ImageInput, RefusesAMissingFileNamingIt) {
  TempDir t;
  const std::string p = t.file("nothing-here.jpg");
  const std::string e = error_of([&] { forge::decode_image(p); });
  EXPECT_EQ(e.rfind(p + ": cannot open image: ", 0), 0u) << e;
  EXPECT_NE(e.find("No such file"), std::string::npos) << e;
  EXPECT_EQ(error_of([&] { forge::preprocess_image(p, spec(32, 32)); }), e);
}

TEST(ImageInput, RefusesAFileThatIsNeitherJpegNorPng) {
  TempDir t;
  const std::string text = t.file("notes.png"), empty = t.file("empty.jpg"), gif = t.file("anim.gif");
  write_all(text, {'h', 'e', 'l', 'l', 'o', '\n'});
  write_all(empty, {});
  write_all(gif, {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0, 0, 0, 0});
  EXPECT_EQ(error_of([&] { forge::decode_image(text); }), text + ": not a JPEG or PNG image (no JPEG or PNG signature at the start of the file)");
  EXPECT_EQ(error_of([&] { forge::decode_image(empty); }), empty + ": the file is empty, not a JPEG or PNG image");
  EXPECT_EQ(error_of([&] { forge::decode_image(gif); }).rfind(gif + ": not a JPEG or PNG image", 0), 0u);
}

TEST(ImageInput, RefusesATruncatedJpegAndPng) {
  TempDir t;
  const std::string whole = t.file("whole.jpg"), cut = t.file("cut.jpg");
  write_jpeg(whole, 96, 64);
  const forge::RgbImage ok = forge::decode_image(whole);
  EXPECT_EQ(ok.width, 96);
  EXPECT_EQ(ok.height, 64);
  std::vector<unsigned char> bytes = read_all(whole);
  for (size_t keep : {bytes.size() / 2, size_t(200), size_t(4)}) {
    write_all(cut, std::vector<unsigned char>(bytes.begin(), bytes.begin() + keep));
    const std::string e = error_of([&] { forge::decode_image(cut); });
    EXPECT_EQ(e.rfind(cut + ": JPEG: ", 0), 0u) << "kept " << keep << ": " << e;
  }
  write_all(cut, std::vector<unsigned char>(bytes.begin(), bytes.begin() + bytes.size() / 2));
  EXPECT_EQ(error_of([&] { forge::decode_image(cut); }), cut + ": JPEG: the data is truncated (premature end of file)");

  const std::string png = t.file("whole.png"), png_cut = t.file("cut.png");
  PngSpec s{64, 48, PNG_COLOR_TYPE_RGB, 8, {}, {}, {}, false, {}};
  for (int i = 0; i < 64 * 48 * 3; i++) s.samples.push_back(unsigned(i * 7919) & 0xff);
  write_png(png, s);
  bytes = read_all(png);
  write_all(png_cut, std::vector<unsigned char>(bytes.begin(), bytes.begin() + bytes.size() / 2));
  EXPECT_EQ(error_of([&] { forge::decode_image(png_cut); }), png_cut + ": PNG: the data is truncated (premature end of file)");
  // A corrupt chunk: libpng's own message, after the file's name.
  bytes[40] ^= 0xff;
  write_all(png_cut, bytes);
  EXPECT_EQ(error_of([&] { forge::decode_image(png_cut); }).rfind(png_cut + ": PNG: ", 0), 0u);
}

TEST(ImageInput, RefusesCmykJpegAndDecompressionBombs) {
  TempDir t;
  const std::string cmyk = t.file("cmyk.jpg");
  write_jpeg(cmyk, 32, 32, true);
  EXPECT_EQ(error_of([&] { forge::decode_image(cmyk); }), cmyk + ": JPEG: CMYK/YCCK JPEG is not supported (convert it to RGB)");
  // 20000 x 20000 = 400M pixels, over PIL's limit: refused from the header, before any pixel is read.
  const std::string bomb = t.file("bomb.png");
  PngSpec s{1, 1, PNG_COLOR_TYPE_GRAY, 8, {0}, {}, {}, false, {}};
  write_png(bomb, s);
  std::vector<unsigned char> bytes = read_all(bomb);
  // IHDR's width and height at offsets 16 and 20; its CRC over type + data at 29.
  for (int off : {16, 20}) bytes[off] = 0, bytes[off + 1] = 0, bytes[off + 2] = 0x4e, bytes[off + 3] = 0x20;
  const uLong crc = crc32(crc32(0, nullptr, 0), bytes.data() + 12, 17);
  for (int i = 0; i < 4; i++) bytes[29 + i] = (unsigned char)(crc >> (24 - 8 * i));
  write_all(bomb, bytes);
  EXPECT_EQ(error_of([&] { forge::decode_image(bomb); }),
            bomb + ": PNG: image is 20000x20000 pixels, over PIL's decompression-bomb limit of 178956970");
}

// Every PNG form PIL opens, as HF's processor converts it to RGB.
TEST(ImageInput, ConvertsPngFormsAsHfDoes) {
  TempDir t;
  const int W = 4, H = 2;
  auto decode = [&](const std::string& name, const PngSpec& s) {
    const std::string p = t.file(name);
    write_png(p, s);
    forge::RgbImage img = forge::decode_image(p);
    EXPECT_EQ(img.width, W);
    EXPECT_EQ(img.height, H);
    return img.rgb;
  };
  auto grey = [](std::initializer_list<unsigned> v) {
    std::vector<uint8_t> out;
    for (unsigned x : v) out.insert(out.end(), {uint8_t(x), uint8_t(x), uint8_t(x)});
    return out;
  };
  // 16-bit RGB: the high byte of each sample (PIL's RGB;16B).
  PngSpec rgb16{W, H, PNG_COLOR_TYPE_RGB, 16, {}, {}, {}, false, {}};
  for (int i = 0; i < W * H * 3; i++) rgb16.samples.push_back(unsigned(i) * 2741u + 255u);
  std::vector<uint8_t> want;
  for (unsigned v : rgb16.samples) want.push_back(uint8_t(v >> 8));
  EXPECT_EQ(decode("rgb16.png", rgb16), want);
  // 16-bit grey: PIL's I;16, whose convert("RGB") saturates at 255 rather than scaling.
  EXPECT_EQ(decode("grey16.png", {W, H, PNG_COLOR_TYPE_GRAY, 16, {0, 7, 255, 256, 1000, 65535, 128, 254}, {}, {}, false, {}}),
            grey({0, 7, 255, 255, 255, 255, 128, 254}));
  // 8-bit grey replicated; 2-bit grey scaled by 85, 1-bit by 255.
  EXPECT_EQ(decode("grey8.png", {W, H, PNG_COLOR_TYPE_GRAY, 8, {0, 1, 2, 3, 100, 200, 254, 255}, {}, {}, false, {}}),
            grey({0, 1, 2, 3, 100, 200, 254, 255}));
  EXPECT_EQ(decode("grey2.png", {W, H, PNG_COLOR_TYPE_GRAY, 2, {0, 1, 2, 3, 3, 2, 1, 0}, {}, {}, false, {}}),
            grey({0, 85, 170, 255, 255, 170, 85, 0}));
  EXPECT_EQ(decode("grey1.png", {W, H, PNG_COLOR_TYPE_GRAY, 1, {0, 1, 1, 0, 1, 0, 0, 1}, {}, {}, false, {}}),
            grey({0, 255, 255, 0, 255, 0, 0, 255}));
  // Palette: looked up.
  const std::vector<png_color> pal = {{10, 20, 30}, {40, 50, 60}, {70, 80, 90}, {250, 0, 5}};
  EXPECT_EQ(decode("palette.png", {W, H, PNG_COLOR_TYPE_PALETTE, 8, {0, 1, 2, 3, 3, 2, 1, 0}, pal, {}, false, {}}),
            (std::vector<uint8_t>{10, 20, 30, 40, 50, 60, 70, 80, 90, 250, 0, 5, 250, 0, 5, 70, 80, 90, 40, 50, 60, 10, 20, 30}));
  // Alpha: composited onto white with PIL's integer alpha_composite (values checked against Pillow:
  // (0, a 128) → 127, (100, a 1) → 254, (200, a 254) → 200, a 0 → 255, a 255 → the value).
  PngSpec rgba{W, H, PNG_COLOR_TYPE_RGB_ALPHA, 8, {}, {}, {}, false, {}};
  const unsigned px[8][2] = {{0, 128}, {100, 1}, {200, 254}, {0, 0}, {37, 255}, {255, 0}, {90, 255}, {0, 128}};
  for (auto& p : px) rgba.samples.insert(rgba.samples.end(), {p[0], p[0], p[0], p[1]});
  const std::vector<uint8_t> composited = grey({127, 254, 200, 255, 37, 255, 90, 127});
  EXPECT_EQ(decode("rgba.png", rgba), composited);
  PngSpec la{W, H, PNG_COLOR_TYPE_GRAY_ALPHA, 8, {}, {}, {}, false, {}};
  for (auto& p : px) la.samples.insert(la.samples.end(), {p[0], p[1]});
  EXPECT_EQ(decode("la.png", la), composited);
  PngSpec rgba16 = rgba;
  rgba16.depth = 16;
  for (unsigned& v : rgba16.samples) v = v * 257;
  EXPECT_EQ(decode("rgba16.png", rgba16), composited);
  // Palette with tRNS alphas; RGB and grey with a tRNS colour (that colour becomes white).
  EXPECT_EQ(decode("palette-trns.png", {W, H, PNG_COLOR_TYPE_PALETTE, 8, {0, 1, 2, 3, 3, 2, 1, 0}, pal, {255, 0, 128}, false, {}}),
            (std::vector<uint8_t>{10, 20, 30, 255, 255, 255, 162, 167, 172, 250, 0, 5, 250, 0, 5, 162, 167, 172, 255, 255, 255, 10, 20, 30}));
  PngSpec key{W, H, PNG_COLOR_TYPE_RGB, 8, {}, {}, {}, true, {}};
  key.trns.red = 1, key.trns.green = 2, key.trns.blue = 3;
  for (int i = 0; i < W * H; i++) key.samples.insert(key.samples.end(), {1u, 2u, unsigned(i % 2 ? 3 : 4)});
  EXPECT_EQ(decode("rgb-trns.png", key), (std::vector<uint8_t>{1, 2, 4, 255, 255, 255, 1, 2, 4, 255, 255, 255, 1, 2, 4, 255, 255, 255, 1, 2, 4, 255, 255, 255}));
  PngSpec gkey{W, H, PNG_COLOR_TYPE_GRAY, 8, {5, 6, 5, 6, 5, 6, 5, 6}, {}, {}, true, {}};
  gkey.trns.gray = 6;
  EXPECT_EQ(decode("grey-trns.png", gkey), grey({5, 255, 5, 255, 5, 255, 5, 255}));
}

TEST(ImageInput, ValidatesTheSpec) {
  EXPECT_NO_THROW(forge::validate_image_spec(spec(512, 512)));
  EXPECT_NO_THROW(forge::validate_image_spec(spec(96, 128)));
  EXPECT_EQ(error_of([] { forge::validate_image_spec(spec(100, 128)); }),
            "image spec: size 100x128 (HxW) must be a multiple of patch·merge = 32 on each side");
  EXPECT_EQ(error_of([] { forge::validate_image_spec(spec(96, 0)); }), "image spec: size 96x0 (HxW) must be positive");
  EXPECT_EQ(error_of([] { forge::validate_image_spec(spec(96, 128, 0)); }), "image spec: patch 0 must be positive");
  EXPECT_EQ(error_of([] { forge::validate_image_spec(spec(96, 128, 16, 0)); }), "image spec: temporal 0 must be positive");
  EXPECT_EQ(error_of([] { forge::validate_image_spec(spec(96, 128, 16, 2, -1)); }), "image spec: merge -1 must be positive");
  forge::ImageSpec s = spec(96, 128);
  s.std[1] = 0;
  EXPECT_EQ(error_of([&] { forge::validate_image_spec(s); }).rfind("image spec: std[1] = 0", 0), 0u);
  s = spec(96, 128);
  s.mean[2] = NAN;
  EXPECT_EQ(error_of([&] { forge::validate_image_spec(s); }), "image spec: mean[2] is not finite");
  // preprocess_image checks the spec before it reads the file.
  EXPECT_EQ(error_of([] { forge::preprocess_image("/nonexistent.png", spec(100, 128)); }).rfind("image spec: ", 0), 0u);
}

// Qwen2-VL's patchify: numpy reshape (C, gh/M, M, P, gw/M, M, P) → transpose (1, 4, 2, 5, 0, 3, 6)
// → a temporal axis after C → reshape (gh·gw, C·T·P·P). Walked here in the output's own order.
TEST(ImageInput, PatchOrderIsQwen2VlMergeBlocks) {
  const int H = 8, W = 12, P = 2, M = 2, T = 3;
  forge::RgbImage img;
  img.width = W;
  img.height = H;
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++)
      for (int c = 0; c < 3; c++) img.rgb.push_back(uint8_t(y * 31 + x * 7 + c * 80));
  forge::ImageSpec s = spec(H, W, P, T, M);
  s.mean[0] = 0.1f, s.mean[1] = 0.2f, s.mean[2] = 0.3f;
  s.std[0] = 0.25f, s.std[1] = 0.5f, s.std[2] = 2.0f;
  const forge::Pixels px = forge::patchify_image(img, s);
  ASSERT_EQ(px.grid_h, H / P);
  ASSERT_EQ(px.grid_w, W / P);
  ASSERT_EQ(px.patches, (H / P) * (W / P));
  ASSERT_EQ(px.patch_dim, 3 * T * P * P);
  ASSERT_EQ(px.data.size(), size_t(px.patches * px.patch_dim));
  size_t i = 0;
  for (int bh = 0; bh < H / P / M; bh++)
    for (int bw = 0; bw < W / P / M; bw++)
      for (int mh = 0; mh < M; mh++)
        for (int mw = 0; mw < M; mw++)
          for (int c = 0; c < 3; c++)
            for (int t = 0; t < T; t++)
              for (int ph = 0; ph < P; ph++)
                for (int pw = 0; pw < P; pw++, i++) {
                  const int y = (bh * M + mh) * P + ph, x = (bw * M + mw) * P + pw;
                  ASSERT_EQ(px.data[i], hf_value(img.rgb[(size_t(y) * W + x) * 3 + c], s.mean[c], s.std[c]))
                      << "row " << i / px.patch_dim << " col " << i % px.patch_dim;
                }
  // Spot checks by hand: row 1 is the block's top-right patch (x from 2), row 2 its bottom-left
  // (y from 2), row 4 the next block to the right (x from 4); column P·P is the temporal copy.
  auto at = [&](int row, int col) { return px.data[size_t(row) * px.patch_dim + col]; };
  auto want = [&](int y, int x, int c) { return hf_value(img.rgb[(size_t(y) * W + x) * 3 + c], s.mean[c], s.std[c]); };
  EXPECT_EQ(at(1, 0), want(0, 2, 0));
  EXPECT_EQ(at(2, 0), want(2, 0, 0));
  EXPECT_EQ(at(4, 0), want(0, 4, 0));
  EXPECT_EQ(at(0, 1), want(0, 1, 0));
  EXPECT_EQ(at(0, P), want(1, 0, 0));
  EXPECT_EQ(at(0, P * P), want(0, 0, 0));
  EXPECT_EQ(at(0, T * P * P), want(0, 0, 1));
  EXPECT_EQ(at((W / P / M) * M * M, 0), want(4, 0, 0));  // block row 1 (y from M·P)

  s.height = 10;
  EXPECT_NE(error_of([&] { forge::patchify_image(img, s); }), "");
}

// A PNG at the spec's size goes through unresized: every value is HF's for its pixel, in order.
TEST(ImageInput, PreprocessAtTheSpecSizeIsExact) {
  TempDir t;
  const int H = 64, W = 96;
  PngSpec s{W, H, PNG_COLOR_TYPE_RGB, 8, {}, {}, {}, false, {}};
  for (int i = 0; i < W * H * 3; i++) s.samples.push_back(unsigned(i * 2654435761u >> 24));
  const std::string p = t.file("exact.png");
  write_png(p, s);
  const forge::Pixels px = forge::preprocess_image(p, spec(H, W));
  EXPECT_EQ(px.resize_ms, 0.0);
  EXPECT_GE(px.decode_ms, 0.0);
  ASSERT_EQ(px.patches, (H / 16) * (W / 16));
  ASSERT_EQ(px.patch_dim, 1536);
  // Row r, column c·T·P·P + ph·P + pw of the first temporal copy.
  const int bw_n = W / 32;
  for (int row = 0; row < px.patches; row++) {
    const int block = row / 4, mh = (row % 4) / 2, mw = row % 2;
    const int y0 = ((block / bw_n) * 2 + mh) * 16, x0 = ((block % bw_n) * 2 + mw) * 16;
    for (int c = 0; c < 3; c++)
      for (int ph = 0; ph < 16; ph++)
        for (int pw = 0; pw < 16; pw++) {
          const float v = hf_value(s.samples[(size_t(y0 + ph) * W + x0 + pw) * 3 + c]);
          const size_t base = size_t(row) * 1536 + size_t(c) * 512 + ph * 16 + pw;
          ASSERT_EQ(px.data[base], v);
          ASSERT_EQ(px.data[base + 256], v);  // temporal copy
        }
  }
}

TEST(ImageInput, ResizeKeepsAFlatImageFlatAndHasTheTargetSize) {
  for (auto [w, h, ow, oh] : {std::array<int, 4>{7, 5, 64, 32}, {300, 200, 32, 64}, {1, 1, 32, 32}, {40, 40, 40, 96}}) {
    forge::RgbImage img;
    img.width = w;
    img.height = h;
    for (int i = 0; i < w * h; i++) img.rgb.insert(img.rgb.end(), {12, 200, 255});
    const forge::RgbImage out = forge::resize_bicubic(img, ow, oh);
    ASSERT_EQ(out.width, ow);
    ASSERT_EQ(out.height, oh);
    ASSERT_EQ(out.rgb.size(), size_t(ow) * oh * 3);
    for (size_t i = 0; i < out.rgb.size(); i += 3) {
      ASSERT_EQ(out.rgb[i], 12) << w << "x" << h << " -> " << ow << "x" << oh << " at " << i / 3;
      ASSERT_EQ(out.rgb[i + 1], 200);
      ASSERT_EQ(out.rgb[i + 2], 255);
    }
  }
}
