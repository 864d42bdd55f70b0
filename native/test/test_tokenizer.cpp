// The C++ BPE tokenizer against HF tokenizers: fixtures written by native/tools/gen_tokenizer_fixtures.py
// (ids and decoded text per string, for each tokenizer under test/fixtures/), compared exactly.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "split_regex.h"
#include "tokenizer.h"
#include "unicode.h"
#include "utf8.h"

using nlohmann::json;

namespace {

const std::string kFixtures = FORGE_FIXTURES_DIR;

json fixtures() {
  std::ifstream in(kFixtures + "/tokenizer-cases.json");
  if (!in) throw std::runtime_error("missing " + kFixtures + "/tokenizer-cases.json");
  return json::parse(in);
}

std::string show(const std::string& s) { return json(s).dump(-1, ' ', true, json::error_handler_t::replace); }

}  // namespace

TEST(Tokenizer, MatchesHFTokenizersOnFixtures) {
  json all = fixtures();
  ASSERT_GE(all.size(), 2u);
  for (const json& set : all) {
    std::string file = kFixtures + "/" + set.at("tokenizer").get<std::string>();
    forge::Tokenizer tok = forge::Tokenizer::from_file(file);
    size_t enc_ok = 0, dec_ok = 0, n = set.at("cases").size();
    for (const json& c : set.at("cases")) {
      std::string text = c.at("text");
      auto want = c.at("ids").get<std::vector<int>>();
      auto got = tok.encode(text);
      if (got == want) enc_ok++;
      else ADD_FAILURE() << set["tokenizer"] << " encode " << show(text) << "\n  want " << json(want).dump() << "\n  got  " << json(got).dump();
      bool dec_same = tok.decode(want) == c.at("decoded").get<std::string>() &&
                      tok.decode(want, true) == c.at("decoded_skip_special").get<std::string>();
      if (dec_same) dec_ok++;
      else ADD_FAILURE() << set["tokenizer"] << " decode " << json(want).dump() << "\n  want " << show(c["decoded"]) << "\n  got  " << show(tok.decode(want));
    }
    std::printf("[ tokenizer] %s: encode %zu/%zu, decode %zu/%zu equal HF tokenizers\n", set["tokenizer"].get<std::string>().c_str(),
                enc_ok, n, dec_ok, n);
  }
}

TEST(Tokenizer, DecodesArbitraryIdsLikeHF) {
  // Byte-level tokens that split a UTF-8 sequence decode to U+FFFD, as HF does.
  json all = fixtures();
  for (const json& set : all) {
    ASSERT_TRUE(set.contains("id_runs")) << "the fixture generator writes id_runs for every vocabulary";
    forge::Tokenizer tok = forge::Tokenizer::from_file(kFixtures + "/" + set.at("tokenizer").get<std::string>());
    for (const json& c : set["id_runs"])
      EXPECT_EQ(tok.decode(c.at("ids").get<std::vector<int>>()), c.at("decoded").get<std::string>()) << c["ids"].dump();
  }
}

TEST(Tokenizer, UnsupportedConfigurationsAreRefusedByName) {
  std::string base = R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"ByteLevel"}})";
  EXPECT_NO_THROW(forge::Tokenizer::from_json(base, "t.json"));
  auto refused = [](const std::string& j, const std::string& what) {
    try {
      forge::Tokenizer::from_json(j, "t.json");
      ADD_FAILURE() << "accepted " << j;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(R"({"model":{"type":"Unigram","vocab":[]},"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"ByteLevel"}})", "model.type 'Unigram'");
  refused(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Metaspace"},"decoder":{"type":"ByteLevel"}})", "pre_tokenizer");
  refused(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"normalizer":{"type":"NFKC"},"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"ByteLevel"}})", "normalizer");
}

TEST(SplitRegex, LeftmostFirstAndLookahead) {
  forge::SplitRegex gpt2(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  auto pieces = gpt2.split_isolated(forge::utf8_decode("Hello  world's 42!\n"));
  std::vector<std::string> got;
  for (auto& p : pieces) got.push_back(forge::utf8_encode(p));
  EXPECT_EQ(got, (std::vector<std::string>{"Hello", " ", " world", "'s", " 42", "!", "\n"}));
  forge::SplitRegex counted(R"(\p{N}{1,3})");
  EXPECT_EQ(counted.match_at(forge::utf8_decode("12345"), 0), 3);
  forge::SplitRegex icase(R"((?i:'s|'ll))");
  EXPECT_EQ(icase.match_at(forge::utf8_decode("'LL"), 0), 3);
  EXPECT_THROW(forge::SplitRegex("a\\b"), std::runtime_error);
  EXPECT_THROW(forge::SplitRegex("^a"), std::runtime_error);
}

TEST(Unicode, NfcComposesAndReorders) {
  auto n = [](const std::string& s) { return forge::utf8_encode(forge::nfc(forge::utf8_decode(s))); };
  EXPECT_EQ(n("e\xCC\x81"), "\xC3\xA9");                      // e + U+0301 → é
  EXPECT_EQ(n("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");  // Hangul L + V → 가
  EXPECT_EQ(n("a\xCC\xA3\xCC\x87"), "\xE1\xBA\xA1\xCC\x87");  // a + dot below + dot above → ạ + dot above
  EXPECT_EQ(n("\xEF\xA4\x80"), "\xE8\xB1\x88");              // CJK compatibility ideograph → unified
  EXPECT_EQ(n("plain ascii"), "plain ascii");
}
