// The QNN EP path needs compiled contexts and the onnxruntime-qnn plugin, which this machine may
// not have: the run test is skipped (with the reason printed) unless FORGE_QNN_EP_LIB is set. The
// missing-plugin error is always checked.
#include <cstdlib>

#include <gtest/gtest.h>

#include "bundle_env.h"
#include "decoder_generate.h"
#include "executor.h"
#include "manifest.h"

TEST(Qnn, MissingPluginFailsWithAClearMessage) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  if (std::getenv("FORGE_QNN_EP_LIB")) GTEST_SKIP() << "FORGE_QNN_EP_LIB is set: the plugin is not missing";
  forge::Manifest m = forge::load_manifest(bundle + "/manifest.json", bundle);
  // Any existing file will do as the "backend": the plugin next to it is what is missing.
  std::string fake_backend = bundle + "/manifest.json";
  try {
    forge::Executor exec(m, forge::ExecutorOptions{fake_backend, "-", 0});
    FAIL() << "expected the missing plugin to be reported";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("QNN EP plugin library"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("FORGE_QNN_EP_LIB"), std::string::npos) << e.what();
  }
}

TEST(Qnn, GenerateOnCompiledContexts) {
  const char* plugin = std::getenv("FORGE_QNN_EP_LIB");
  if (!plugin || !*plugin)
    GTEST_SKIP() << "FORGE_QNN_EP_LIB is not set: no QNN EP plugin (onnxruntime-qnn's libonnxruntime_providers_qnn.so) to run compiled contexts with";
  const char* backend = std::getenv("FORGE_QNN_BACKEND");
  if (!backend || !*backend) GTEST_SKIP() << "FORGE_QNN_BACKEND (path of libQnnHtp.so) is not set";
  const char* dir = std::getenv("FORGE_TEST_QNN_BUNDLE");
  if (!dir || !*dir) GTEST_SKIP() << "FORGE_TEST_QNN_BUNDLE (a bundle with qnn.wrapper contexts) is not set";
  NEED_ENV(trace, "FORGE_TEST_TRACE");
  std::string b = dir;
  forge::Manifest m = forge::load_manifest(b + "/manifest.json", b);
  forge::Executor exec(m, forge::ExecutorOptions{backend, "-", 0});
  forge::DecoderGenerate gen(m, exec);
  for (const auto& tp : forge_test::load_trace(trace)) {
    auto r = gen.generate(tp.prompt_tokens, {int(tp.generated.size()), true, true});
    size_t same = 0;
    while (same < r.generated.size() && r.generated[same] == tp.generated[same]) same++;
    std::printf("[ parity   ] qnn '%s': %zu/%zu tokens equal HF\n", tp.text.c_str(), same, tp.generated.size());
    EXPECT_EQ(r.generated.size(), tp.generated.size());
  }
}
