// The QNN EP path needs compiled contexts and the onnxruntime-qnn plugin, which this machine may
// not have: the run test is skipped (with the reason printed) unless FORGE_QNN_EP_LIB is set. The
// missing-plugin error is always checked (with FORGE_QNN_EP_LIB pointed at nothing while it runs).
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "bundle_env.h"
#include "executor.h"
#include "host_op.h"
#include "manifest.h"

TEST(Qnn, MissingPluginFailsWithAClearMessage) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  const char* set = std::getenv("FORGE_QNN_EP_LIB");
  const std::optional<std::string> saved = set ? std::optional<std::string>(set) : std::nullopt;
  const std::string missing = bundle + "/no-such-plugin.so";
  setenv("FORGE_QNN_EP_LIB", missing.c_str(), 1);
  forge::Manifest m = forge::load_manifest(bundle + "/manifest.json", bundle);
  // Any existing file will do as the "backend": the plugin is what is missing.
  std::string fake_backend = bundle + "/manifest.json";
  std::string what;
  try {
    forge::Executor exec(m, forge::ExecutorOptions{fake_backend, "-", 0});
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  if (saved) setenv("FORGE_QNN_EP_LIB", saved->c_str(), 1);
  else unsetenv("FORGE_QNN_EP_LIB");
  EXPECT_NE(what.find("QNN EP plugin library '" + missing + "' not found"), std::string::npos) << what;
  EXPECT_NE(what.find("FORGE_QNN_EP_LIB"), std::string::npos) << what;
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
  std::unique_ptr<forge::Generator> gen = forge::make_generator(m, exec);
  for (const auto& tp : forge_test::load_trace(trace)) {
    auto r = gen->generate(tp.prompt_tokens, {int(tp.generated.size()), true, true});
    size_t same = 0;
    while (same < r.generated.size() && r.generated[same] == tp.generated[same]) same++;
    std::printf("[ parity   ] qnn '%s': %zu/%zu tokens equal HF\n", tp.text.c_str(), same, tp.generated.size());
    // fp16 on the HTP need not hold every token (the emulation gate holds it to the recipe's
    // threshold); the first one it must.
    EXPECT_GE(same, 1u) << "the compiled contexts already differ from HF at the first token of '" << tp.text << "'";
  }
}
