#include "bundle_env.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace forge_test {

std::string need_env(const char* name) {
  const char* v = std::getenv(name);
  if (v && *v) return v;
  ADD_FAILURE() << name << " is not set. Build the tiny bundles with\n"
                << "  FORGE_CACHE=/tmp/fc-native node --import tsx test/helpers/make-bundle.ts <dir> --all\n"
                << "and set the variables its JSON keys map to (src/toolchain/native.ts nativeTestEnv): fp32, w8, trace ->\n"
                << "FORGE_TEST_BUNDLE, FORGE_TEST_BUNDLE_W8, FORGE_TEST_TRACE; <name>, <name>W8, <name>Trace ->\n"
                << "FORGE_TEST_<NAME>_BUNDLE, FORGE_TEST_<NAME>_BUNDLE_W8, FORGE_TEST_<NAME>_TRACE.";
  return "";
}

std::vector<TracePrompt> load_trace(const std::string& dir) {
  std::ifstream in(dir + "/trace.json");
  if (!in) throw std::runtime_error("cannot read " + dir + "/trace.json");
  nlohmann::json j = nlohmann::json::parse(in);
  std::vector<TracePrompt> out;
  for (const auto& p : j.at("prompts"))
    out.push_back({p.value("text", ""), p.at("prompt_tokens").get<std::vector<int>>(), p.at("generated").get<std::vector<int>>(),
                   p.contains("image") ? dir + "/images/" + p.at("image").at("file").get<std::string>() : ""});
  return out;
}

std::vector<std::vector<int>> prefill_test_prompts(const std::string& trace_dir, int chunk, int vocab) {
  std::vector<std::vector<int>> prompts;
  for (const auto& tp : load_trace(trace_dir)) prompts.push_back(tp.prompt_tokens);
  std::vector<int> longp, exact;
  for (int i = 0; i < 2 * chunk + 3; i++) longp.push_back((i * 37 + 11) % vocab);
  for (int i = 0; i < 2 * chunk; i++) exact.push_back((i * 53 + 5) % vocab);
  prompts.push_back(longp);
  prompts.push_back(exact);
  return prompts;
}

std::unique_ptr<Loaded> load(const std::string& dir) {
  auto l = std::make_unique<Loaded>();
  l->manifest = forge::load_manifest(dir + "/manifest.json", dir);
  l->exec = std::make_unique<forge::Executor>(l->manifest, forge::ExecutorOptions{});
  l->gen = forge::make_generator(l->manifest, *l->exec);  // through the registry, as qhx_generate
  return l;
}

int run_command(const std::string& cmd, std::string* out, std::string* err) {
  char errfile[] = "/tmp/forge-test-stderr-XXXXXX";
  int fd = mkstemp(errfile);
  if (fd < 0) return -1;
  FILE* p = popen((cmd + " 2>" + errfile).c_str(), "r");
  std::string o;
  char buf[4096];
  size_t n;
  while (p && (n = fread(buf, 1, sizeof buf, p)) > 0) o.append(buf, n);
  int status = p ? pclose(p) : -1;
  std::ifstream e(errfile);
  std::stringstream ss;
  ss << e.rdbuf();
  std::remove(errfile);
  if (out) *out = o;
  if (err) *err = ss.str();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace forge_test
