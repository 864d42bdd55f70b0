// Fuzzing the runtime's readers of outside input, in-process: the manifest loader and the
// tokenizer.json loader get 10,000 structure-aware mutations each of a valid document (values
// swapped for other types, huge and negative numbers, fields dropped or added, deep nesting,
// control characters in strings, truncated and byte-flipped text); the reader of a graph's external
// initializers (shared_weights.h) gets 10,000 byte-level mutations of a valid ONNX file. Each case must load, or be
// refused with the loader's own error type in ONE line that names the file. A crash (segfault,
// abort, an exception of another type) fails the test; the seed and the failing case are printed so
// a failure reproduces. FORGE_FUZZ_SEED picks another seed, FORGE_FUZZ_CASES another count.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "manifest.h"
#include "sha256.h"
#include "shared_weights.h"
#include "tokenizer.h"

using nlohmann::json;

namespace {

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

const uint64_t kSeed = env_or("FORGE_FUZZ_SEED", 20261123);
const size_t kCases = size_t(env_or("FORGE_FUZZ_CASES", 10000));

/** Structure-aware mutations of a JSON document; raw `% n` on mt19937_64 so every platform draws alike. */
class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  size_t below(size_t n) { return n ? size_t(rng_() % n) : 0; }
  bool chance(size_t one_in) { return below(one_in) == 0; }

  /** A mutated copy, as text: 1-3 structural edits, then sometimes a byte-level one. */
  std::string mutate(const json& good) {
    json doc = good;
    for (size_t k = 0, n = 1 + below(3); k < n; k++) edit(doc);
    // A string cut inside a UTF-8 sequence is written with U+FFFD; raw bad bytes come from bytes().
    std::string text = doc.dump(-1, ' ', false, json::error_handler_t::replace);
    if (chance(4)) text = bytes(text);
    return text;
  }

 private:
  /** A random walk from the root that stops early often, so top-level fields are hit as much as vocab entries. */
  json* pick(json& doc) {
    json* at = &doc;
    while ((at->is_object() || at->is_array()) && !at->empty() && !chance(4)) {
      auto it = at->begin();
      std::advance(it, long(below(at->size())));
      at = &*it;
    }
    return at;
  }

  json odd_value() {
    switch (below(16)) {
      case 0: return nullptr;
      case 1: return true;
      case 2: return -1;
      case 3: return 0;
      case 4: return 2147483648LL;  // one past INT32_MAX
      case 5: return -2147483649LL;
      case 6: return 18446744073709551615ULL;
      case 7: return 1e308;
      case 8: return 0.5;
      case 9: return "";
      case 10: return "x\ny";
      case 11: return "../../etc/passwd";
      case 12: return json::array();
      case 13: return json::object();
      case 14: {  // deep nesting, built once (moved in, never copied, while it grows)
        static const json deep = [] {
          json d = json::array();
          for (int i = 0; i < 2000; i++) {
            json outer = json::array();
            outer.push_back(std::move(d));
            d = std::move(outer);
          }
          return d;
        }();
        return deep;
      }
      default: return std::string(1 + below(3), char(below(32)));  // control characters
    }
  }

  void edit(json& doc) {
    json* at = pick(doc);
    switch (below(7)) {
      case 0:
      case 1: *at = odd_value(); break;
      case 2:  // drop a field or element
        if ((at->is_object() || at->is_array()) && !at->empty()) {
          if (at->is_object()) {
            auto it = at->begin();
            std::advance(it, long(below(at->size())));
            at->erase(it);
          } else {
            at->erase(below(at->size()));
          }
        }
        break;
      case 3:  // add a field or element
        if (at->is_object()) (*at)[chance(2) ? "extra" : "x\ty"] = odd_value();
        else if (at->is_array()) at->push_back(chance(2) && !at->empty() ? (*at)[0] : odd_value());
        break;
      case 4:  // nudge a number
        if (at->is_number_integer()) *at = at->get<int64_t>() + int64_t(below(5)) - 2;
        else if (at->is_number()) *at = -at->get<double>();
        break;
      case 5:  // scale a number
        if (at->is_number_integer()) *at = at->get<int64_t>() * (chance(2) ? 1000003 : -1);
        break;
      default:  // change a string
        if (at->is_string()) {
          std::string s = at->get<std::string>();
          if (!s.empty() && chance(2)) s.resize(below(s.size()));
          else s += chance(2) ? "\xc3\xa9" : "\n";
          *at = s;
        }
    }
  }

  /** Text-level damage: truncation, a flipped byte, a stray non-UTF-8 byte. */
 public:
  std::string bytes(std::string t) {
    if (t.empty()) return t;
    switch (below(3)) {
      case 0: t.resize(below(t.size())); break;
      case 1: t[below(t.size())] ^= char(1 << below(8)); break;
      default: t.insert(below(t.size()), 1, char(0xff));
    }
    return t;
  }

