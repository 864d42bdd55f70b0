// The manifest rules of phimoe_generate: what phimoe_generate.cpp runs, and nothing else. Run by
// load_manifest after the generic rules; each refusal names the field path.
//
// It runs, per token: for every layer 0..L-1 its one attn_router graph (residual, positions, mask,
// its KV caches in; residual, hand-offs, router-logits of that layer with topK 2, state-rows out),
// then the one experts graph (residual and those hand-offs in, the routing weights of the layer
// that routed last, host-rows of the two chosen experts: index expert, slot 0 or 1, no layer; a
// residual out); then the lm_head graph. Host tables: the f16 embedding, and expert tables
// [layers, experts, ...] of uses expert-weights / expert-scales. hostOpParams: experts, top_k (2),
// router_jitter_eps.
//
// Batched prefill, all or nothing: an attn_router_prefill graph for every layer (as attn_router,
// over N tokens) and one experts_prefill graph (as experts, but one expert per call: slot 0 only,
// one routing weight per token), all of the same tokens N >= 2. The decode graphs run 1 token.
#include <algorithm>
#include <cmath>
#include <set>

#include "phimoe_generate/phimoe_generate.h"

namespace forge {
namespace {

const char* const kOp = "phimoe_generate";

void params(const Manifest& m, int* experts) {
  auto number = [&](const char* key) {
    auto it = m.host_op_numbers.find(key);
    if (it == m.host_op_numbers.end()) m.fail(std::string("hostOpParams.") + key, std::string("missing (") + kOp + " needs experts, top_k and router_jitter_eps)");
    return it->second;
  };
  for (const auto& [key, v] : m.host_op_strings) m.fail("hostOpParams." + key, std::string(kOp) + " reads no string parameter");
  for (const auto& [key, v] : m.host_op_numbers)
    if (key != "experts" && key != "top_k" && key != "router_jitter_eps") m.fail("hostOpParams." + key, std::string(kOp) + " reads no parameter '" + key + "'");
  double e = number("experts");
  if (e != std::floor(e) || e < 2 || e > 1 << 20) m.fail("hostOpParams.experts", "must be a whole number of experts, at least 2");
  *experts = int(e);
  if (number("top_k") != 2) m.fail("hostOpParams.top_k", "sparsemixer routes top-2 only");
  double eps = number("router_jitter_eps");
  if (!(eps >= 0 && eps < 1)) m.fail("hostOpParams.router_jitter_eps", "must be in [0, 1)");
}

void state_and_tables(const Manifest& m, int experts) {
  for (const StateSpec& s : m.state) {
    if (s.kind != StateKind::kv_cache) m.fail(s.path + ".kind", std::string(kOp) + " carries kv-cache state only");
    if (s.window) m.fail(s.path + ".window", std::string(kOp) + " has no ring caches");
    if (s.shared) m.fail(s.path + ".shared", std::string(kOp) + " keeps each layer's cache in its own graph");
  }
  int embeddings = 0;
  for (const HostTable& t : m.host_tables) {
    if (t.use == "embedding") {
      if (embeddings++) m.fail(t.path + ".use", "a second embedding table");
      if (t.dtype != "float16") m.fail(t.path + ".dtype", "'" + t.dtype + "' must be float16");
      const std::vector<int64_t> want{m.vocab, m.hidden};
      if (t.shape != want) m.fail(t.path + ".shape", shape_str(t.shape) + " must be [model.vocab, model.hidden] = " + shape_str(want));
      continue;
    }
    if (t.use != "expert-weights" && t.use != "expert-scales") m.fail(t.path + ".use", std::string(kOp) + " reads no '" + t.use + "' table");
    if (t.use == "expert-scales" ? t.dtype != "float32" : (t.dtype != "int8" && t.dtype != "float16" && t.dtype != "float32"))
      m.fail(t.path + ".dtype", "'" + t.dtype + "' is not a dtype of a " + t.use + " table");
    if (t.shape.size() < 3 || t.shape[0] != m.layers || t.shape[1] != experts)
      m.fail(t.path + ".shape", shape_str(t.shape) + " must start [model.layers, hostOpParams.experts] = [" + std::to_string(m.layers) + "," + std::to_string(experts) + "]");
  }
  if (!embeddings) m.fail("hostTables", std::string(kOp) + " needs an 'embedding' table");
}

template <class T>
int count_bind(const std::vector<T>& v, decltype(T::bind) b) {
  return int(std::count_if(v.begin(), v.end(), [b](const T& x) { return x.bind == b; }));
}

std::set<std::string> handoffs_given(const Graph& g) {
  std::set<std::string> s;
  for (const GraphOutput& o : g.outputs)
    if (o.bind == OutputBind::hand_off) s.insert(o.handoff);
  return s;
}

// attn_router and attn_router_prefill: the residual, positions and mask shapes of g.tokens rows are the generic rules'.
void attn_router(const Manifest& m, const Graph& g, int experts) {
  const std::string what = "an " + g.role + " graph";
  const int64_t N = g.tokens;
  if (!g.layers || g.layers->first != g.layers->second) m.fail(g.path + ".layers", what + " runs exactly one layer");
  const int layer = g.layers->first;
  for (const GraphInput& in : g.inputs)
    if (in.bind != InputBind::residual && in.bind != InputBind::positions && in.bind != InputBind::mask && in.bind != InputBind::state)
      m.fail(in.path + ".bind", what + " does not bind " + bind_name(in.bind) + " inputs");
  for (InputBind b : {InputBind::residual, InputBind::positions, InputBind::mask})
    if (count_bind(g.inputs, b) != 1) m.fail(g.path + ".inputs", what + " needs one " + bind_name(b) + " input");
  for (const GraphOutput& o : g.outputs) {
    if (o.bind != OutputBind::residual && o.bind != OutputBind::hand_off && o.bind != OutputBind::router_logits && o.bind != OutputBind::state_rows)
      m.fail(o.path + ".bind", what + " does not bind " + bind_name(o.bind) + " outputs");
    if (o.bind == OutputBind::hand_off && o.shape != std::vector<int64_t>{1, N, m.hidden})
      m.fail(o.path + ".shape", shape_str(o.shape) + " must be [1, tokens, model.hidden] = " + shape_str({1, N, m.hidden}));
    if (o.bind == OutputBind::router_logits) {
      if (o.layer != layer) m.fail(o.path + ".layer", "layer " + std::to_string(o.layer) + " in a graph of layer " + std::to_string(layer));
      if (o.top_k != 2) m.fail(o.path + ".topK", "sparsemixer routes top-2 only");
      if (o.shape.back() != experts) m.fail(o.path + ".shape", shape_str(o.shape) + ": the last axis must be hostOpParams.experts " + std::to_string(experts));
      if (elements(o.shape) != size_t(N) * size_t(experts))
        m.fail(o.path + ".shape", shape_str(o.shape) + (N == 1 ? ": one token's logits" : ": " + std::to_string(N) + " tokens' logits, [1, " + std::to_string(N) + ", " + std::to_string(experts) + "]"));
    }
  }
  if (count_bind(g.outputs, OutputBind::residual) != 1) m.fail(g.path + ".outputs", what + " gives one residual (the attention residual)");
  if (count_bind(g.outputs, OutputBind::router_logits) != 1) m.fail(g.path + ".outputs", what + " gives one router-logits output");
}

// experts (decode: the two chosen experts' rows, slots 0 and 1, and their two weights) and
// experts_prefill (one expert per call: slot 0 only, and one weight per token, 0 where a token did
// not choose it); `handoffs` are what the attention graphs of the same pass give.
void experts_graph(const Manifest& m, const Graph& g, const std::set<std::string>& handoffs) {
  const bool prefill = g.role == phimoe_role::experts_prefill;
  const std::string what = "the " + g.role + " graph";
  const int64_t N = g.tokens;
  const int slots = prefill ? 1 : 2;
  std::set<std::pair<int, int>> bound;  // (table, slot)
  for (const GraphInput& in : g.inputs) {
    switch (in.bind) {
      case InputBind::residual: break;
      case InputBind::hand_off:
        if (!handoffs.count(in.handoff)) m.fail(in.path + ".handoff", "'" + in.handoff + "' is not what every " + (prefill ? "attn_router_prefill" : "attn_router") + " graph hands off");
        if (in.shape != std::vector<int64_t>{1, N, m.hidden}) m.fail(in.path + ".shape", shape_str(in.shape) + " must be [1, tokens, model.hidden] = " + shape_str({1, N, m.hidden}));
        break;
      case InputBind::routing_weights:
        if (in.layer) m.fail(in.path + ".layer", what + " serves every layer: its routing weights are the layer that routed last (no layer)");
        if (!prefill && in.shape != std::vector<int64_t>{2}) m.fail(in.path + ".shape", shape_str(in.shape) + " must be [2] (top-2)");
        if (prefill && in.shape != std::vector<int64_t>{N})
          m.fail(in.path + ".shape", shape_str(in.shape) + " must be [" + std::to_string(N) + "] (the running expert's weight for each of the graph's tokens)");
        break;
      case InputBind::host_rows: {
        const HostTable& t = m.host_tables[size_t(in.table)];
        if (in.index != RowIndex::expert) m.fail(in.path + ".index", what + " takes rows by expert");
        if (in.layer) m.fail(in.path + ".layer", what + " serves every layer: its rows are the current layer's (no layer)");
        if (!in.slot || *in.slot >= slots) m.fail(in.path + ".slot", prefill ? "must be 0 (one expert per call)" : "must be 0 or 1 (top-2)");
        if (t.use != "expert-weights" && t.use != "expert-scales") m.fail(in.path + ".table", "'" + t.name + "' is not an expert table");
        const std::vector<int64_t> rows(t.shape.begin() + 2, t.shape.end());
        if (in.shape != rows) m.fail(in.path + ".shape", shape_str(in.shape) + " is not one expert's rows of '" + t.name + "' " + shape_str(rows));
        if (in.dtype != t.dtype) m.fail(in.path + ".dtype", "'" + in.dtype + "' but table '" + t.name + "' is " + t.dtype);
        if (!bound.insert({in.table, *in.slot}).second) m.fail(in.path, "table '" + t.name + "' slot " + std::to_string(*in.slot) + " is bound twice");
        break;
      }
      default: m.fail(in.path + ".bind", what + " does not bind " + bind_name(in.bind) + " inputs");
    }
  }
  if (count_bind(g.inputs, InputBind::residual) != 1)
    m.fail(g.path + ".inputs", what + " needs one residual input (" + (prefill ? "the running sum" : "the attention residual") + ")");
  if (count_bind(g.inputs, InputBind::routing_weights) != 1) m.fail(g.path + ".inputs", what + " needs one routing-weights input");
  if (count_bind(g.inputs, InputBind::hand_off) != int(handoffs.size())) m.fail(g.path + ".inputs", what + " must take every hand-off of the " + (prefill ? "attn_router_prefill" : "attn_router") + " graphs");
  for (size_t t = 0; t < m.host_tables.size(); t++)
    if (m.host_tables[t].use == "expert-weights")
      for (int slot = 0; slot < slots; slot++)
        if (!bound.count({int(t), slot})) m.fail(g.path + ".inputs", "no slot " + std::to_string(slot) + " rows of expert table '" + m.host_tables[t].name + "'");
  if (g.outputs.size() != 1 || g.outputs[0].bind != OutputBind::residual) m.fail(g.path + ".outputs", what + " gives exactly one residual");
}

/** The attention graphs of one pass hand off the same names; the experts graph takes them. */
void pass_handoffs(const Manifest& m, const std::vector<const Graph*>& attn, const Graph& experts) {
  const std::set<std::string> handoffs = handoffs_given(*attn[0]);
  for (const Graph* g : attn)
    if (handoffs_given(*g) != handoffs) m.fail(g->path + ".outputs", "hands off other names than " + attn[0]->path);
  experts_graph(m, experts, handoffs);
}

}  // namespace

void validate_phimoe_generate(const Manifest& m) {
  int experts = 0;
  params(m, &experts);
  state_and_tables(m, experts);
  std::vector<const Graph*> attn(size_t(m.layers), nullptr), attn_prefill(size_t(m.layers), nullptr);
  const Graph *experts_g = nullptr, *experts_prefill = nullptr, *lm_head = nullptr, *first_prefill = nullptr;
  for (const Context& c : m.contexts)
    for (const Graph& g : c.graphs) {
      // The residual parser accepts f16 hand-offs for the decoder host-ops; this one keeps float32 buffers.
      for (const GraphInput& in : g.inputs)
        if (in.bind == InputBind::residual && in.dtype != "float32") m.fail(in.path + ".dtype", "'" + in.dtype + "' must be float32 (" + kOp + " hands the residual over in float32)");
      for (const GraphOutput& o : g.outputs)
        if (o.bind == OutputBind::residual && o.dtype != "float32") m.fail(o.path + ".dtype", "'" + o.dtype + "' must be float32 (" + kOp + " hands the residual over in float32)");
      const bool prefill = g.role == phimoe_role::attn_router_prefill || g.role == phimoe_role::experts_prefill;
      if (prefill) {
        // One chunk length for the whole pass: the host fills one set of [N] buffers for every graph.
        if (g.tokens < 2) m.fail(g.path + ".tokens", std::to_string(g.tokens) + ": a prefill graph runs at least 2 tokens");
        if (!first_prefill) first_prefill = &g;
        if (g.tokens != first_prefill->tokens)
          m.fail(g.path + ".tokens", std::to_string(g.tokens) + " but " + first_prefill->path + " runs " + std::to_string(first_prefill->tokens) + " (one prefill length for every prefill graph)");
      } else if (g.tokens != 1) {
        m.fail(g.path + ".tokens", std::string(kOp) + " runs one token per " + g.role + " call (a batched prefill is the attn_router_prefill and experts_prefill graphs')");
      }
      if (g.role == phimoe_role::attn_router || g.role == phimoe_role::attn_router_prefill) {
        attn_router(m, g, experts);
        auto& slot = (prefill ? attn_prefill : attn)[size_t(g.layers->first)];
        if (slot) m.fail(g.path + ".layers", "layer " + std::to_string(g.layers->first) + " already has an " + g.role + " graph at " + slot->path);
        slot = &g;
      } else if (g.role == phimoe_role::experts || g.role == phimoe_role::experts_prefill) {
        const Graph*& slot = prefill ? experts_prefill : experts_g;
        if (slot) m.fail(g.path + ".role", "a second " + g.role + " graph (the first is " + slot->path + ")");
        slot = &g;
      } else if (g.role == role::lm_head) {
        if (lm_head) m.fail(g.path + ".role", "a second lm_head graph");
        if (g.inputs.size() != 1 || g.inputs[0].bind != InputBind::residual) m.fail(g.path + ".inputs", "an lm_head graph takes exactly one residual input");
        if (g.outputs.size() != 1 || g.outputs[0].bind != OutputBind::logits) m.fail(g.path + ".outputs", "an lm_head graph gives exactly one logits output");
        lm_head = &g;
      } else {
        m.fail(g.path + ".role", std::string(kOp) + " runs no '" + g.role + "' graph (its roles: attn_router, experts, lm_head; for prefill attn_router_prefill, experts_prefill)");
      }
    }
  for (int l = 0; l < m.layers; l++)
    if (!attn[size_t(l)]) m.fail("contexts", "no attn_router graph runs layer " + std::to_string(l));
  if (!experts_g) m.fail("contexts", "no experts graph");
  if (!lm_head) m.fail("contexts", "no lm_head graph");
  pass_handoffs(m, attn, *experts_g);
  if (!first_prefill) return;
  // All or nothing: a prefill missing a layer or its experts graph could not run a chunk.
  for (int l = 0; l < m.layers; l++)
    if (!attn_prefill[size_t(l)])
      m.fail("contexts", "no attn_router_prefill graph runs layer " + std::to_string(l) + " (the prefill graphs are all or nothing; " + first_prefill->path + " is one)");
  if (!experts_prefill) m.fail("contexts", "no experts_prefill graph (the prefill graphs are all or nothing; " + first_prefill->path + " is one)");
  pass_handoffs(m, attn_prefill, *experts_prefill);
}

}  // namespace forge
