// qhx_pixels <image> --size HxW [--patch 16] [--temporal 2] [--merge 2] [--mean a,b,c] [--std a,b,c]
//            --out FILE.bin [--json]
// qhx_pixels <image> --soft-tokens N [--patch 16] [--pooling 3] --out FILE.bin [--positions FILE.bin]
//            [--json]
// Runs the runtime's image pre-processing on one JPEG or PNG.
// --size (src/image_input.h, Qwen2/3-VL's fixed grid): decode, stretch to H×W with PIL's bicubic,
// rescale 1/255, (x − mean) / std, Qwen2-VL patchify with the frame repeated `temporal` times.
// Writes the patches as raw little-endian float32 [patches, patch_dim] to FILE.bin and prints one
// line: with --json {"patches", "patch_dim", "grid": [grid_h, grid_w], "timings": {"decode_ms",
// "resize_ms", "patchify_ms"}}. mean and std default to 0.5 (Qwen2/3-VL's processors).
// --soft-tokens (src/gemma4_image.h, Gemma 4's processor at a budget of N soft tokens, one of 70,
// 140, 280, 560, 1120): decode, aspect-preserving PIL bicubic resize, rescale 1/255, channel-last
// patches padded to N · pooling² rows. Writes pixel_values as raw little-endian float32 [patches,
// 3 · patch²] to FILE.bin and, with --positions, pixel_position_ids as raw little-endian int32
// [patches, 2] ((x, y); padding −1); with --json prints {"patches", "patch_dim", "soft_tokens",
// "size": [height, width] (resized), "grid": [grid_h, grid_w], "timings": {...}}.
// Any error: one line on stderr, exit status 1.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gemma4_image.h"
#include "image_input.h"

namespace {

const char* kUsage =
    "usage: qhx_pixels <image> --size HxW [--patch 16] [--temporal 2] [--merge 2] [--mean a,b,c] [--std a,b,c] --out FILE.bin [--json]\n"
    "       qhx_pixels <image> --soft-tokens N [--patch 16] [--pooling 3] --out FILE.bin [--positions FILE.bin] [--json]";

int parse_int(const std::string& opt, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || errno || x < -2147483647L || x > 2147483647L)
    throw std::runtime_error(opt + ": '" + v + "' is not an integer");
  return static_cast<int>(x);
}

