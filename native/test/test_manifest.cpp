// Manifest validation: the tiny bundle's manifest loads; each mutation of it is refused with a
// message naming the field path.
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bundle_env.h"
#include "host_op.h"
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
  for (const forge::Context& c : m.contexts)
    for (const forge::Graph& g : c.graphs) EXPECT_EQ(g.component, c.name) << g.path;
  ASSERT_EQ(m.host_tables.size(), 1u);
  EXPECT_EQ(m.host_tables[0].use, "embedding");
  EXPECT_EQ(m.host_tables[0].shape, (std::vector<int64_t>{m.vocab, m.hidden}));
  // The twin's Qwen template, rendered by forge around one user turn.
  ASSERT_TRUE(m.chat);
  EXPECT_EQ(m.chat->prefix, "<|im_start|>user\n");
  EXPECT_EQ(m.chat->suffix, "<|im_end|>\n<|im_start|>assistant\n");
}

// The registry holds the built-in host-ops by name; anything else is not one.
TEST(HostOps, RegistryFindsTheBuiltInsByName) {
  EXPECT_EQ(forge::host_op_names(), (std::vector<std::string>{"decoder_generate", "qwen3_5_generate", "gemma4_split_generate", "phimoe_generate", "qwen3_vl_generate"}));
  for (const std::string& n : forge::host_op_names()) {
    const forge::HostOpSpec* h = forge::find_host_op(n);
    ASSERT_NE(h, nullptr) << n;
    EXPECT_EQ(h->name, n);
    EXPECT_NE(h->validate, nullptr);
    EXPECT_NE(h->make, nullptr);
  }
  EXPECT_EQ(forge::find_host_op("gemma4_generate"), nullptr);
  EXPECT_EQ(forge::find_host_op(""), nullptr);
}

