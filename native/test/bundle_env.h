// Where the tests find the tiny bundle forge builds (test/helpers/make-bundle.ts): FORGE_TEST_BUNDLE
// (the fp32 bundle dir) and FORGE_TEST_TRACE (the HF trace dir with trace.json). A test that needs
// one FAILS when it is unset: the suite must never pass by not running its key checks.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "executor.h"
#include "host_op.h"
#include "manifest.h"

namespace forge_test {

/** The variable's value, or "" after recording a test failure that says how to set it. */
std::string need_env(const char* name);

struct TracePrompt {
  std::string text;
  std::vector<int> prompt_tokens, generated;
  std::string image;  // an image prompt's file in <trace>/images (the trace stage keeps it there); "" for text
};
std::vector<TracePrompt> load_trace(const std::string& trace_dir);

/**
 * The prompts a prefill test runs: the trace's, one of 2·chunk + 3 tokens (several chunks, the last
 * padded) and one of exactly 2·chunk, their ids spread over the vocabulary.
 */
std::vector<std::vector<int>> prefill_test_prompts(const std::string& trace_dir, int chunk, int vocab);

/** A bundle loaded as qhx_generate loads it: manifest, executor (CPU), the host-op's generator from the registry. */
struct Loaded {
  forge::Manifest manifest;
  std::unique_ptr<forge::Executor> exec;
  std::unique_ptr<forge::Generator> gen;
};
std::unique_ptr<Loaded> load(const std::string& dir);

/** Runs a command; returns its exit status and fills stdout/stderr. */
int run_command(const std::string& cmd, std::string* out, std::string* err);

}  // namespace forge_test

#define NEED_ENV(var, name)                       \
  std::string var = forge_test::need_env(name);   \
  if (var.empty()) return