 private:
  std::mt19937_64 rng_;
};

/** "manifest.json: ..." on one line. */
void expect_one_clear_line(const std::string& msg, const std::string& file, size_t i, const std::string& input) {
  bool ok = msg.rfind(file + ": ", 0) == 0 && msg.find('\n') == std::string::npos && msg.find('\r') == std::string::npos;
  EXPECT_TRUE(ok) << "seed " << kSeed << " case " << i << ": refusal is not one line naming " << file << ": '" << msg
                  << "'\ninput (first 2000 bytes): " << input.substr(0, 2000);
}

std::string temp_dir() {
  char tmpl[] = "/tmp/forge-fuzz-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

json tensor(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, const std::string& bind) {
  return {{"name", name}, {"dtype", dtype}, {"shape", shape}, {"bind", bind}};
}

/**
 * A small valid bundle written from scratch (one decoder layer, hidden 4, vocab 8, 4 cache slots):
 * the seed document. Files exist with the sizes and sha256 values the manifest gives.
 */
json write_seed_bundle(const std::string& dir) {
  auto file = [&](const std::string& name, const std::string& bytes) {
    write_file(dir + "/" + name, bytes);
    return forge::sha256_file(dir + "/" + name);
  };
  const std::string weights(64, '\1');
  json kv = [](const char* n) {
    return json{{"name", n}, {"kind", "kv-cache"}, {"dtype", "float32"}, {"shape", {1, 1, 4, 2}}, {"positionAxis", 2}};
  }("kv.0.k");
  json kv_v = kv;
  kv_v["name"] = "kv.0.v";
  json k_in = tensor("past_k", "float32", {1, 1, 4, 2}, "state"), v_in = tensor("past_v", "float32", {1, 1, 4, 2}, "state");
  k_in["state"] = "kv.0.k";
  v_in["state"] = "kv.0.v";
  json k_out = tensor("new_k", "float32", {1, 1, 1, 2}, "state-rows"), v_out = tensor("new_v", "float32", {1, 1, 1, 2}, "state-rows");
  k_out["state"] = "kv.0.k";
  k_out["axis"] = 2;
  v_out["state"] = "kv.0.v";
  v_out["axis"] = 2;
  json decode = {
      {"name", "shard0.decode"}, {"component", "shard0"}, {"role", "decode"}, {"tokens", 1}, {"file", "shard0.decode.onnx"}, {"sha256", file("shard0.decode.onnx", "graph")},
      {"layers", {0, 0}},
      {"inputs", {tensor("h", "float32", {1, 1, 4}, "residual"), tensor("pos", "int32", {1}, "positions"), tensor("mask", "float32", {1, 1, 1, 5}, "mask"), k_in, v_in}},
      {"outputs", {tensor("h_out", "float32", {1, 1, 4}, "residual"), k_out, v_out}},
      {"quant", {{"weights", "fp32"}, {"activations", "float32"}}}};
  json lm_head = {
      {"name", "lm_head"}, {"component", "lm_head"}, {"role", "lm_head"}, {"tokens", 1}, {"file", "lm_head.onnx"}, {"sha256", file("lm_head.onnx", "graph")},
      {"inputs", {tensor("h", "float32", {1, 1, 4}, "residual")}},
      {"outputs", {tensor("logits", "float32", {1, 1, 8}, "logits")}},
      {"quant", {{"weights", "fp32"}, {"activations", "float32"}}}};
  return {
      {"format", "forge-bundle"}, {"version", 2}, {"recipe", "fuzz"},
      {"arch", {{"id", "v81"}, {"socModel", 87}, {"dspArch", "v81"}}},
      {"hostOp", "decoder_generate"},
      {"model", {{"family", "qwen3"}, {"layers", 1}, {"hidden", 4}, {"vocab", 8}}},
      {"contexts",
       {{{"name", "shard0"}, {"files", {{{"path", "shard0.bin"}, {"sha256", file("shard0.bin", weights)}, {"bytes", 64}}}}, {"graphs", {decode}}},
        {{"name", "lm_head"}, {"files", json::array()}, {"graphs", {lm_head}}}}},
      {"state", {kv, kv_v}},
      {"hostTables", {{{"name", "embedding"}, {"use", "embedding"}, {"file", "embedding.f16.bin"}, {"sha256", file("embedding.f16.bin", weights)}, {"dtype", "float16"}, {"shape", {8, 4}}}}},
      {"mask", {{"masked", -1e9}, {"layout", "past-then-new"}}},
      {"tokenizer", {{"file", "tokenizer.json"}, {"sha256", file("tokenizer.json", "{}")}, {"bos", nullptr}, {"eos", {7}}, {"chatTemplate", nullptr},
                     {"chat", {{"prefix", "<|im_start|>user\n"}, {"suffix", "<|im_end|>\n<|im_start|>assistant\n"}}}}},
      {"limits", {{"maxContext", 4}}},
      {"generation", {{"maxNewTokens", 2}, {"greedy", true}}}};
}

}  // namespace

