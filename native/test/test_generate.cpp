// decoder_generate on the tiny bundle: greedy parity with HF (the key check), prefill against
// decode-over-prompt, text and id prompts through the tool, and the context limit.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bundle_env.h"
#include "executor.h"
#include "host_op.h"
#include "manifest.h"
#include "prompt.h"
#include "sha256.h"
#include "tokenizer.h"

namespace {

using forge_test::Loaded;
using forge_test::load;

size_t matching_prefix(const std::vector<int>& a, const std::vector<int>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) n++;
  return n;
}

std::string ids_csv(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); i++) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

/** Runs every traced prompt greedily and expects HF's tokens exactly; prints the match counts. */
void expect_parity_with_hf(const char* label, Loaded& l, const std::string& trace) {
  auto prompts = forge_test::load_trace(trace);
  ASSERT_FALSE(prompts.empty());
  for (size_t p = 0; p < prompts.size(); p++) {
    const auto& tp = prompts[p];
    auto r = l.gen->generate(tp.prompt_tokens, {int(tp.generated.size()), true, true});
    size_t same = matching_prefix(r.generated, tp.generated);
    std::printf("[ parity   ] %s prompt %zu '%s': %zu/%zu tokens equal HF (prefill %s)\n", label, p, tp.text.c_str(), same,
                tp.generated.size(), r.used_prefill ? "yes" : "no");
    EXPECT_EQ(r.generated, tp.generated) << label << " prompt " << p << " diverges from HF at token " << same;
  }
}

}  // namespace

TEST(Generate, Fp32GreedyParityWithHF) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_TRACE");
  expect_parity_with_hf("fp32", *load(bundle), trace);
}

// The shipped precision holds HF's greedy tokens as fp32 does: every token of every prompt (it
// passes only on twins whose margins are wider than W8's logit error, i.e. trained-like ones).
TEST(Generate, W8GreedyParityWithHF) {
  NEED_ENV(w8, "FORGE_TEST_BUNDLE_W8");
  NEED_ENV(trace, "FORGE_TEST_TRACE");
  expect_parity_with_hf("w8", *load(w8), trace);
}

TEST(Generate, PrefillEqualsDecodeOverPrompt) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_TRACE");
  auto l = load(bundle);
  ASSERT_TRUE(l->gen->has_prefill()) << "the tiny bundle is expected to have prefill graphs";
  int chunk = l->manifest.contexts[0].graph(forge::role::prefill)->tokens;
  // The trace's prompts, one of several chunks with a padded last one, one exactly filling two.
  const auto prompts = forge_test::prefill_test_prompts(trace, chunk, l->manifest.vocab);
  for (const auto& p : prompts) {
    auto a = l->gen->generate(p, {16, true, true});
    auto b = l->gen->generate(p, {16, true, false});
    EXPECT_TRUE(a.used_prefill);
    EXPECT_FALSE(b.used_prefill);
    EXPECT_EQ(a.generated, b.generated) << "prompt of " << p.size() << " tokens";
  }
  // A one-token prompt is decoded even with prefill on (one call either way; the decode graph
  // computes one row instead of N).
  auto one = l->gen->generate({prompts[0][0]}, {8, true, true});
  EXPECT_FALSE(one.used_prefill);
  EXPECT_EQ(one.generated, l->gen->generate({prompts[0][0]}, {8, true, false}).generated);
}

// The W8 graphs with their residual hand-offs in f16 (the handoff stage's rewrite, as a recipe saying
// `handoff: f16` ships them; gemma4's own test covers decode, this one a decoder_generate bundle with
// prefill graphs): the runtime keeps the hand-off in an f16 buffer through prefill and decode, HF's
// greedy tokens hold as with float32 hand-offs, and prefill still equals decode over the prompt.
TEST(Generate, F16HandOffsHoldParityThroughPrefillAndDecode) {
  NEED_ENV(half, "FORGE_TEST_HALF_HANDOFF_BUNDLE_W8");
  NEED_ENV(trace, "FORGE_TEST_TRACE");
  auto l = load(half);
  const auto* out = l->manifest.contexts[0].graph(forge::role::prefill);
  ASSERT_NE(out, nullptr) << "the bundle is expected to have prefill graphs";
  int f16_outputs = 0;
  for (const auto& c : l->manifest.contexts)
    for (const auto& g : c.graphs)
      for (const auto& b : g.outputs) f16_outputs += b.dtype == "float16";
  EXPECT_GE(f16_outputs, 2) << "shard0's prefill and decode graphs should hand over in f16";
  expect_parity_with_hf("w8 f16 hand-offs", *l, trace);
  for (const auto& p : forge_test::prefill_test_prompts(trace, out->tokens, l->manifest.vocab)) {
    auto a = l->gen->generate(p, {16, true, true});
    auto b = l->gen->generate(p, {16, true, false});
    EXPECT_TRUE(a.used_prefill);
    EXPECT_EQ(a.generated, b.generated) << "prompt of " << p.size() << " tokens";
  }
}