TEST(Manifest, EachMutationNamesTheFieldPath) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  const json good = read_json(bundle + "/manifest.json");
  ASSERT_EQ(error_of(good, bundle), "");
  const int C = good["limits"]["maxContext"].get<int>();
  // Where a binding pushed onto the decode graph lands.
  const std::string next_in = "contexts[0].graphs[1].inputs[" + std::to_string(good["contexts"][0]["graphs"][1]["inputs"].size()) + "]";
  const std::string next_out = "contexts[0].graphs[1].outputs[" + std::to_string(good["contexts"][0]["graphs"][1]["outputs"].size()) + "]";
  const std::string kv0 = good["state"][0]["shape"].dump();
  std::vector<Mutation> mutations = {
      {"format", [](json& j) { j["format"] = "other"; }, "manifest.json: format: 'other' is not forge-bundle"},
      {"a v1 manifest", [](json& j) { j["version"] = 1; }, "manifest.json: version: version 1 is not supported: this runtime reads manifest version 2 (rebuild the bundle with this forge)"},
      {"undeclared state", [](json& j) { j["contexts"][0]["graphs"][1]["inputs"][3]["state"] = "kv.9.k"; },
       "manifest.json: contexts[0].graphs[1].inputs[3].state: 'kv.9.k' is not a declared state"},
      {"state-rows of undeclared state", [](json& j) { j["contexts"][0]["graphs"][0]["outputs"][1]["state"] = "kv.7.v"; },
       "contexts[0].graphs[0].outputs[1].state: 'kv.7.v' is not a declared state"},
      {"role not an identifier", [](json& j) { j["contexts"][0]["graphs"][0]["role"] = "Encode"; }, "contexts[0].graphs[0].role: 'Encode' is not a lowercase identifier"},
      {"role the host-op does not run", [](json& j) { j["contexts"][0]["graphs"][0]["role"] = "encode"; },
       "contexts[0].graphs[0].role: decoder_generate runs no 'encode' graph (its roles: prefill, decode, lm_head)"},
      {"component missing", [](json& j) { j["contexts"][0]["graphs"][0].erase("component"); }, "contexts[0].graphs[0].component: missing"},
      {"two decode graphs of one component", [](json& j) {
         auto& g = j["contexts"][1]["graphs"][0];
         g["component"] = "shard0";
         g["role"] = "decode";
         g["layers"] = j["contexts"][0]["graphs"][1]["layers"];
       },
       "contexts[1].graphs[0].role: component 'shard0' already has a decode graph of layers 0..3 at contexts[0].graphs[1]"},
      // Graphs of one role over other layers may share a component (PhiMoE's per-layer attention);
      // the decoder host-ops' own rules refuse that shape.
      {"a second decode graph, of other layers", [](json& j) {
         json g = j["contexts"][0]["graphs"][1];
         g["name"] = "shard0.decode2";
         g["layers"] = {2, 2};
         j["contexts"][0]["graphs"].push_back(g);
       },
       "contexts[0].graphs[2].layers: prefill and decode graphs of a context run the same layers"},
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
      // A residual is float32 or an f16 hand-off between contexts; the first shard's is the host's embedding rows.
      {"residual dtype", [](json& j) { j["contexts"][0]["graphs"][1]["inputs"][0]["dtype"] = "int32"; }, "contexts[0].graphs[1].inputs[0].dtype: 'int32' must be float32"},
      {"first shard's residual in f16", [](json& j) { j["contexts"][0]["graphs"][1]["inputs"][0]["dtype"] = "float16"; },
       "contexts[0].graphs[1].inputs[0].dtype: 'float16' must be float32: the first shard's residual is the host's embedding rows, not a hand-off"},
      {"missing field", [](json& j) { j.erase("tokenizer"); }, "manifest.json: tokenizer: missing"},
      {"hostOp not registered", [](json& j) { j["hostOp"] = "gemma4_generate"; },
       "manifest.json: hostOp: 'gemma4_generate' is not a registered host-op (registered: decoder_generate, qwen3_5_generate, gemma4_split_generate, phimoe_generate, qwen3_vl_generate)"},
      // The registry answers first: no file of the bundle is looked at for an unknown host-op.
      {"hostOp not registered, before any graph", [](json& j) { j["hostOp"] = "gemma4_generate"; j["contexts"][0]["graphs"][0]["file"] = "gone.onnx"; },
       "manifest.json: hostOp: 'gemma4_generate' is not a registered host-op"},
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
      // Host tables: generic checks of the file, then the host-op's one f16 [vocab, hidden] embedding.
      {"host table size", [](json& j) { j["hostTables"][0]["shape"][1] = 32; }, "hostTables[0].file: 'embedding.f16.bin' has 132224 bytes, expected [1033,32] float16 = 66112"},
      {"host table use", [](json& j) { j["hostTables"][0]["use"] = "experts"; }, "hostTables[0].use: 'experts' is not one of embedding, per-layer-embedding"},
      {"host table declared twice", [](json& j) { j["hostTables"].push_back(j["hostTables"][0]); }, "hostTables[1].name: 'embedding' is declared twice"},
      {"embedding shape", [](json& j) { j["hostTables"][0]["shape"] = {2066, 32}; }, "hostTables[0].shape: [2066,32] must be [model.vocab, model.hidden] = [1033,64]"},
      {"embedding dtype", [](json& j) { j["hostTables"][0]["dtype"] = "bfloat16"; }, "hostTables[0].dtype: 'bfloat16' must be float16"},
      {"no embedding", [](json& j) { j["hostTables"][0]["use"] = "per-layer-embedding"; }, "hostTables[0].use: decoder_generate reads no 'per-layer-embedding' table"},
      {"host-rows from an undeclared table", [](json& j) {
         auto& in = j["contexts"][0]["graphs"][1]["inputs"];
         in.push_back({{"name", "w"}, {"dtype", "int8"}, {"shape", {2, 64}}, {"bind", "host-rows"}, {"table", "experts.w"}, {"index", "expert"}, {"layer", 0}, {"slot", 1}});
       }, "manifest.json: " + next_in + ".table: 'experts.w' is not a declared host table"},
      {"host-rows of a declared table", [](json& j) {
         auto& in = j["contexts"][0]["graphs"][1]["inputs"];
         in.push_back({{"name", "e"}, {"dtype", "float16"}, {"shape", {1, 64}}, {"bind", "host-rows"}, {"table", "embedding"}, {"index", "token"}});
       }, next_in + ".bind: decoder_generate does not bind host-rows inputs"},
      {"routing weights with no router", [](json& j) {
         j["contexts"][0]["graphs"][1]["inputs"].push_back({{"name", "rw"}, {"dtype", "float32"}, {"shape", {2}}, {"bind", "routing-weights"}, {"layer", 1}});
       }, next_in + ".layer: no graph gives router-logits for layer 1"},
      {"encoder output of no component", [](json& j) {
         j["contexts"][0]["graphs"][1]["inputs"].push_back({{"name", "img"}, {"dtype", "float32"}, {"shape", {1, 4, 64}}, {"bind", "encoder-output"}, {"component", "vision"}});
       }, next_in + ".component: 'vision' is not a component of this manifest"},
      {"encoder output of a component that gives none", [](json& j) {
         j["contexts"][0]["graphs"][1]["inputs"].push_back({{"name", "img"}, {"dtype", "float32"}, {"shape", {1, 4, 64}}, {"bind", "encoder-output"}, {"component", "lm_head"}});
       }, next_in + ".component: component 'lm_head' gives no encoder-output"},
      {"encoder output under decoder_generate", [](json& j) {
         j["contexts"][1]["graphs"][0]["outputs"].push_back({{"name", "feat"}, {"dtype", "float32"}, {"shape", {1, 4, 64}}, {"bind", "encoder-output"}});
       }, "contexts[1].graphs[0].outputs[1].bind: decoder_generate does not bind encoder-output outputs"},
      {"router logits under decoder_generate", [](json& j) {
         j["contexts"][0]["graphs"][1]["outputs"].push_back({{"name", "router"}, {"dtype", "float32"}, {"shape", {1, 1, 4}}, {"bind", "router-logits"}, {"layer", 0}, {"topK", 2}});
       }, "manifest.json: " + next_out + ".bind: decoder_generate does not bind router-logits outputs"},
      {"router topK past the experts", [](json& j) {
         j["contexts"][0]["graphs"][1]["outputs"].push_back({{"name", "router"}, {"dtype", "float32"}, {"shape", {1, 1, 4}}, {"bind", "router-logits"}, {"layer", 0}, {"topK", 5}});
       }, next_out + ".topK: 5 is more than the 4 experts on the last axis"},
      // State: a ring cache is as long as its window (generic); the decoder host-ops have none.
      {"window and slots disagree", [](json& j) { j["state"][0]["window"] = 8; }, "state[0].shape: " + kv0 + " has " + std::to_string(C) + " slots on the position axis, window is 8"},
      {"window wider than maxContext", [C](json& j) { j["state"][0]["window"] = C + 1; }, "state[0].window: " + std::to_string(C + 1) + " is wider than limits.maxContext " + std::to_string(C)},
      {"windowed kv-cache under decoder_generate", [C](json& j) { j["state"][0]["window"] = C; },
       "manifest.json: state[0].window: decoder_generate has no ring caches"},
      // A shared state may be read without being written by the reading graph, but some graph writes it.
      {"shared state nobody writes", [](json& j) {
         j["state"][0]["shared"] = true;
         for (auto& g : j["contexts"][0]["graphs"]) g["outputs"].erase(1);  // new_k_0 of the prefill and the decode graph
       }, "manifest.json: state[0]: 'kv.0.k' is read but no graph writes its next value"},
      {"shared state under decoder_generate", [](json& j) { j["state"][0]["shared"] = true; }, "state[0].shared: decoder_generate keeps each state in the one context that carries it"},
      {"unshared state in two contexts", [](json& j) {
         j["contexts"][1]["graphs"][0]["inputs"].push_back(j["contexts"][0]["graphs"][1]["inputs"][3]);    // reads kv.0.k
         j["contexts"][1]["graphs"][0]["outputs"].push_back(j["contexts"][0]["graphs"][1]["outputs"][1]);  // and writes its rows
       }, "contexts[1].graphs[0]: state 'kv.0.k' is already carried by context shard0 (a state carried by several contexts declares shared: true)"},
      {"eos id", [](json& j) { j["tokenizer"]["eos"][0] = 99999; }, "tokenizer.eos[0]: 99999 is past model.vocab"},
      {"path escape", [](json& j) { j["contexts"][0]["graphs"][0]["file"] = "../x.onnx"; }, "contexts[0].graphs[0].file: '../x.onnx' must be a path inside the bundle"},
      {"missing file", [](json& j) { j["contexts"][0]["files"][0]["path"] = "nope.data"; }, "contexts[0].files[0].path: 'nope.data' does not exist"},
      {"file bytes", [](json& j) { j["contexts"][0]["files"][0]["bytes"] = 5; }, "contexts[0].files[0].bytes: 5 but"},
      {"wrong sha256", [](json& j) { j["contexts"][0]["graphs"][1]["sha256"] = std::string(64, 'a'); }, "contexts[0].graphs[1].sha256: sha256 of 'shard0.decode.onnx' is"},
      {"bad sha256 text", [](json& j) { j["tokenizer"]["sha256"] = "XYZ"; }, "tokenizer.sha256: 'XYZ' is not a lowercase hex sha256"},
      // tokenizer.chat: null or {prefix, suffix}, each a UTF-8 string (possibly empty).
      {"chat missing", [](json& j) { j["tokenizer"].erase("chat"); }, "manifest.json: tokenizer.chat: missing"},
      {"chat a string", [](json& j) { j["tokenizer"]["chat"] = "<|user|>"; }, "tokenizer.chat: expected an object"},
      {"chat suffix missing", [](json& j) { j["tokenizer"]["chat"] = {{"prefix", "<|user|>\n"}}; }, "tokenizer.chat.suffix: missing"},
      {"chat prefix a number", [](json& j) { j["tokenizer"]["chat"] = {{"prefix", 1}, {"suffix", ""}}; }, "tokenizer.chat.prefix: expected a string"},
      {"chat extra field", [](json& j) { j["tokenizer"]["chat"] = {{"prefix", ""}, {"suffix", ""}, {"system", ""}}; }, "tokenizer.chat.system: unknown field"},
      {"chat not UTF-8", [](json& j) { j["tokenizer"]["chat"] = {{"prefix", "a\xff"}, {"suffix", ""}}; }, "tokenizer.chat.prefix: text is not valid UTF-8 (byte 1)"},
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
      // Only a graph that reads no KV cache (Qwen3.5's linear-attention shard) may go without a mask.
      {"kv graph without mask", [](json& j) { j["contexts"][0]["graphs"][1]["inputs"].erase(2); }, "contexts[0].graphs[1].inputs: a decode graph needs a mask input"},
      {"nondeterministic without a digest", [](json& j) { j["contexts"][0]["files"][0]["nondeterministic"] = {{"why", "x"}}; },
       "contexts[0].files[0].nondeterministic.describeSha256: missing"},
      {"nondeterministic with an unknown field", [](json& j) {
         j["contexts"][0]["files"][0]["nondeterministic"] = {{"why", "x"}, {"describeSha256", std::string(64, 'a')}, {"ranges", 1}};
       }, "contexts[0].files[0].nondeterministic.ranges: unknown field"},
      {"precision map entry of unknown weights", [](json& j) { j["contexts"][0]["precision"] = json::array({{{"tensor", "model.layers.0.mlp.up_proj.weight"}, {"weights", "w3"}}}); },
       "contexts[0].precision[0].weights: 'w3' is not one of"},
      {"precision map entry without its tensor", [](json& j) { j["contexts"][0]["precision"] = json::array({{{"weights", "w8"}}}); }, "contexts[0].precision[0].tensor: missing"},
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

// The per-matrix precision map and a 'mixed' graph (quant auto, overrides) load: the runtime does not care.
TEST(Manifest, PrecisionMapAndMixedWeightsAreAccepted) {
  NEED_ENV(bundle, "FORGE_TEST_BUNDLE");
  json doc = read_json(bundle + "/manifest.json");
  doc["contexts"][0]["precision"] = json::array({{{"tensor", "model.layers.0.mlp.up_proj.weight"}, {"weights", "w4"}},
                                                {{"tensor", "model.layers.0.mlp.down_proj.weight"}, {"weights", "w8"}, {"why", "auto: promoted"}}});
  for (auto& g : doc["contexts"][0]["graphs"]) g["quant"]["weights"] = "mixed";
  EXPECT_EQ(error_of(doc, bundle), "");
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
      {"windowed kv-cache under qwen3_5_generate", [](json& j) {
         for (auto& s : j["state"])
           if (s["kind"] == "kv-cache") s["window"] = j["limits"]["maxContext"];
       }, "window: qwen3_5_generate has no ring caches"},
      {"router logits under qwen3_5_generate", [](json& j) {
         j["contexts"][0]["graphs"][0]["outputs"].push_back({{"name", "router"}, {"dtype", "float32"}, {"shape", {1, 1, 4}}, {"bind", "router-logits"}, {"layer", 0}, {"topK", 2}});
       }, "outputs[" + std::to_string(good["contexts"][0]["graphs"][0]["outputs"].size()) + "].bind: qwen3_5_generate does not bind router-logits outputs"},
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