TEST(Fuzz, ManifestLoaderRefusesEveryMutationInOneLine) {
  const std::string dir = temp_dir();
  const json good = write_seed_bundle(dir);
  const std::string path = dir + "/manifest.json";
  write_file(path, good.dump());
  ASSERT_NO_THROW(forge::load_manifest(path, dir)) << "the seed bundle must load";
  Mutator mu(kSeed);
  size_t refused = 0;
  for (size_t i = 0; i < kCases && !HasFailure(); i++) {
    const std::string text = mu.mutate(good);
    try {
      // Text that is still JSON goes straight to the validator; damaged text through the file reader.
      json doc = json::parse(text, nullptr, false);
      if (doc.is_discarded()) {
        write_file(path, text);
        forge::load_manifest(path, dir);
      } else {
        forge::parse_manifest(doc, "manifest.json", dir);
      }
    } catch (const forge::ManifestError& e) {
      refused++;
      expect_one_clear_line(e.what(), "manifest.json", i, text);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << kSeed << " case " << i << ": not a ManifestError: " << e.what() << "\ninput: " << text.substr(0, 2000);
    }
  }
  std::printf("[ fuzz     ] manifest: %zu cases, %zu refused, seed %llu\n", kCases, refused, (unsigned long long)kSeed);
  EXPECT_GT(refused, kCases / 2) << "mutations that mostly load test little";
  std::system(("rm -rf '" + dir + "'").c_str());
}

TEST(Fuzz, TokenizerLoaderRefusesEveryMutationInOneLine) {
  std::ifstream in(std::string(FORGE_FIXTURES_DIR) + "/tiny-qwen3.tokenizer.json");
  const json good = json::parse(in);
  ASSERT_NO_THROW(forge::Tokenizer::from_json(good.dump(), "tokenizer.json")) << "the seed tokenizer must load";
  Mutator mu(kSeed + 1);
  size_t refused = 0;
  for (size_t i = 0; i < kCases && !HasFailure(); i++) {
    const std::string text = mu.mutate(good);
    try {
      forge::Tokenizer tok = forge::Tokenizer::from_json(text, "tokenizer.json");
      // What loads must also run: encode text that reaches the added tokens, the split and the merges.
      std::vector<int> ids = tok.encode("Hello, world 42 <|im_end|> caf\xc3\xa9\n");
      tok.decode(ids);
    } catch (const std::runtime_error& e) {
      refused++;
      expect_one_clear_line(e.what(), "tokenizer.json", i, text);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << kSeed + 1 << " case " << i << ": not a runtime_error: " << e.what() << "\ninput: " << text.substr(0, 2000);
    }
  }
  std::printf("[ fuzz     ] tokenizer.json: %zu cases, %zu refused, seed %llu\n", kCases, refused, (unsigned long long)kSeed + 1);
  EXPECT_GT(refused, kCases / 10);
}

TEST(Fuzz, GraphWeightReaderRefusesEveryMutationInOneLine) {
  // A valid graph (two fp32 initializers in weights.data) next to a data file of the right size.
  const std::string dir = temp_dir();
  std::ifstream in(std::string(FORGE_FIXTURES_DIR) + "/weights/decode.onnx", std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_file(dir + "/weights.data", "");
  ASSERT_EQ(truncate((dir + "/weights.data").c_str(), 2048 * 4096 * 4 + 4096 * 4), 0);
  const std::string path = dir + "/graph.onnx";
  write_file(path, good);
  {
    forge::SharedWeights w;
    Ort::SessionOptions so;
    ASSERT_NO_THROW(w.add_to(so, path)) << "the seed graph must load";
    ASSERT_EQ(w.stats().tensors, 2u);
  }
  Mutator mu(kSeed + 2);
  size_t refused = 0;
  for (size_t i = 0; i < kCases && !HasFailure(); i++) {
    std::string bytes = good;
    for (size_t k = 0, n = 1 + mu.below(3); k < n; k++) bytes = mu.bytes(bytes);
    write_file(path, bytes);
    try {
      forge::SharedWeights w;
      Ort::SessionOptions so;
      w.add_to(so, path);
    } catch (const std::runtime_error& e) {
      refused++;
      expect_one_clear_line(e.what(), path, i, bytes);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << kSeed + 2 << " case " << i << ": not a runtime_error: " << e.what();
    }
  }
  std::printf("[ fuzz     ] graph weights: %zu cases, %zu refused, seed %llu\n", kCases, refused, (unsigned long long)kSeed + 2);
  EXPECT_GT(refused, kCases / 10);
  std::system(("rm -rf '" + dir + "'").c_str());
}
