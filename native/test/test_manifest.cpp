// Manifest validation: the tiny bundle's manifest loads; each mutation of it is refused with a
// message naming the field path.
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bundle_env.h"
#include "manifest.h"

using nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::string error_of(const json& doc, const std::string& root, const forge::LoadOptions& opts = {}) {
  try {
    forge::parse_manifest(doc, "manifest.json", root, opts);
  } catch (const forge::ManifestError& e) {
    return e.what();
  }
  return "";
}

struct Mutation {
  const char* what;
  std::function<void(json&)> apply;
  std::string expect;  // substring of the error
};

void expect_each_refused(const json& good, const std::string& bundle, const std::vector<Mutation>& mutations) {
  for (const Mutation& mu : mutations) {
    json doc = good;
    mu.apply(doc);
    std::string err = error_of(doc, bundle);
    EXPECT_NE(err.find(mu.expect), std::string::npos) << mu.what << ": expected '" << mu.expect << "', got '" << err << "'";
  }
}

}  // namespace

TEST(Manifest, TinyBundleLoads) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  forge::Manifest m = forge::load_manifest(bundle + "/manifest.json", bundle);
  EXPECT_EQ(m.host_op, "decoder_generate");
  EXPECT_GE(m.contexts.size(), 2u);
  EXPECT_FALSE(m.state.empty());
  EXPECT_GT(m.max_context, 0);
}