void parse_floats3(const std::string& opt, const std::string& v, float out[3]) {
  std::vector<float> xs;
  size_t start = 0;
  while (true) {
    size_t comma = v.find(',', start);
    std::string item = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    float x = std::strtof(item.c_str(), &end);
    if (item.empty() || *end) throw std::runtime_error(opt + ": '" + item + "' is not a number (want a,b,c)");
    xs.push_back(x);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (xs.size() == 1) xs = {xs[0], xs[0], xs[0]};
  if (xs.size() != 3) throw std::runtime_error(opt + ": want 3 comma-separated numbers (or one for all channels), got " + std::to_string(xs.size()));
  for (int c = 0; c < 3; c++) out[c] = xs[c];
}

// Raw bytes of a little-endian host's array to path (both modes' outputs).
void write_raw(const std::string& path, const void* data, size_t bytes) {
  const uint32_t probe = 1;
  if (*reinterpret_cast<const uint8_t*>(&probe) != 1) throw std::runtime_error("big-endian host: " + path + " would not be little-endian");
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error(path + ": cannot write: " + std::strerror(errno));
  const bool ok = std::fwrite(data, 1, bytes, f) == bytes;
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
}

nlohmann::json timings(double decode_ms, double resize_ms, double patchify_ms) {
  return {{"decode_ms", decode_ms}, {"resize_ms", resize_ms}, {"patchify_ms", patchify_ms}};
}

int run(int argc, char** argv) {
  std::string image, out, size, positions;
  forge::ImageSpec spec{0, 0, 16, 2, 2, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}};
  forge::Gemma4ImageSpec gemma{0};
  bool as_json = false, gemma_mode = false;
  std::string fixed_only, gemma_only;  // an option of the other mode, for the error
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value; " + kUsage);
      return argv[++i];
    };
    if (a == "--size" || a == "--temporal" || a == "--merge" || a == "--mean" || a == "--std") fixed_only = a;
    if (a == "--pooling" || a == "--positions") gemma_only = a;
    if (a == "--size") size = value();
    else if (a == "--soft-tokens") gemma_mode = true, gemma.max_soft_tokens = parse_int(a, value());
    else if (a == "--patch") spec.patch = gemma.patch = parse_int(a, value());
    else if (a == "--temporal") spec.temporal = parse_int(a, value());
    else if (a == "--merge") spec.merge = parse_int(a, value());
    else if (a == "--mean") parse_floats3(a, value(), spec.mean);
    else if (a == "--std") parse_floats3(a, value(), spec.std);
    else if (a == "--pooling") gemma.pooling = parse_int(a, value());
    else if (a == "--positions") positions = value();
    else if (a == "--out") out = value();
    else if (a == "--json") as_json = true;
    else if (a == "--help" || a == "-h") { std::cout << kUsage << "\n"; return 0; }
    else if (a.rfind("--", 0) == 0) throw std::runtime_error("unknown option " + a + "; " + kUsage);
    else if (image.empty()) image = a;
    else throw std::runtime_error("more than one image given ('" + image + "', '" + a + "'); " + kUsage);
  }
  if (image.empty()) throw std::runtime_error(std::string("no image given; ") + kUsage);
  if (gemma_mode && !fixed_only.empty()) throw std::runtime_error(fixed_only + " is not an option of --soft-tokens (Gemma 4); " + kUsage);
  if (!gemma_mode && !gemma_only.empty()) throw std::runtime_error(gemma_only + " needs --soft-tokens N (Gemma 4); " + kUsage);
  if (!gemma_mode && size.empty()) throw std::runtime_error(std::string("--size HxW or --soft-tokens N is required; ") + kUsage);
  if (out.empty()) throw std::runtime_error(std::string("--out FILE.bin is required; ") + kUsage);
  static_assert(sizeof(float) == 4, "float32");

  if (gemma_mode) {
    forge::Gemma4Pixels px = forge::preprocess_gemma4_image(image, gemma);
    write_raw(out, px.pixel_values.data(), px.pixel_values.size() * sizeof(float));
    if (!positions.empty()) write_raw(positions, px.positions.data(), px.positions.size() * sizeof(int32_t));
    if (as_json) {
      nlohmann::json j = {{"patches", px.patches},       {"patch_dim", px.patch_dim},
                          {"soft_tokens", px.soft_tokens}, {"size", {px.height, px.width}},
                          {"grid", {px.grid_h, px.grid_w}}, {"timings", timings(px.decode_ms, px.resize_ms, px.patchify_ms)}};
      std::cout << j.dump() << "\n";
    } else {
      std::printf("%lld patches x %lld values, %d soft tokens, image %dx%d (HxW); decode %.2f ms, resize %.2f ms, patchify %.2f ms\n",
                  static_cast<long long>(px.patches), static_cast<long long>(px.patch_dim), px.soft_tokens, px.height, px.width,
                  px.decode_ms, px.resize_ms, px.patchify_ms);
    }
    return 0;
  }

  const size_t x = size.find('x');
  if (x == std::string::npos) throw std::runtime_error("--size: '" + size + "' is not HxW (like 512x512)");
  spec.height = parse_int("--size", size.substr(0, x));
  spec.width = parse_int("--size", size.substr(x + 1));

  forge::Pixels px = forge::preprocess_image(image, spec);
  write_raw(out, px.data.data(), px.data.size() * sizeof(float));

  if (as_json) {
    nlohmann::json j = {{"patches", px.patches},
                        {"patch_dim", px.patch_dim},
                        {"grid", {px.grid_h, px.grid_w}},
                        {"timings", timings(px.decode_ms, px.resize_ms, px.patchify_ms)}};
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%lld patches x %lld values, grid %dx%d; decode %.2f ms, resize %.2f ms, patchify %.2f ms\n",
                static_cast<long long>(px.patches), static_cast<long long>(px.patch_dim), px.grid_h, px.grid_w, px.decode_ms,
                px.resize_ms, px.patchify_ms);
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
    std::cerr << "qhx_pixels: error: " << msg << "\n";
    return 1;
  }
}
