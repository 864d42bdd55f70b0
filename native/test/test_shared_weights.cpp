// Weights shared and mapped, not copied (shared_weights.h): two graphs over one data file read one
// mapping and add no private copy; a bf16 or fp16 weight behind a Cast stays mapped (not folded);
// bad external data is refused in one line naming the model, the tensor and the file. Memory is
// read from /proc/self/status around the sessions; each test also loads the same graphs with ORT's
// default settings (how the runtime used to) and sees the copies, so the measurement can fail.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "bundle_env.h"
#include "executor.h"
#include "manifest.h"
#include "onnx_initializers.h"
#include "shared_weights.h"

namespace fs = std::filesystem;

namespace {

// The fixtures' shapes (native/tools/gen_weight_fixtures.py).
constexpr int64_t K = 2048, N = 4096;
constexpr int64_t kWeightF32Bytes = N * K * 4;   // 32 MiB
constexpr int64_t kWeight16Bytes = N * K * 2;    // 16 MiB (bf16 or fp16)

// Multiples of 1/256 in [-0.38, 0.38]: exact in float32, bfloat16 and float16 alike, so every
// form of the weight computes the same reference.
float weight(int64_t n, int64_t k) { return float((n * 131 + k * 31) % 197 - 98) / 256.0f; }
float bias(int64_t n) { return float(n % 7) * 0.01f; }
float input(int64_t r, int64_t k) { return float((r * 17 + k * 13) % 29) / 29.0f - 0.5f; }
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
uint16_t bf16_bits(float f) { return uint16_t(bits(f) >> 16); }  // exact: the low 16 bits are zero
uint16_t f16_bits(float f) {                                      // exact for these normal values
  uint32_t u = bits(f);
  if ((u & 0x7fffffff) == 0) return uint16_t(u >> 16);
  return uint16_t(((u >> 16) & 0x8000) | ((((u >> 23) & 0xff) - 112) << 10) | ((u >> 13) & 0x3ff));
}

/** A scratch directory with the fixture graphs and their data files written next to them. */
struct Scratch {
  std::string dir;
  explicit Scratch(bool truncate_weights = false) {
    char tmpl[] = "/tmp/forge-weights-XXXXXX";
    dir = mkdtemp(tmpl);
    for (const char* f : {"decode.onnx", "prefill.onnx", "cast_bf16.onnx", "cast_f16.onnx", "misaligned.onnx"})
      fs::copy_file(std::string(FORGE_FIXTURES_DIR) + "/weights/" + f, dir + "/" + f);
    std::ofstream w(dir + "/weights.data", std::ios::binary), b(dir + "/weights_bf16.data", std::ios::binary),
        h(dir + "/weights_f16.data", std::ios::binary);
    std::vector<float> row(K);
    std::vector<uint16_t> row_bf16(K), row_f16(K);
    for (int64_t n = 0; n < N; n++) {
      for (int64_t k = 0; k < K; k++) {
        row[k] = weight(n, k);
        row_bf16[k] = bf16_bits(row[k]);
        row_f16[k] = f16_bits(row[k]);
      }
      w.write(reinterpret_cast<const char*>(row.data()), K * 4);
      b.write(reinterpret_cast<const char*>(row_bf16.data()), K * 2);
      h.write(reinterpret_cast<const char*>(row_f16.data()), K * 2);
    }
    if (!truncate_weights)
      for (int64_t n = 0; n < N; n++) {
        float v = bias(n);
        w.write(reinterpret_cast<const char*>(&v), 4);
      }
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string operator/(const char* f) const { return dir + "/" + f; }
};

std::unique_ptr<Ort::Session> open_shared(Ort::Env& env, forge::SharedWeights& w, const std::string& model) {
  Ort::SessionOptions so;
  so.SetIntraOpNumThreads(1);
  so.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
  forge::configure_cpu_session(so);
  w.add_to(so, model);
  return std::make_unique<Ort::Session>(env, model.c_str(), so);
}

/** How the runtime opened graphs before shared weights: ORT's defaults at ORT_ENABLE_ALL. */
std::unique_ptr<Ort::Session> open_default(Ort::Env& env, const std::string& model) {
  Ort::SessionOptions so;
  so.SetIntraOpNumThreads(1);
  so.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
  return std::make_unique<Ort::Session>(env, model.c_str(), so);
}

/** Runs x[rows, K] through the graph and checks y against x·Wᵀ (+ B) computed here in double. */
void expect_linear(Ort::Session& s, int64_t rows, bool with_bias) {
  std::vector<float> x(rows * K), y(rows * N);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < K; k++) x[r * K + k] = input(r, k);
  auto cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<int64_t> xs{rows, K}, ys{rows, N};
  Ort::Value xv = Ort::Value::CreateTensor<float>(cpu, x.data(), x.size(), xs.data(), 2);
  Ort::Value yv = Ort::Value::CreateTensor<float>(cpu, y.data(), y.size(), ys.data(), 2);
  const char* in[] = {"x"};
  const char* out[] = {"y"};
  s.Run(Ort::RunOptions{}, in, &xv, 1, out, &yv, 1);
  int bad = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t n = 0; n < N; n++) {
      double ref = with_bias ? bias(n) : 0.0;
      for (int64_t k = 0; k < K; k++) ref += double(input(r, k)) * weight(n, k);
      if (std::fabs(y[r * N + n] - ref) > 1e-3 && bad++ < 3) ADD_FAILURE() << "y[" << r << "," << n << "] = " << y[r * N + n] << ", expected " << ref;
    }
  EXPECT_EQ(bad, 0);
}