// Teacher-forced continuation (GenerateOptions::forced): forcing the tokens a free run chose feeds
// exactly what the free run fed, so every step's choice is the same, bit for bit.
static void expect_forcing_own_tokens_reproduces_free_run(Loaded& l, const std::string& trace) {
  for (const auto& tp : forge_test::load_trace(trace)) {
    const int n = int(tp.generated.size());
    auto free_run = l.gen->generate(tp.prompt_tokens, {n, true, true});
    EXPECT_EQ(l.gen->generate(tp.prompt_tokens, {n, true, true}, free_run.generated).generated, free_run.generated) << "'" << tp.text << "' forced with its own tokens";
    // HF's tokens (equal to the free run's on these fp32 bundles)
    EXPECT_EQ(l.gen->generate(tp.prompt_tokens, {n, true, true}, tp.generated).generated, tp.generated) << "'" << tp.text << "' forced with HF's tokens";
  }
}

TEST(Generate, ForcingTheFreeRunsTokensReproducesItExactly) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_TRACE");
  expect_forcing_own_tokens_reproduces_free_run(*load(bundle), trace);
}

// Forcing another first token: step 0 is chosen before anything is forced, so it is the free run's;
// every later step continues from the forced token, i.e. equals a free run of prompt + that token.
TEST(Generate, ForcingADifferentTokenChangesLaterChoices) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_TRACE");
  auto l = load(bundle);
  for (const auto& tp : forge_test::load_trace(trace)) {
    const int n = 12;
    auto free_run = l->gen->generate(tp.prompt_tokens, {n, true, false});
    const int other = (free_run.generated[0] + 1) % l->manifest.vocab;
    auto forced = l->gen->generate(tp.prompt_tokens, {n, true, false}, {other});
    std::vector<int> extended = tp.prompt_tokens;
    extended.push_back(other);
    auto from_other = l->gen->generate(extended, {n - 1, true, false});
    ASSERT_EQ(forced.generated.size(), size_t(n));
    EXPECT_EQ(forced.generated[0], free_run.generated[0]) << "step 0 is chosen before any forced token is fed";
    EXPECT_EQ(std::vector<int>(forced.generated.begin() + 1, forced.generated.end()), from_other.generated)
        << "after the forced token the run continues as a free run of the prompt plus that token";
    EXPECT_NE(forced.generated, free_run.generated) << "'" << tp.text << "': forcing token " << other << " changed no later choice";
  }
}

TEST(Generate, ForcedIdsAreCheckedAgainstTheVocabularyAndTheTokenCount) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  auto l = load(bundle);
  struct Case {
    int max_new;
    std::vector<int> forced;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {2, {1, 2, 3}, "3 forced ids for 2 new tokens: at most one forced id per generated token"},
           {4, {1, l->manifest.vocab}, "forced id 2 (token id " + std::to_string(l->manifest.vocab) + ") is outside the vocabulary"}}) {
    const std::string& message = c.message;
    try {
      l->gen->generate({1, 2}, {c.max_new, true, true}, c.forced);
      ADD_FAILURE() << message << ": accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

TEST(Generate, RepeatedCallsAreIndependent) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_TRACE");
  auto l = load(bundle);
  auto tp = forge_test::load_trace(trace).at(0);
  auto a = l->gen->generate(tp.prompt_tokens, {8, true, true});
  l->gen->generate(forge_test::load_trace(trace).back().prompt_tokens, {20, true, false});
  auto b = l->gen->generate(tp.prompt_tokens, {8, true, true});
  EXPECT_EQ(a.generated, b.generated);
}

TEST(Generate, MaxContextIsEnforced) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  auto l = load(bundle);
  int C = l->manifest.max_context;
  std::vector<int> p(size_t(C - 4), 7);
  EXPECT_NO_THROW(l->gen->generate(p, {5, true, true}));  // fills the last slot exactly
  try {
    l->gen->generate(p, {6, true, true});
    FAIL() << "expected the context limit error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("maxContext is " + std::to_string(C)), std::string::npos) << e.what();
  }
  EXPECT_THROW(l->gen->generate({l->manifest.vocab}, {1, true, true}), std::runtime_error);
  EXPECT_THROW(l->gen->generate({}, {1, true, true}), std::runtime_error);
}