TEST(Manifest, EachMutationNamesTheFieldPath) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  const json good = read_json(bundle + "/manifest.json");
  ASSERT_EQ(error_of(good, bundle), "");
  const int C = good["limits"]["maxContext"].get<int>();
  std::vector<Mutation> mutations = {
      {"format", [](json& j) { j["format"] = "other"; }, "manifest.json: format: 'other' is not forge-bundle"},
      {"version", [](json& j) { j["version"] = 2; }, "manifest.json: version: version 2 is not supported"},
      {"undeclared state", [](json& j) { j["contexts"][0]["graphs"][1]["inputs"][3]["state"] = "kv.9.k"; },
       "manifest.json: contexts[0].graphs[1].inputs[3].state: 'kv.9.k' is not a declared state"},
      {"state-rows of undeclared state", [](json& j) { j["contexts"][0]["graphs"][0]["outputs"][1]["state"] = "kv.7.v"; },
       "contexts[0].graphs[0].outputs[1].state: 'kv.7.v' is not a declared state"},
      {"role", [](json& j) { j["contexts"][0]["graphs"][0]["role"] = "encode"; }, "contexts[0].graphs[0].role: 'encode' is not one of"},
      {"decode tokens", [](json& j) { j["contexts"][0]["graphs"][1]["tokens"] = 2; }, "contexts[0].graphs[1].tokens: a decode graph takes 1 token"},
      {"prefill tokens vs shapes", [](json& j) { j["contexts"][0]["graphs"][0]["tokens"] = 4; }, "contexts[0].graphs[0].inputs[0].shape"},
      {"residual width", [](json& j) { j["contexts"][0]["graphs"][1]["inputs"][0]["shape"][2] = 65; }, "contexts[0].graphs[1].inputs[0].shape: [1,1,65] must be [1,1,64]"},
      {"positions dtype", [](json& j) { j["contexts"][0]["graphs"][1]["inputs"][1]["dtype"] = "int64"; }, "contexts[0].graphs[1].inputs[1].dtype: 'int64' must be int32"},
      {"mask shape", [C](json& j) { j["contexts"][0]["graphs"][1]["inputs"][2]["shape"][3] = C; }, "contexts[0].graphs[1].inputs[2].shape"},
      {"mask layout", [](json& j) { j["mask"]["layout"] = "new-then-past"; }, "manifest.json: mask.layout: 'new-then-past' is not one of past-then-new"},
      {"mask value", [](json& j) { j["mask"]["masked"] = "big"; }, "mask.masked: expected a number"},
      {"state slots vs maxContext", [](json& j) { j["state"][0]["shape"][2] = 64; }, "state[0].shape: [1,2,64,32] has 64 slots on the position axis"},
      {"maxContext", [C](json& j) { j["limits"]["maxContext"] = 2 * C; }, "state[0].shape"},
      {"state-rows axis", [](json& j) { j["contexts"][0]["graphs"][1]["outputs"][1]["axis"] = 1; }, "contexts[0].graphs[1].outputs[1].axis: 1 must be the position axis 2"},
      {"state-rows shape", [](json& j) { j["contexts"][0]["graphs"][1]["outputs"][2]["shape"][2] = 2; }, "contexts[0].graphs[1].outputs[2].shape"},
      {"state read, rows not written", [](json& j) { j["contexts"][0]["graphs"][1]["outputs"].erase(1); }, "contexts[0].graphs[1].inputs: state 'kv.0.k' is read but its next value is not an output"},
      {"bound twice", [](json& j) { j["contexts"][0]["graphs"][1]["inputs"][4]["state"] = "kv.0.k"; }, "contexts[0].graphs[1].inputs[4].state: 'kv.0.k' is bound twice"},
      {"unknown field", [](json& j) { j["contexts"][0]["graphs"][0]["extra"] = 1; }, "contexts[0].graphs[0].extra: unknown field"},
      {"missing field", [](json& j) { j.erase("tokenizer"); }, "manifest.json: tokenizer: missing"},
      {"hostOp", [](json& j) { j["hostOp"] = "phimoe_generate"; }, "hostOp: 'phimoe_generate' is not one of decoder_generate, qwen3_5_generate"},
      {"recurrent state bound as rows", [C](json& j) {
         j["hostOp"] = "qwen3_5_generate";  // the host-op that carries recurrent state
         j["state"][0] = {{"name", "kv.0.k"}, {"kind", "recurrent"}, {"dtype", "float32"}, {"shape", {1, 2, C, 32}}};
       }, "contexts[0].graphs[0].outputs[1].state: 'kv.0.k' is recurrent state: its output binds as state-replace"},
      {"kv-cache replaced", [](json& j) {
         auto& o = j["contexts"][0]["graphs"][1]["outputs"][1];
         o.erase("axis");
         o["bind"] = "state-replace";
       }, "contexts[0].graphs[1].outputs[1].state: 'kv.0.k' is a kv-cache: its output binds as state-rows"},
      {"recurrent with positionAxis", [](json& j) { j["state"][0]["kind"] = "recurrent"; }, "state[0].positionAxis: unknown field"},
      {"embedding shape", [](json& j) { j["hostTables"][0]["shape"][1] = 32; }, "hostTables[0].shape: [1033,32] must be [model.vocab, model.hidden]"},
      {"eos id", [](json& j) { j["tokenizer"]["eos"][0] = 99999; }, "tokenizer.eos[0]: 99999 is past model.vocab"},
      {"path escape", [](json& j) { j["contexts"][0]["graphs"][0]["file"] = "../x.onnx"; }, "contexts[0].graphs[0].file: '../x.onnx' must be a path inside the bundle"},
      {"missing file", [](json& j) { j["contexts"][0]["files"][0]["path"] = "nope.data"; }, "contexts[0].files[0].path: 'nope.data' does not exist"},
      {"file bytes", [](json& j) { j["contexts"][0]["files"][0]["bytes"] = 5; }, "contexts[0].files[0].bytes: 5 but"},
      {"wrong sha256", [](json& j) { j["contexts"][0]["graphs"][1]["sha256"] = std::string(64, 'a'); }, "contexts[0].graphs[1].sha256: sha256 of 'shard0.decode.onnx' is"},
      {"bad sha256 text", [](json& j) { j["tokenizer"]["sha256"] = "XYZ"; }, "tokenizer.sha256: 'XYZ' is not a lowercase hex sha256"},
      {"layer gap", [](json& j) { for (auto& g : j["contexts"][0]["graphs"]) g["layers"][0] = 1; }, "contexts[0].graphs: layers start at 1, expected 0"},
      {"layers past model", [](json& j) { j["contexts"][0]["graphs"][0]["layers"][1] = 9; }, "contexts[0].graphs[0].layers[1]: layer 9 is past model.layers 4"},
      {"lm-head first", [](json& j) { std::swap(j["contexts"][0], j["contexts"][1]); }, "contexts[0]: the lm-head comes before layers 0..3 are run"},
      {"no logits", [](json& j) { j["contexts"].erase(1); }, "contexts: no context gives logits"},
      {"greedy", [](json& j) { j["generation"]["greedy"] = false; }, "generation.greedy: must be true"},
      {"prefill without a state its decode graph carries", [](json& j) {
         auto& g = j["contexts"][0]["graphs"][0];
         g["inputs"].erase(3);   // past_k_0
         g["outputs"].erase(1);  // new_k_0
       }, "contexts[0].graphs[0].inputs: carries other state than the context's decode graph"},
      {"qwen3_5_generate with a prefill graph", [](json& j) { j["hostOp"] = "qwen3_5_generate"; },
       "contexts[0].graphs[0].role: qwen3_5_generate decodes over the prompt"},
      // Only a graph that reads no KV cache (Qwen3.5's linear-attention shard) may go without a mask.
      {"kv graph without mask", [](json& j) { j["contexts"][0]["graphs"][1]["inputs"].erase(2); }, "contexts[0].graphs[1].inputs: a decode graph needs a mask input"},
      {"nondeterministic without a digest", [](json& j) { j["contexts"][0]["files"][0]["nondeterministic"] = {{"why", "x"}}; },
       "contexts[0].files[0].nondeterministic.describeSha256: missing"},
      {"nondeterministic with an unknown field", [](json& j) {
         j["contexts"][0]["files"][0]["nondeterministic"] = {{"why", "x"}, {"describeSha256", std::string(64, 'a')}, {"ranges", 1}};
       }, "contexts[0].files[0].nondeterministic.ranges: unknown field"},
  };
  expect_each_refused(good, bundle, mutations);
}