double mib(int64_t b) { return double(b) / (1 << 20); }

}  // namespace

TEST(SharedWeights, TwoGraphsOverOneDataFileReadOneMappingAndAddNoPrivateCopy) {
  Scratch s;
  Ort::Env env(ORT_LOGGING_LEVEL_FATAL, "test");
  forge::SharedWeights w;
  const forge::ProcessMemory m0 = forge::process_memory();
  auto decode = open_shared(env, w, s / "decode.onnx");
  auto prefill = open_shared(env, w, s / "prefill.onnx");
  expect_linear(*decode, 1, true);
  expect_linear(*prefill, 8, true);
  const forge::ProcessMemory m1 = forge::process_memory();
  std::printf("[ memory   ] shared: +%.1f MiB private, +%.1f MiB file-backed for a %.0f MiB weight read by 2 graphs\n", mib(m1.anon - m0.anon),
              mib(m1.file - m0.file), mib(kWeightF32Bytes));
  EXPECT_LT(m1.anon - m0.anon, kWeightF32Bytes / 4) << "the sessions hold a private copy of the weight";
  // Both graphs ran over every weight byte: one mapping's pages, counted once (a mapping per
  // session would count them twice).
  EXPECT_GE(m1.file - m0.file, kWeightF32Bytes * 9 / 10);
  EXPECT_LT(m1.file - m0.file, kWeightF32Bytes * 3 / 2);
  EXPECT_EQ(w.stats().files, 1u);
  EXPECT_EQ(w.stats().tensors, 2u);  // W and B, once each
  EXPECT_EQ(w.stats().uses, 4u);     // each in both graphs
  EXPECT_EQ(w.stats().tensor_bytes, uint64_t(kWeightF32Bytes + N * 4));

  // The control: ORT's defaults prepack a private copy per session.
  auto d2 = open_default(env, s / "decode.onnx");
  auto p2 = open_default(env, s / "prefill.onnx");
  const forge::ProcessMemory m2 = forge::process_memory();
  std::printf("[ memory   ] ORT defaults: +%.1f MiB private for the same 2 graphs\n", mib(m2.anon - m1.anon));
  EXPECT_GE(m2.anon - m1.anon, kWeightF32Bytes * 3 / 2) << "the measurement no longer sees ORT's per-session copies";
}

/** A 16-bit weight behind Cast(to=FLOAT) under the runtime's settings: mapped at load, read from the
 *  mapping by a run, and the Cast's fp32 output returned once the run is over. Then
 *  the control: the same graph with the optimizations that fold the Cast adds the fp32 copy. */
void expect_cast_stays_mapped(const char* model, GraphOptimizationLevel folding_level, bool constant_folding) {
  Scratch s;
  Ort::Env env(ORT_LOGGING_LEVEL_FATAL, "test");
  forge::SharedWeights w;
  const forge::ProcessMemory m0 = forge::process_memory();
  auto cast = open_shared(env, w, s / model);
  const forge::ProcessMemory m1 = forge::process_memory();
  std::printf("[ memory   ] %s loaded: +%.1f MiB private (fp32 weight %.0f MiB)\n", model, mib(m1.anon - m0.anon), mib(kWeightF32Bytes));
  EXPECT_LT(m1.anon - m0.anon, kWeightF32Bytes / 4) << "the Cast was folded into a private fp32 weight";
  expect_linear(*cast, 1, false);
  const forge::ProcessMemory m2 = forge::process_memory();
  std::printf("[ memory   ] %s after a run: +%.1f MiB private, +%.1f MiB file-backed\n", model, mib(m2.anon - m0.anon), mib(m2.file - m0.file));
  EXPECT_GE(m2.file - m0.file, kWeight16Bytes * 9 / 10) << "the run did not read the 16-bit weight from the mapping";
  EXPECT_LT(m2.anon - m0.anon, kWeightF32Bytes / 4) << "the Cast's fp32 output stayed allocated after the run";

  Ort::SessionOptions so;
  so.SetIntraOpNumThreads(1);
  so.SetGraphOptimizationLevel(folding_level);
  so.AddConfigEntry("session.disable_prepacking", "1");
  so.DisableCpuMemArena();
  if (!constant_folding) so.AddConfigEntry("optimization.disable_specified_optimizers", "ConstantFolding");
  forge::SharedWeights w2;
  w2.add_to(so, s / model);
  const forge::ProcessMemory m3 = forge::process_memory();
  Ort::Session folded(env, (s / model).c_str(), so);
  const forge::ProcessMemory m4 = forge::process_memory();
  std::printf("[ memory   ] %s with the folding optimizations: +%.1f MiB private at load\n", model, mib(m4.anon - m3.anon));
  EXPECT_GE(m4.anon - m3.anon, kWeightF32Bytes * 9 / 10) << "ORT no longer folds this Cast: are the runtime's settings still needed?";
}