TEST(Tool, TextAndIdPromptsGiveHFTokens) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_TRACE");
  for (const auto& tp : forge_test::load_trace(trace)) {
    std::string base = std::string(QHX_GENERATE_PATH) + " " + bundle + "/manifest.json cpu - " + bundle + " " +
                       std::to_string(tp.generated.size()) + " ";
    for (const std::string& prompt : std::vector<std::string>{"'" + tp.text + "'", "--prompt-ids " + ids_csv(tp.prompt_tokens)}) {
      std::string out, err;
      int rc = forge_test::run_command(base + prompt + " --json --ignore-eos", &out, &err);
      ASSERT_EQ(rc, 0) << err;
      auto j = nlohmann::json::parse(out);
      EXPECT_EQ(j.at("prompt_ids").get<std::vector<int>>(), tp.prompt_tokens) << prompt;
      EXPECT_EQ(j.at("generated_ids").get<std::vector<int>>(), tp.generated) << prompt;
      EXPECT_TRUE(j.at("text").is_string());
      const auto& t = j.at("timings");
      for (const char* k : {"prefill_ms", "decode_ms_per_token", "host_overhead_ms_per_token"}) EXPECT_TRUE(t.at(k).is_number()) << k;
      // The prompt ran, and the host's share of a decode step is part of that step.
      EXPECT_GT(t.at("prefill_ms").get<double>(), 0.0);
      EXPECT_LE(t.at("host_overhead_ms_per_token").get<double>(), t.at("decode_ms_per_token").get<double>());
    }
  }
}

TEST(Tool, APromptOfDigitsIsTextNotTokenIds) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  forge::Manifest m = forge::load_manifest(bundle + "/manifest.json", bundle, {forge::Verify::none});
  std::vector<int> expected = forge::Tokenizer::from_file(m.resolve(m.tokenizer_file)).encode("42");
  if (m.bos) expected.insert(expected.begin(), *m.bos);
  std::string out, err;
  int rc = forge_test::run_command(std::string(QHX_GENERATE_PATH) + " " + bundle + "/manifest.json cpu - " + bundle + " 1 42 --json", &out, &err);
  ASSERT_EQ(rc, 0) << err;
  auto ids = nlohmann::json::parse(out).at("prompt_ids").get<std::vector<int>>();
  EXPECT_EQ(ids, expected);
  EXPECT_NE(ids, std::vector<int>{42});
  // Seven digits were "not a token id" when digit-only prompts were taken for ids; as text they run.
  rc = forge_test::run_command(std::string(QHX_GENERATE_PATH) + " " + bundle + "/manifest.json cpu - " + bundle + " 1 1234567 --json", &out, &err);
  EXPECT_EQ(rc, 0) << err;
}

TEST(Tool, PromptIdsOutsideTheVocabularyAreNamed) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  forge::Manifest m = forge::load_manifest(bundle + "/manifest.json", bundle, {forge::Verify::none});
  std::string out, err;
  std::string bad = std::to_string(m.vocab);
  int rc = forge_test::run_command(std::string(QHX_GENERATE_PATH) + " " + bundle + "/manifest.json cpu - " + bundle + " 1 --prompt-ids 1," + bad, &out, &err);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("--prompt-ids: entry 2 token id " + bad + " is outside the vocabulary"), std::string::npos) << err;
}