// A compiled context binary's bytes vary between builds; its manifest entry says so, and the
// runtime still checks its real size and sha256.
TEST(Manifest, NondeterministicFileIsAcceptedAndStillChecked) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  json doc = read_json(bundle + "/manifest.json");
  doc["contexts"][0]["files"][0]["nondeterministic"] = {{"why", "QNN graph prepare is not deterministic"}, {"describeSha256", std::string(64, 'b')}};
  EXPECT_EQ(error_of(doc, bundle), "");
  doc["contexts"][0]["files"][0]["sha256"] = std::string(64, 'a');
  EXPECT_NE(error_of(doc, bundle).find("contexts[0].files[0].sha256: sha256 of"), std::string::npos);
}

// The hybrid (qwen3_5_generate) bundle: recurrent state, a shard without mask or positions.
TEST(Manifest, HybridBundleLoadsAndItsHostOpRulesHold) {
  NEED_ENV(bundle, "FORGE_TEST_HYBRID_BUNDLE");
  const json good = read_json(bundle + "/manifest.json");
  ASSERT_EQ(error_of(good, bundle), "");
  expect_each_refused(good, bundle, {
      {"recurrent state under decoder_generate", [](json& j) { j["hostOp"] = "decoder_generate"; },
       "state[0].kind: recurrent state needs hostOp qwen3_5_generate; decoder_generate carries kv-cache state only"},
      {"no lm-head context", [](json& j) { j["contexts"].erase(2); },
       "contexts: qwen3_5_generate runs the lm-head as a context of its own"},
  });
}

TEST(Manifest, WrongSha256OfAFileIsRefused) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  json doc = read_json(bundle + "/manifest.json");
  doc["hostTables"][0]["sha256"] = std::string(64, '0');
  std::string err = error_of(doc, bundle);
  EXPECT_NE(err.find("hostTables[0].sha256: sha256 of 'embedding.f16.bin' is "), std::string::npos) << err;
  EXPECT_NE(err.find("the manifest says 0000"), std::string::npos) << err;
}

TEST(Manifest, StartUpHashesAllButTheBigFilesWhoseSizeItChecks) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  const json good = read_json(bundle + "/manifest.json");
  // Everything above 1 KiB counts as big here: the tiny bundle has no multi-GB file.
  const forge::LoadOptions startup{forge::Verify::small, 1024};
  json emb = good;
  emb["hostTables"][0]["sha256"] = std::string(64, '0');
  EXPECT_EQ(error_of(emb, bundle, startup), "") << "a big file whose size matched is not hashed at start-up";
  EXPECT_NE(error_of(emb, bundle).find("hostTables[0].sha256: sha256 of 'embedding.f16.bin' is "), std::string::npos) << "--verify hashes it";
  json ctx = good;
  ctx["contexts"][0]["files"][0]["sha256"] = std::string(64, '0');
  EXPECT_EQ(error_of(ctx, bundle, startup), "");
  ctx["contexts"][0]["files"][0]["bytes"] = ctx["contexts"][0]["files"][0]["bytes"].get<uint64_t>() - 1;
  EXPECT_NE(error_of(ctx, bundle, startup).find("contexts[0].files[0].bytes: "), std::string::npos) << "its size is always checked";
  // A graph file's size is not in the manifest: it is hashed whatever its size.
  json graph = good;
  graph["contexts"][0]["graphs"][1]["sha256"] = std::string(64, 'a');
  EXPECT_NE(error_of(graph, bundle, startup).find("contexts[0].graphs[1].sha256: sha256 of 'shard0.decode.onnx' is"), std::string::npos);
  EXPECT_EQ(error_of(emb, bundle, forge::LoadOptions{forge::Verify::none}), "");
}

TEST(Manifest, LoadNamesUnreadableAndInvalidFiles) {
  EXPECT_THROW(forge::load_manifest("/nonexistent/manifest.json", "/nonexistent"), forge::ManifestError);
  std::string path = testing::TempDir() + "/bad-manifest.json";
  std::ofstream(path) << "{ not json";
  try {
    forge::load_manifest(path, testing::TempDir());
    FAIL();
  } catch (const forge::ManifestError& e) {
    EXPECT_NE(std::string(e.what()).find("bad-manifest.json: not valid JSON"), std::string::npos) << e.what();
  }
}