TEST(SharedWeights, Bf16WeightBehindACastStaysMappedInsteadOfFoldingToAPrivateFp32Copy) {
  // ConstantFolding (level 1) is what folds a bf16 Cast.
  expect_cast_stays_mapped("cast_bf16.onnx", ORT_ENABLE_LAYOUT, /*constant_folding=*/true);
}

TEST(SharedWeights, Fp16WeightBehindACastStaysMappedInsteadOfFoldingToAPrivateFp32Copy) {
  // With ConstantFolding off, ORT_ENABLE_ALL's level above ORT_ENABLE_LAYOUT still folds an fp16
  // Cast (FuseFp16InitializerToFp32NodeTransformer, which the disable list does not reach).
  expect_cast_stays_mapped("cast_f16.onnx", ORT_ENABLE_ALL, /*constant_folding=*/false);
}

TEST(SharedWeights, RefusesATensorPastTheEndOfItsFileNamingModelTensorAndFile) {
  Scratch s(/*truncate_weights=*/true);
  forge::SharedWeights w;
  Ort::SessionOptions so;
  try {
    w.add_to(so, s / "decode.onnx");
    FAIL() << "a truncated weights.data was accepted";
  } catch (const std::runtime_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("decode.onnx"), std::string::npos) << m;
    EXPECT_NE(m.find("initializer 'B'"), std::string::npos) << m;
    EXPECT_NE(m.find("weights.data"), std::string::npos) << m;
    EXPECT_NE(m.find("past the end"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(SharedWeights, RefusesATensorNotAlignedToItsElementSize) {
  Scratch s;
  forge::SharedWeights w;
  Ort::SessionOptions so;
  try {
    w.add_to(so, s / "misaligned.onnx");
    FAIL() << "a float tensor at offset 2 was accepted";
  } catch (const std::runtime_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("misaligned.onnx: initializer 'W' starts at offset 2"), std::string::npos) << m;
    EXPECT_NE(m.find("not a multiple of its element size 4"), std::string::npos) << m;
  }
}

TEST(SharedWeights, RefusesAGraphFileThatIsNotOnnxInOneLineNamingIt) {
  Scratch s;
  const std::string bad = s / "bad.onnx";
  std::ofstream(bad, std::ios::binary) << std::string("\x3a\xff\xff\xff\x0f", 5);  // graph field, length past the end
  try {
    forge::read_external_initializers(bad);
    FAIL() << "a truncated protobuf was accepted";
  } catch (const forge::OnnxFileError& e) {
    EXPECT_EQ(std::string(e.what()), bad + ": not a readable ONNX model (a field runs past the end of the file)");
  }
}

TEST(SharedWeights, ExecutorSharesEachShardFileBetweenItsPrefillAndDecodeGraphs) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  forge::Manifest m = forge::load_manifest(bundle + "/manifest.json", bundle);
  forge::Executor exec(m, forge::ExecutorOptions{});
  // A reference bundle's contexts can list one checkpoint file each (read in place): it is mapped once.
  std::set<std::string> paths;
  size_t graphs = 0;
  for (const auto& c : m.contexts) {
    for (const auto& f : c.files) paths.insert(f.path);
    graphs += c.graphs.size();
  }
  const size_t files = paths.size();
  const forge::SharedWeightStats& st = exec.shared_weights();
  std::printf("[ weights  ] %zu files mapped (%.1f MiB), %zu tensors, handed out %zu times over %zu graphs\n", st.files, mib(int64_t(st.file_bytes)),
              st.tensors, st.uses, graphs);
  EXPECT_EQ(st.files, files) << "every data file the contexts list mapped once";
  EXPECT_GT(st.tensors, 0u);
  EXPECT_GT(st.uses, st.tensors) << "the prefill and decode graphs of a shard were given separate tensors";
  EXPECT_LE(st.tensor_bytes, st.file_bytes);
}