TEST(PromptIds, EachBadEntryIsNamedByPositionAndValue) {
  EXPECT_EQ(forge::parse_ids("1, 2,3"), (std::vector<int>{1, 2, 3}));
  for (const auto& [arg, message] : std::vector<std::pair<std::string, std::string>>{
           {"1,x", "--prompt-ids: entry 2 'x' is not a token id"},
           {"1,,2", "--prompt-ids: entry 2 '' is not a token id"},
           {"-3", "--prompt-ids: entry 1 '-3' is not a token id"},
           {"1234567890", "--prompt-ids: entry 1 '1234567890' is not a token id"}}) {
    try {
      forge::parse_ids(arg);
      ADD_FAILURE() << arg << " was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
}

TEST(Tool, ForceIdsGiveHFTokensAndBadOnesAreNamed) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_TRACE");
  const std::string base = std::string(QHX_GENERATE_PATH) + " " + bundle + "/manifest.json cpu - " + bundle + " ";
  const auto tp = forge_test::load_trace(trace).at(0);
  const std::string n = std::to_string(tp.generated.size());
  std::string out, err;
  ASSERT_EQ(forge_test::run_command(base + n + " --prompt-ids " + ids_csv(tp.prompt_tokens) + " --force-ids " + ids_csv(tp.generated) + " --json --ignore-eos", &out, &err), 0) << err;
  EXPECT_EQ(nlohmann::json::parse(out).at("generated_ids").get<std::vector<int>>(), tp.generated);
  forge::Manifest m = forge::load_manifest(bundle + "/manifest.json", bundle, {forge::Verify::none});
  const std::string vocab = std::to_string(m.vocab);
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"4 --prompt-ids 1,2 --force-ids 5,x", "qhx_generate: --force-ids: entry 2 'x' is not a token id"},
           {"4 --prompt-ids 1,2 --force-ids 5," + vocab, "qhx_generate: --force-ids: entry 2 token id " + vocab + " is outside the vocabulary [0, " + vocab + ")"},
           {"2 --prompt-ids 1,2 --force-ids 5,6,7", "qhx_generate: --force-ids: 3 ids for max_new_tokens 2: at most one forced id per generated token"},
           {"2 --prompt-ids 1,2 --force-ids", "qhx_generate: --force-ids needs a value: the token ids to continue with, like 5,6,7"}}) {
    EXPECT_EQ(forge_test::run_command(base + args, &out, &err), 1) << args;
    EXPECT_EQ(err, message + "\n") << args;
  }
}

