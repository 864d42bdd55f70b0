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
  ADD_FAILURE() << name << " is not set. Build the tiny bundle with\n"
                << "  FORGE_CACHE=/tmp/fc-native node --import tsx test/helpers/make-bundle.ts <dir> --hybrid --phimoe\n"
                << "and set FORGE_TEST_BUNDLE=<fp32 dir>, FORGE_TEST_BUNDLE_W8=<w8 dir>, FORGE_TEST_TRACE=<trace dir>,\n"
                << "FORGE_TEST_HYBRID_BUNDLE=<hybrid dir>, FORGE_TEST_HYBRID_BUNDLE_W8=<hybridW8 dir>, FORGE_TEST_HYBRID_TRACE=<hybridTrace dir>,\n"
                << "(with --phimoe) FORGE_TEST_PHIMOE_BUNDLE=<phimoe dir>, FORGE_TEST_PHIMOE_BUNDLE_W8=<phimoeW8 dir>, FORGE_TEST_PHIMOE_TRACE=<phimoeTrace dir>.";
  return "";
}

std::vector<TracePrompt> load_trace(const std::string& dir) {
  std::ifstream in(dir + "/trace.json");
  if (!in) throw std::runtime_error("cannot read " + dir + "/trace.json");
  nlohmann::json j = nlohmann::json::parse(in);
  std::vector<TracePrompt> out;
  for (const auto& p : j.at("prompts"))
    out.push_back({p.value("text", ""), p.at("prompt_tokens").get<std::vector<int>>(), p.at("generated").get<std::vector<int>>()});
  return out;
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
