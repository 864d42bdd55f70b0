// phimoe_generate on the PhiMoE twin's bundles (test/helpers/make-bundle.ts --phimoe): every token
// HF's, and every routing decision HF's (the experts HF's sparsemixer chose at each position and
// layer, from the trace); and its validator refuses, naming the field, what it would not run.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bundle_env.h"
#include "executor.h"
#include "host_op.h"
#include "manifest.h"
#include "phimoe_generate/phimoe_generate.h"

using nlohmann::json;

namespace {

/** The trace's int64 tensors by name (a safetensors file: u64 header length, JSON header, data), its
 *  header parsed once: the route checks look up thousands. */
class TraceInts {
 public:
  explicit TraceInts(const std::string& dir) {
    std::ifstream meta_in(dir + "/trace.json");
    std::ifstream in(dir + "/" + json::parse(meta_in).at("tensors").get<std::string>(), std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    in.read(header.data(), std::streamsize(n));
    header_ = json::parse(header);
    data_.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::vector<int64_t> operator()(const std::string& name) const {
    const json& t = header_.at(name);
    if (t.at("dtype") != "I64") throw std::runtime_error(name + " is " + t.at("dtype").get<std::string>() + ", not I64");
    const auto off = t.at("data_offsets").get<std::vector<uint64_t>>();
    std::vector<int64_t> v((off[1] - off[0]) / 8);
    std::memcpy(v.data(), data_.data() + off[0], v.size() * 8);
    return v;
  }

 private:
  json header_;
  std::string data_;
};

using forge_test::load;

/** Teacher-forced on HF's tokens, every prompt, with the batched prefill (when the bundle has it) and
 *  decoding over the prompt: the tokens, and how many routes equal HF's, at every prompt and
 *  generated position. */
void expect_hf(const char* label, const std::string& bundle, const std::string& trace, bool routes_exact) {
  auto l = load(bundle);
  auto* gen = dynamic_cast<forge::PhimoeGenerate*>(l->gen.get());
  ASSERT_NE(gen, nullptr) << "the registry did not make a PhimoeGenerate for hostOp " << l->manifest.host_op;
  gen->record_routes(true);
  const auto prompts = forge_test::load_trace(trace);
  ASSERT_FALSE(prompts.empty());
  const TraceInts trace_ints(trace);
  for (bool prefill : {true, false}) {
    size_t routes = 0, same = 0;
    for (size_t p = 0; p < prompts.size(); p++) {
      const auto& tp = prompts[p];
      auto r = gen->generate(tp.prompt_tokens, {int(tp.generated.size()), true, prefill}, tp.generated);
      EXPECT_EQ(r.used_prefill, prefill && gen->has_prefill()) << label;
      EXPECT_EQ(r.generated, tp.generated) << label << " prompt " << p << (r.used_prefill ? " (prefill)" : "");
      // Every position the trace stepped through (the prompt, then all generated tokens but the last).
      ASSERT_EQ(gen->routes().size(), (tp.prompt_tokens.size() + tp.generated.size() - 1) * size_t(l->manifest.layers)) << label;
      for (const forge::PhimoeRouteAt& at : gen->routes()) {
        const auto hf = trace_ints("p" + std::to_string(p) + "/s" + std::to_string(at.position) + "/expert_ids." + std::to_string(at.layer));
        const bool eq = hf.size() == 2 && hf[0] == at.route.expert[0] && hf[1] == at.route.expert[1];
        routes++;
        same += eq;
        if (routes_exact) {
          EXPECT_TRUE(eq) << label << " prompt " << p << " position " << at.position << " layer " << at.layer << ": experts " << at.route.expert[0] << ","
                          << at.route.expert[1] << ", HF " << hf[0] << "," << hf[1] << (r.used_prefill ? " (prefill)" : "");
        }
      }
    }
    std::printf("[ parity   ] %s%s: tokens HF's on %zu prompts; %zu/%zu routing decisions HF's\n", label,
                prefill && gen->has_prefill() ? " prefill" : " decode over the prompt", prompts.size(), same, routes);
  }
}

std::string error_of(const json& doc, const std::string& root) {
  try {
    forge::parse_manifest(doc, "manifest.json", root, {forge::Verify::none});
  } catch (const forge::ManifestError& e) {
    return e.what();
  }
  return "";
}

/** Indices (context, graph) of the first graph of `role`. */
std::pair<size_t, size_t> find(const json& j, const std::string& role) {
  for (size_t c = 0; c < j["contexts"].size(); c++)
    for (size_t g = 0; g < j["contexts"][c]["graphs"].size(); g++)
      if (j["contexts"][c]["graphs"][g]["role"] == role) return {c, g};
  throw std::runtime_error("no " + role + " graph");
}

/** (context, graph) of the first graph of `role` in a loaded manifest. */
std::pair<size_t, size_t> find_graph(const forge::Manifest& m, const std::string& role) {
  for (size_t c = 0; c < m.contexts.size(); c++)
    for (size_t g = 0; g < m.contexts[c].graphs.size(); g++)
      if (m.contexts[c].graphs[g].role == role) return {c, g};
  throw std::runtime_error("no " + role + " graph");
}

}  // namespace

TEST(PhimoeGenerate, Fp32TokensAndEveryRouteAreHFs) {
  NEED_ENV(bundle, "FORGE_TEST_PHIMOE_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_PHIMOE_TRACE");
  expect_hf("phimoe fp32", bundle, trace, true);
}

TEST(PhimoeGenerate, W8TokensAreHFs) {
  NEED_ENV(bundle, "FORGE_TEST_PHIMOE_BUNDLE_W8");
  NEED_ENV(trace, "FORGE_TEST_PHIMOE_TRACE");
  // W8 moves the router logits a little: a route may differ where HF's top-2 was a near-tie.
  expect_hf("phimoe W8", bundle, trace, false);
}

// A prompt of several chunks (the last one padded, or all full) continues the cache across prefill
// calls: the same tokens as decoding over it. Each layer's routes come in position order.
TEST(PhimoeGenerate, PrefillChunksEqualDecodeOverPrompt) {
  NEED_ENV(bundle, "FORGE_TEST_PHIMOE_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_PHIMOE_TRACE");
  auto l = load(bundle);
  auto* gen = dynamic_cast<forge::PhimoeGenerate*>(l->gen.get());
  ASSERT_TRUE(gen->has_prefill()) << "the tiny PhiMoE bundle is expected to have prefill graphs";
  const auto [pc, pg] = find_graph(l->manifest, "experts_prefill");
  const int chunk = l->manifest.contexts[pc].graphs[pg].tokens;
  const auto prompts = forge_test::prefill_test_prompts(trace, chunk, l->manifest.vocab);
  gen->record_routes(true);
  for (const auto& p : prompts) {
    auto a = gen->generate(p, {16, true, true});
    std::vector<int> last(size_t(l->manifest.layers), -1);
    for (const forge::PhimoeRouteAt& at : gen->routes()) {
      EXPECT_GT(at.position, last[size_t(at.layer)]) << "layer " << at.layer;
      last[size_t(at.layer)] = at.position;
    }
    auto b = gen->generate(p, {16, true, false});
    EXPECT_TRUE(a.used_prefill);
    EXPECT_FALSE(b.used_prefill);
    EXPECT_EQ(a.generated, b.generated) << "prompt of " << p.size() << " tokens, prefill chunks of " << chunk;
  }
}

TEST(PhimoeManifest, EachMutationIsRefusedNamingTheField) {
  NEED_ENV(bundle, "FORGE_TEST_PHIMOE_BUNDLE");
  std::ifstream in(bundle + "/manifest.json");
  const json good = json::parse(in);
  ASSERT_EQ(error_of(good, bundle), "");
  const auto [ec, eg] = find(good, "experts");
  const auto [ac, ag] = find(good, "attn_router");
  auto experts_in = [ec = ec, eg = eg](json& j, const std::string& name) -> json& {
    for (json& i : j["contexts"][ec]["graphs"][eg]["inputs"])
      if (i["name"] == name) return i;
    throw std::runtime_error("no experts input " + name);
  };
  const std::string E = "contexts[" + std::to_string(ec) + "].graphs[" + std::to_string(eg) + "]";
  const std::string A = "contexts[" + std::to_string(ac) + "].graphs[" + std::to_string(ag) + "]";
  struct Mutation {
    const char* what;
    std::function<void(json&)> apply;
    std::string expect;
  };
  const std::vector<Mutation> mutations = {
      {"top-3", [](json& j) { j["hostOpParams"]["top_k"] = 3; }, "manifest.json: hostOpParams.top_k: sparsemixer routes top-2 only"},
      {"no experts param", [](json& j) { j["hostOpParams"].erase("experts"); }, "hostOpParams.experts: missing"},
      {"unknown param", [](json& j) { j["hostOpParams"]["temperature"] = 1; }, "hostOpParams.temperature: phimoe_generate reads no parameter 'temperature'"},
      {"routing of a layer", [&](json& j) { experts_in(j, "routing")["layer"] = 0; }, ".layer: the experts graph serves every layer"},
      {"rows of a layer", [&](json& j) { experts_in(j, "expert_down_1")["layer"] = 2; }, ".layer: the experts graph serves every layer: its rows are the current layer's"},
      {"slot 2", [&](json& j) { experts_in(j, "expert_down_1")["slot"] = 2; }, ".slot: must be 0 or 1 (top-2)"},
      {"rows by token", [&](json& j) { experts_in(j, "expert_down_1")["index"] = "token"; }, ".index: the experts graph takes rows by expert"},
      {"slot bound twice", [&](json& j) { experts_in(j, "expert_down_1")["slot"] = 0; }, "slot 0 is bound twice"},
      {"rows of another shape", [&](json& j) { experts_in(j, "expert_down_1")["shape"] = {32, 64}; }, "is not one expert's rows of 'experts.down' [64,32]"},
      {"hand-off no graph gives", [&](json& j) { experts_in(j, "moe_in")["handoff"] = "moe_out"; }, "no graph gives hand-off 'moe_out'"},
      {"router of another layer", [&](json& j) {
         for (json& o : j["contexts"][ac]["graphs"][ag]["outputs"])
           if (o["bind"] == "router-logits") o["layer"] = 3;
       }, A + ".outputs"},
      {"a decode graph", [&](json& j) { j["contexts"][ec]["graphs"][eg]["role"] = "decode"; }, E + ".role: phimoe_generate runs no 'decode' graph"},
      {"expert table of other layers", [](json& j) { j["hostTables"][1]["shape"][0] = 5; }, "hostTables[1]"},
      {"ring cache", [](json& j) { j["state"][0]["window"] = 8; }, "state[0]"},
  };
  for (const Mutation& mu : mutations) {
    json doc = good;
    mu.apply(doc);
    const std::string err = error_of(doc, bundle);
    EXPECT_NE(err.find(mu.expect), std::string::npos) << mu.what << ": expected '" << mu.expect << "', got '" << err << "'";
  }
}

TEST(PhimoeManifest, EachPrefillMutationIsRefusedNamingTheField) {
  NEED_ENV(bundle, "FORGE_TEST_PHIMOE_BUNDLE");
  std::ifstream in(bundle + "/manifest.json");
  const json good = json::parse(in);
  ASSERT_EQ(error_of(good, bundle), "");
  const auto [ec, eg] = find(good, "experts_prefill");
  const int N = good["contexts"][ec]["graphs"][eg]["tokens"];
  const int layers = good["model"]["layers"];
  auto graph_path = [](size_t c, size_t g) { return "contexts[" + std::to_string(c) + "].graphs[" + std::to_string(g) + "]"; };
  auto input_at = [&](const std::string& name) {
    const json& ins = good["contexts"][ec]["graphs"][eg]["inputs"];
    for (size_t i = 0; i < ins.size(); i++)
      if (ins[i]["name"] == name) return graph_path(ec, eg) + ".inputs[" + std::to_string(i) + "]";
    throw std::runtime_error("no experts_prefill input " + name);
  };
  auto layer_graph = [&](const json& j, int layer) {
    for (size_t c = 0; c < j["contexts"].size(); c++)
      for (size_t g = 0; g < j["contexts"][c]["graphs"].size(); g++) {
        const json& gr = j["contexts"][c]["graphs"][g];
        if (gr["role"] == "attn_router_prefill" && gr["layers"][0] == layer) return std::make_pair(c, g);
      }
    throw std::runtime_error("no attn_router_prefill graph of layer " + std::to_string(layer));
  };
  auto experts_in = [ec = ec, eg = eg](json& j, const std::string& name) -> json& {
    for (json& i : j["contexts"][ec]["graphs"][eg]["inputs"])
      if (i["name"] == name) return i;
    throw std::runtime_error("no experts_prefill input " + name);
  };
  // A whole graph of M tokens: every shape the generic rules tie to tokens, so only the tokens differ from the others'.
  auto retoken = [](json& g, int M) {
    const int n = g["tokens"];
    g["tokens"] = M;
    for (json& i : g["inputs"]) {
      if (i["bind"] == "residual" || i["bind"] == "hand-off") i["shape"][1] = M;
      if (i["bind"] == "positions") i["shape"] = {M};
      if (i["bind"] == "mask") i["shape"] = {1, 1, M, int(i["shape"][3]) - n + M};
    }
    for (json& o : g["outputs"]) {
      if (o["bind"] == "state-rows") o["shape"][int(o["axis"])] = M;
      else o["shape"][1] = M;
    }
  };
  const auto [lc, lg] = layer_graph(good, layers - 1);
  const auto [oc, og] = layer_graph(good, 1);
  struct Mutation {
    const char* what;
    std::function<void(json&)> apply;
    std::string expect;
  };
  const std::vector<Mutation> mutations = {
      {"a layer without its attn_router_prefill", [&, lc = lc, lg = lg](json& j) {
         json& gs = j["contexts"][lc]["graphs"];
         gs.erase(gs.begin() + std::ptrdiff_t(lg));
         if (gs.empty()) j["contexts"].erase(j["contexts"].begin() + std::ptrdiff_t(lc));
       }, "manifest.json: contexts: no attn_router_prefill graph runs layer " + std::to_string(layers - 1)},
      {"experts_prefill binding slot 1", [&](json& j) { experts_in(j, "expert_down_0")["slot"] = 1; }, input_at("expert_down_0") + ".slot: must be 0 (one expert per call)"},
      {"routing [2], not [N]", [&](json& j) { experts_in(j, "routing")["shape"] = {2}; }, input_at("routing") + ".shape: [2] must be [" + std::to_string(N) + "]"},
      {"tokens of another prefill length", [&, oc = oc, og = og](json& j) { retoken(j["contexts"][oc]["graphs"][og], N + 1); },
       graph_path(oc, og) + ".tokens: " + std::to_string(N + 1) + " but "},
      {"a one-token prefill", [&](json& j) {
         for (json& c : j["contexts"])
           for (json& g : c["graphs"])
             if (g["role"] == "attn_router_prefill" || g["role"] == "experts_prefill") retoken(g, 1);
       }, ".tokens: 1: a prefill graph runs at least 2 tokens"},
  };
  for (const Mutation& mu : mutations) {
    json doc = good;
    mu.apply(doc);
    const std::string err = error_of(doc, bundle);
    EXPECT_NE(err.find(mu.expect), std::string::npos) << mu.what << ": expected '" << mu.expect << "', got '" << err << "'";
  }
}