TEST(Tool, ErrorsAreOneLineAndExitOne) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  std::string tool = QHX_GENERATE_PATH;
  for (const std::string& args : std::vector<std::string>{" /nonexistent/manifest.json cpu - /tmp 4 --prompt-ids 1,2", " " + bundle + "/manifest.json cpu - " + bundle + " 0 --prompt-ids 1,2",
                           " " + bundle + "/manifest.json cpu - " + bundle + " 4 --prompt-ids 1,x", " " + bundle + "/manifest.json cpu - " + bundle + " 500 --prompt-ids 1,2",
                           " " + bundle + "/manifest.json cpu - " + bundle + " 4 1,2 --ids", " " + bundle + "/manifest.json cpu - " + bundle + " 4 hi --prompt-ids 1,2"}) {
    std::string out, err;
    EXPECT_EQ(forge_test::run_command(tool + args, &out, &err), 1) << args;
    EXPECT_EQ(err.rfind("qhx_generate: ", 0), 0u) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

TEST(Generate, NonFiniteCountFindsNaNAndInfAnywhere) {
  std::vector<float> x(1027, 0.5f);
  EXPECT_EQ(forge::count_non_finite(x.data(), int64_t(x.size())).count, 0);
  x[1026] = std::numeric_limits<float>::quiet_NaN();
  x[17] = -std::numeric_limits<float>::infinity();
  x[400] = std::numeric_limits<float>::max();  // the largest finite value is finite
  auto nf = forge::count_non_finite(x.data(), int64_t(x.size()));
  EXPECT_EQ(nf.count, 2);
  EXPECT_EQ(nf.first, 17);
}

// A bundle whose embedding row for the prompt's token is NaN (its manifest hash updated to match):
// the logits are NaN, and the tool refuses them with exit 3 naming the step, instead of reporting
// token 0 (what an argmax over NaN gives).
TEST(Tool, NonFiniteLogitsExitThreeNamingTheStep) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("forge-nonfinite-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(bundle, dir, fs::copy_options::recursive);
  forge::Manifest m = forge::load_manifest((dir / "manifest.json").string(), dir.string());
  {
    fs::path table = dir / m.tables("embedding").at(0)->file;
    std::fstream f(table, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f) << table;
    std::vector<uint16_t> nan_row(size_t(m.hidden), 0x7e00);  // f16 quiet NaN
    f.seekp(std::streamoff(2) * m.hidden * 2);                // row of token id 2
    f.write(reinterpret_cast<const char*>(nan_row.data()), std::streamsize(nan_row.size() * 2));
    f.close();
    std::ifstream in(dir / "manifest.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["hostTables"][0]["sha256"] = forge::sha256_file(table.string());
    std::ofstream(dir / "manifest.json") << j.dump();
  }
  std::string out, err;
  int code = forge_test::run_command(std::string(QHX_GENERATE_PATH) + " " + (dir / "manifest.json").string() + " cpu - " + dir.string() + " 4 --prompt-ids 1,2", &out, &err);
  fs::remove_all(dir);
  EXPECT_EQ(code, forge::kExitNonFiniteLogits) << err;
  EXPECT_NE(err.find("qhx_generate: non-finite logits at generation step 0 (position 1)"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

// The tool dispatches through the host-op registry: a bundle naming a host-op it does not have is
// refused at load, in one line naming the field and the registered host-ops, before any graph loads
// (the graph files are removed: loading one would fail otherwise).
TEST(Tool, AnUnregisteredHostOpIsRefusedBeforeAnyGraphLoads) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("forge-hostop-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(bundle, dir, fs::copy_options::recursive);
  {
    std::ifstream in(dir / "manifest.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["hostOp"] = "gemma4_generate";
    for (auto& c : j["contexts"])
      for (auto& g : c["graphs"]) fs::remove(dir / g["file"].get<std::string>());
    std::ofstream(dir / "manifest.json") << j.dump();
  }
  std::string out, err;
  int code = forge_test::run_command(std::string(QHX_GENERATE_PATH) + " " + (dir / "manifest.json").string() + " cpu - " + dir.string() + " 2 --prompt-ids 1,2", &out, &err);
  fs::remove_all(dir);
  EXPECT_EQ(code, 1) << err;
  EXPECT_EQ(err, "qhx_generate: manifest.json: hostOp: 'gemma4_generate' is not a registered host-op (registered: decoder_generate, qwen3_5_generate, gemma4_split_generate, phimoe_generate, qwen3_vl_generate)\n");
}

TEST(Tool, GeneratedIdsTheTokenizerCannotDecodeGiveNullTextNotAFailure) {
  // A model's vocabulary can be larger than its tokenizer's (padded embeddings; forge's synthetic 4B
  // checkpoints carry the tiny twin's tokenizer): the ids are the result, the text is then null.
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("forge-short-vocab-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(bundle, dir, fs::copy_options::recursive);
  std::string out, err;
  const std::string cmd = std::string(QHX_GENERATE_PATH) + " " + (dir / "manifest.json").string() + " cpu - " + dir.string() + " 3 --prompt-ids 1,2 --json --ignore-eos";
  ASSERT_EQ(forge_test::run_command(cmd, &out, &err), 0) << err;
  const std::vector<int> ids = nlohmann::json::parse(out)["generated_ids"].get<std::vector<int>>();
  const int top = *std::max_element(ids.begin(), ids.end());
  {  // drop the generated id with the highest number, and every token above it, from the tokenizer
    std::ifstream in(dir / "tokenizer.json");
    nlohmann::json t = nlohmann::json::parse(in);
    nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array(), added = nlohmann::json::array();
    for (auto& [tok, id] : t["model"]["vocab"].items())
      if (id.get<int>() < top) vocab[tok] = id;
    for (auto& m : t["model"]["merges"]) {
      std::string a = m[0], b = m[1];
      if (vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) merges.push_back(m);
    }
    for (auto& a : t["added_tokens"])
      if (a["id"].get<int>() < top) added.push_back(a);
    t["model"]["vocab"] = vocab;
    t["model"]["merges"] = merges;
    t["added_tokens"] = added;
    std::ofstream(dir / "tokenizer.json") << t.dump();
    std::ifstream min(dir / "manifest.json");
    nlohmann::json j = nlohmann::json::parse(min);
    j["tokenizer"]["sha256"] = forge::sha256_file((dir / "tokenizer.json").string());
    std::ofstream(dir / "manifest.json") << j.dump();
  }
  out.clear();
  err.clear();
  const int code = forge_test::run_command(cmd, &out, &err);
  fs::remove_all(dir);
  ASSERT_EQ(code, 0) << err;
  const nlohmann::json r = nlohmann::json::parse(out);
  EXPECT_EQ(r["generated_ids"].get<std::vector<int>>(), ids);
  EXPECT_TRUE(r["text"].is_null());
  EXPECT_EQ(r["text_error"].get<std::string>(), "generated ids not decodable: token id " + std::to_string(top) + " is outside the tokenizer's vocabulary");
}

// qwen3_5_generate on the tiny Qwen3.5 twin: conv and recurrent state replaced each call, KV caches
// for the full-attention layers, a shard of linear-attention layers only, the prompt prefilled in
// chunks (the chunked delta rule in the graphs).
TEST(Hybrid, Fp32GreedyParityWithHF) {
  NEED_ENV(bundle, "FORGE_TEST_HYBRID_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_HYBRID_TRACE");
  auto l = load(bundle);
  ASSERT_EQ(l->manifest.host_op, "qwen3_5_generate");
  ASSERT_TRUE(l->gen->has_prefill()) << "the tiny Qwen3.5 bundle is expected to have prefill graphs";
  expect_parity_with_hf("qwen3_5 fp32", *l, trace);
}

// Prefill hands the decode graphs the same conv and recurrent states as decoding over the prompt:
// the same tokens on prompts of several chunks, a padded last one, and one exactly filling two.
TEST(Hybrid, PrefillEqualsDecodeOverPrompt) {
  NEED_ENV(bundle, "FORGE_TEST_HYBRID_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_HYBRID_TRACE");
  auto l = load(bundle);
  ASSERT_TRUE(l->gen->has_prefill());
  int chunk = l->manifest.contexts[0].graph(forge::role::prefill)->tokens;
  for (const auto& p : forge_test::prefill_test_prompts(trace, chunk, l->manifest.vocab)) {
    auto a = l->gen->generate(p, {16, true, true});
    auto b = l->gen->generate(p, {16, true, false});
    EXPECT_TRUE(a.used_prefill);
    EXPECT_FALSE(b.used_prefill);
    EXPECT_EQ(a.generated, b.generated) << "prompt of " << p.size() << " tokens";
  }
}

// The shipped precision of the hybrid, every token of every prompt, as for the dense twin.
TEST(Hybrid, W8GreedyParityWithHF) {
  NEED_ENV(w8, "FORGE_TEST_HYBRID_BUNDLE_W8");
  NEED_ENV(trace, "FORGE_TEST_HYBRID_TRACE");
  expect_parity_with_hf("qwen3_5 w8", *load(w8), trace);
}

TEST(Hybrid, ForcingTheFreeRunsTokensReproducesItExactly) {
  NEED_ENV(bundle, "FORGE_TEST_HYBRID_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_HYBRID_TRACE");
  expect_forcing_own_tokens_reproduces_free_run(*load(bundle), trace);
}

TEST(Hybrid, RecurrentStateStartsFreshEachCall) {
  NEED_ENV(bundle, "FORGE_TEST_HYBRID_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_HYBRID_TRACE");
  auto l = load(bundle);
  auto prompts = forge_test::load_trace(trace);
  ASSERT_GE(prompts.size(), 2u);
  // An odd number of steps leaves the state in its second buffer; the next call must still start from zeros.
  auto first = l->gen->generate(prompts[0].prompt_tokens, {7, true, true});
  auto other = l->gen->generate(prompts[1].prompt_tokens, {int(prompts[1].generated.size()), true, true});
  auto again = l->gen->generate(prompts[0].prompt_tokens, {7, true, true});
  EXPECT_EQ(other.generated, prompts[1].generated);
  EXPECT_EQ(first.generated, again.generated);
}

