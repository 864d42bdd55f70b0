// qhx_generate --chat: the prompt wrapped in the chat template forge rendered into the manifest
// (tokenizer.chat), on the tiny bundle of every host-op (the wrapping is the tool's, before any
// host-op runs). That the wrap equals transformers' apply_chat_template is test/chat-template.test.ts.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bundle_env.h"
#include "manifest.h"
#include "prompt.h"
#include "tokenizer.h"

namespace {

const std::string kText = "Zwölf Boxkämpfer jagen Viktor";

std::string tool(const std::string& manifest, const std::string& root, const std::string& args) {
  return std::string(QHX_GENERATE_PATH) + " " + manifest + " cpu - " + root + " " + args;
}

/** Generates two tokens from kText with --chat and checks the ids fed are prefix + text + suffix, tokenized, nothing added. */
void expect_chat_prompt(const char* env) {
  NEED_ENV(bundle, env);
  forge::Manifest m = forge::load_manifest(bundle + "/manifest.json", bundle, {forge::Verify::none});
  ASSERT_TRUE(m.chat) << env << ": the twin ships a chat template, so the manifest has tokenizer.chat";
  EXPECT_FALSE(m.chat->prefix.empty());
  const forge::Tokenizer tok = forge::Tokenizer::from_file(m.resolve(m.tokenizer_file));
  const std::vector<int> wrapped = tok.encode(m.chat->prefix + kText + m.chat->suffix);
  EXPECT_EQ(forge::text_prompt_ids(m, tok, kText, true), wrapped);
  std::string out, err;
  ASSERT_EQ(forge_test::run_command(tool(bundle + "/manifest.json", bundle, "2 '" + kText + "' --chat --json --ignore-eos"), &out, &err), 0) << err;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("prompt_ids").get<std::vector<int>>(), wrapped) << env;
  EXPECT_EQ(j.at("generated_ids").size(), 2u) << env;
  // The template's special tokens are single ids, not their spelling in pieces: fewer ids than the text's.
  EXPECT_LT(wrapped.size(), tok.encode(kText).size() + m.chat->prefix.size() + m.chat->suffix.size()) << env;
  // --print-prompt-ids: the same ids, nothing run.
  ASSERT_EQ(forge_test::run_command(tool(bundle + "/manifest.json", bundle, "2 '" + kText + "' --chat --print-prompt-ids --json"), &out, &err), 0) << err;
  EXPECT_EQ(nlohmann::json::parse(out), (nlohmann::json{{"prompt_ids", wrapped}}));
  // Plain text is not wrapped: the manifest's BOS (if any), then the text.
  std::vector<int> plain = tok.encode(kText);
  if (m.bos) plain.insert(plain.begin(), *m.bos);
  ASSERT_EQ(forge_test::run_command(tool(bundle + "/manifest.json", bundle, "2 '" + kText + "' --print-prompt-ids"), &out, &err), 0) << err;
  EXPECT_EQ(out, "prompt_ids: " + [&] {
    std::string s;
    for (size_t i = 0; i < plain.size(); i++) s += (i ? "," : "") + std::to_string(plain[i]);
    return s;
  }() + "\n");
}

}  // namespace

TEST(Chat, DecoderBundleWrapsThePrompt) { expect_chat_prompt("FORGE_TEST_BUNDLE"); }
TEST(Chat, HybridBundleWrapsThePrompt) { expect_chat_prompt("FORGE_TEST_HYBRID_BUNDLE"); }
TEST(Chat, PhimoeBundleWrapsThePrompt) { expect_chat_prompt("FORGE_TEST_PHIMOE_BUNDLE"); }

// Without a template --chat is refused (it never runs the prompt unwrapped); with --prompt-ids too.
TEST(Chat, RefusedWithoutATemplateAndWithPromptIds) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  namespace fs = std::filesystem;
  const fs::path manifest = fs::temp_directory_path() / ("forge-chat-" + std::to_string(::getpid()) + ".json");
  {
    std::ifstream in(bundle + "/manifest.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["tokenizer"]["chat"] = nullptr;
    j["tokenizer"].erase("chatOptions");  // switches only exist with a wrap
    std::ofstream(manifest) << j.dump();
  }
  std::string out, err;
  EXPECT_EQ(forge_test::run_command(tool(manifest.string(), bundle, "2 hello --chat"), &out, &err), 1);
  EXPECT_EQ(err, "qhx_generate: --chat: " + manifest.filename().string() +
                     " has no chat template (tokenizer.chat is null: the checkpoint's tokenizer_config.json has no chat_template); give the prompt as plain text\n");
  EXPECT_EQ(forge_test::run_command(tool(manifest.string(), bundle, "2 hello --print-prompt-ids"), &out, &err), 0) << err;
  // A template forge could not turn into a wrap (it trims the content …): --chat says why.
  {
    std::ifstream in(bundle + "/manifest.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["tokenizer"]["chat"] = nullptr;
    j["tokenizer"].erase("chatOptions");
    j["tokenizer"]["chatNotApplied"] = "the template trims the content";
    std::ofstream(manifest) << j.dump();
  }
  EXPECT_EQ(forge_test::run_command(tool(manifest.string(), bundle, "2 hello --chat"), &out, &err), 1);
  EXPECT_EQ(err, "qhx_generate: --chat: " + manifest.filename().string() +
                     "'s chat template cannot be applied by the runtime (the template trims the content); give the ids transformers' "
                     "apply_chat_template renders with --prompt-ids, or the prompt as plain text\n");
  fs::remove(manifest);
  EXPECT_EQ(forge_test::run_command(tool(bundle + "/manifest.json", bundle, "2 --prompt-ids 1,2 --chat"), &out, &err), 1);
  EXPECT_EQ(err, "qhx_generate: --chat wraps a text prompt in the chat template; --prompt-ids are fed as given, not both\n");
}
