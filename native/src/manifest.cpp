#include "manifest.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "host_op.h"
#include "manifest_json.h"

namespace forge {
namespace {

using json = nlohmann::json;
using manifest_detail::FileChecker;
using manifest_detail::Node;

constexpr const char* kFormat = "forge-bundle";
constexpr int kVersion = 2;

TensorSpec tensor(const Node& n) {
  TensorSpec t;
  t.name = n.at("name").str();
  t.dtype = n.at("dtype").one_of({"float32", "float16", "int8", "uint8", "int16", "uint16", "int32", "int64", "bool"});
  t.shape = n.at("shape").shape();
  return t;
}

void expect_tensor(const Node& n, const TensorSpec& t, const char* dtype, const std::vector<int64_t>& shape,
                   const std::string& why) {
  if (t.dtype != dtype) n.at("dtype").fail("'" + t.dtype + "' must be " + dtype);
  if (t.shape != shape) n.at("shape").fail(shape_str(t.shape) + " must be " + shape_str(shape) + " (" + why + ")");
}

struct Parser {
  const std::string& label;
  Manifest m;
  std::map<std::string, int> state_index, table_index;

  int state_ref(const Node& n) {
    std::string s = n.str();
    auto it = state_index.find(s);
    if (it == state_index.end()) n.fail("'" + s + "' is not a declared state");
    return it->second;
  }
  int table_ref(const Node& n) {
    std::string t = n.str();
    auto it = table_index.find(t);
    if (it == table_index.end()) n.fail("'" + t + "' is not a declared host table");
    return it->second;
  }
  int layer(const Node& n) {
    int l = n.int32(0);
    if (l >= m.layers) n.fail("layer " + std::to_string(l) + " is past model.layers " + std::to_string(m.layers));
    return l;
  }

  /** An open name (host-op, role): lowercase letters, digits, '_'. */
  static std::string identifier(const Node& n) {
    std::string v = n.str();
    if (!(v[0] >= 'a' && v[0] <= 'z') || v.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
      n.fail("'" + v + "' is not a lowercase identifier (a-z, 0-9, _)");
    return v;
  }

  GraphInput input(const Node& in, int64_t N, int64_t C, int64_t H) {
    std::string bind = in.at("bind").one_of({"residual", "positions", "mask", "state", "host-rows", "routing-weights", "encoder-output", "pixels", "audio-features", "audio-samples", "hand-off"});
    GraphInput gi;
    gi.path = in.path;
    if (bind == "state") in.object({"name", "dtype", "shape", "bind", "state"});
    else if (bind == "host-rows") in.object({"name", "dtype", "shape", "bind", "table", "index"}, {"layer", "slot"});
    else if (bind == "routing-weights") in.object({"name", "dtype", "shape", "bind"}, {"layer"});
    else if (bind == "hand-off") in.object({"name", "dtype", "shape", "bind", "handoff"});
    else if (bind == "encoder-output") in.object({"name", "dtype", "shape", "bind", "component"}, {"output"});
    else if (bind == "positions") in.object({"name", "dtype", "shape", "bind"}, {"window"});
    else if (bind == "mask") in.object({"name", "dtype", "shape", "bind"}, {"window", "sliding"});
    else in.object({"name", "dtype", "shape", "bind"});
    static_cast<TensorSpec&>(gi) = tensor(in);
    // A window: the positions as ring slots (position mod window), the mask over a ring of window slots.
    if (in.has("window")) {
      gi.window = in.at("window").int32(1);
      if (*gi.window > C) in.at("window").fail(std::to_string(*gi.window) + " is wider than limits.maxContext " + std::to_string(C));
    }
    // A ring may hold more slots than a row sees (a prefill chunk's rows must not overwrite a slot
    // another row of the chunk still reads): sliding is the window, window the ring.
    if (in.has("sliding")) {
      if (!gi.window) in.at("sliding").fail("a sliding window is a mask over a ring: give its window (ring slots) too");
      gi.sliding = in.at("sliding").int32(1);
      if (*gi.sliding > *gi.window) in.at("sliding").fail(std::to_string(*gi.sliding) + " is wider than the ring's " + std::to_string(*gi.window) + " slots");
    }
    if (bind == "residual") {
      gi.bind = InputBind::residual;  // float16: a hand-off in f16 (the host-op's validator says where)
      expect_tensor(in, gi, gi.dtype == "float16" ? "float16" : "float32", {1, N, H}, "[1, tokens, model.hidden]");
    } else if (bind == "positions") {
      gi.bind = InputBind::positions;
      // [3, tokens]: multimodal RoPE (Qwen3-VL), a row each for t, h and w; which host-op fills it is its validator's say.
      expect_tensor(in, gi, "int32", gi.shape.size() == 2 ? std::vector<int64_t>{3, N} : std::vector<int64_t>{N},
                    gi.shape.size() == 2 ? "[3, tokens]: multimodal RoPE rows t, h, w" : "[tokens]");
    } else if (bind == "mask") {
      gi.bind = InputBind::mask;
      if (gi.window) expect_tensor(in, gi, "float32", {1, 1, N, *gi.window + N}, "[1, 1, tokens, window + tokens], layout past-then-new");
      else expect_tensor(in, gi, "float32", {1, 1, N, C + N}, "[1, 1, tokens, maxContext + tokens], layout past-then-new");
    } else if (bind == "state") {
      gi.bind = InputBind::state;
      gi.state = state_ref(in.at("state"));
      expect_tensor(in, gi, "float32", m.state[gi.state].shape, "the shape of state '" + m.state[gi.state].name + "'");
    } else if (bind == "host-rows") {
      gi.bind = InputBind::host_rows;
      gi.table = table_ref(in.at("table"));
      gi.index = in.at("index").one_of({"token", "expert"}) == "token" ? RowIndex::token : RowIndex::expert;
      if (in.has("layer")) gi.layer = layer(in.at("layer"));
      if (in.has("slot")) gi.slot = in.at("slot").int32(0);
    } else if (bind == "routing-weights") {
      gi.bind = InputBind::routing_weights;
      if (in.has("layer")) gi.layer = layer(in.at("layer"));
      if (gi.dtype != "float32") in.at("dtype").fail("'" + gi.dtype + "' must be float32 (the host's top-k weights)");
    } else if (bind == "encoder-output") {
      gi.bind = InputBind::encoder_output;
      gi.component = in.at("component").str();
      if (in.has("output")) gi.output = in.at("output").str();
    } else if (bind == "hand-off") {
      gi.bind = InputBind::hand_off;
      gi.handoff = identifier(in.at("handoff"));
    } else {
      // audio-features (a clip's log-mel features and mask) is accepted so a bundle with an audio
      // encoder loads; no host-op runs an audio encoder yet, and each one's validator refuses what it does not run.
      gi.bind = bind == "pixels" ? InputBind::pixels : bind == "audio-features" ? InputBind::audio_features : InputBind::audio_samples;
    }
    return gi;
  }

  GraphOutput output(const Node& o, int64_t N, int64_t H) {
    std::string bind = o.at("bind").one_of({"residual", "logits", "state-rows", "state-replace", "router-logits", "encoder-output", "hand-off"});
    if (bind == "state-rows") o.object({"name", "dtype", "shape", "bind", "state", "axis"});
    else if (bind == "state-replace") o.object({"name", "dtype", "shape", "bind", "state"});
    else if (bind == "router-logits") o.object({"name", "dtype", "shape", "bind", "layer", "topK"});
    else if (bind == "hand-off") o.object({"name", "dtype", "shape", "bind", "handoff"});
    else o.object({"name", "dtype", "shape", "bind"});
    GraphOutput go;
    go.path = o.path;
    static_cast<TensorSpec&>(go) = tensor(o);
    if (bind == "residual") {
      go.bind = OutputBind::residual;
      expect_tensor(o, go, go.dtype == "float16" ? "float16" : "float32", {1, N, H}, "[1, tokens, model.hidden]");
    } else if (bind == "logits") {
      go.bind = OutputBind::logits;
      expect_tensor(o, go, "float32", {1, N, m.vocab}, "[1, tokens, model.vocab]");
    } else if (bind == "encoder-output") {
      go.bind = OutputBind::encoder_output;  // kept by the host for graphs that bind encoder-output {component}
    } else if (bind == "hand-off") {
      go.bind = OutputBind::hand_off;  // kept by the host for the next graph that binds hand-off {handoff}
      go.handoff = identifier(o.at("handoff"));
    } else if (bind == "router-logits") {
      go.bind = OutputBind::router_logits;
      go.layer = layer(o.at("layer"));
      go.top_k = o.at("topK").int32(1);
      if (go.dtype != "float32") o.at("dtype").fail("'" + go.dtype + "' must be float32 (the host reads the router logits)");
      if (go.top_k > go.shape.back()) o.at("topK").fail(std::to_string(go.top_k) + " is more than the " + std::to_string(go.shape.back()) + " experts on the last axis");
    } else {
      go.bind = bind == "state-rows" ? OutputBind::state_rows : OutputBind::state_replace;
      go.state = state_ref(o.at("state"));
      const StateSpec& s = m.state[go.state];
      if (go.bind == OutputBind::state_rows) {
        if (s.kind != StateKind::kv_cache) o.at("state").fail("'" + s.name + "' is recurrent state: its output binds as state-replace");
        go.axis = o.at("axis").int32(0);
        if (go.axis != s.position_axis) o.at("axis").fail(std::to_string(go.axis) + " must be the position axis " + std::to_string(s.position_axis) + " of state '" + s.name + "'");
        std::vector<int64_t> rows = s.shape;
        rows[go.axis] = N;
        expect_tensor(o, go, "float32", rows, "state '" + s.name + "' with tokens rows on the position axis");
      } else {
        if (s.kind != StateKind::recurrent) o.at("state").fail("'" + s.name + "' is a kv-cache: its output binds as state-rows");
        expect_tensor(o, go, "float32", s.shape, "the shape of state '" + s.name + "'");
      }
    }
    return go;
  }

  /** What the manifest language defines of a graph; what its role means is its host-op's business. */
  Graph graph(const Node& g) {
    // A device bundle ships only compiled contexts: `file` (the ONNX graph, for the CPU EP) is optional when `qnn` is there.
    g.object({"name", "component", "role", "tokens", "inputs", "outputs", "quant"}, {"qnn", "layers", "file", "sha256"});
    if (!g.has("file") && !g.has("qnn")) g.fail("needs an ONNX graph (file) or a compiled context (qnn)");
    if (g.has("file") != g.has("sha256")) g.fail("'file' and 'sha256' go together");
    Graph out;
    out.path = g.path;
    out.name = g.at("name").str();
    out.component = g.at("component").str();
    out.role = identifier(g.at("role"));
    out.tokens = g.at("tokens").int32(1);
    // The token rules of the two roles the generic decode loop knows.
    if (out.role == role::decode && out.tokens != 1) g.at("tokens").fail("a decode graph takes 1 token, not " + std::to_string(out.tokens));
    if (out.role == role::prefill && out.tokens < 2) g.at("tokens").fail("a prefill graph takes more than 1 token");
    // Tokens of a decoder graph are positions; an encoder's are patches or frames, not held in a cache.
    if ((out.role == role::decode || out.role == role::prefill) && out.tokens > m.max_context) g.at("tokens").fail(std::to_string(out.tokens) + " exceeds limits.maxContext " + std::to_string(m.max_context));
    if (g.has("file")) {
      out.file = g.at("file").rel_path();
      out.sha256 = g.at("sha256").sha256();
    }
    if (g.has("qnn")) {
      Node q = g.at("qnn");
      q.object({"wrapper", "sha256", "binary"});
      out.qnn = QnnFiles{q.at("wrapper").rel_path(), q.at("sha256").sha256(), q.at("binary").rel_path()};
    }
    if (g.has("layers")) {
      Node l = g.at("layers");
      if (l.array() != 2) l.fail("expected [first, last]");
      int a = l[0].int32(0), b = l[1].int32(0);
      if (a > b) l.fail("first layer " + std::to_string(a) + " is after last " + std::to_string(b));
      if (b >= m.layers) l[1].fail("layer " + std::to_string(b) + " is past model.layers " + std::to_string(m.layers));
      out.layers = {a, b};
    }
    Node quant = g.at("quant");
    quant.object({"weights", "activations"});
    // 'mixed': the context's matrices differ (its `precision` list says which); the runtime does not care.
    out.weights = quant.at("weights").one_of({"fp32", "fp16", "w8", "w4", "mixed"});
    quant.at("activations").one_of({"float32"});

    const int64_t N = out.tokens, C = m.max_context, H = m.hidden;
    Node ins = g.at("inputs");
    std::set<int> read_state;
    std::map<std::pair<InputBind, int>, int> seen;  // (bind, window): one mask over the cache and one per ring width
    for (size_t i = 0, n = ins.array(1); i < n; i++) {
      GraphInput gi = input(ins[i], N, C, H);
      if (gi.bind == InputBind::state) {
        if (!read_state.insert(gi.state).second) ins[i].at("state").fail("'" + m.state[gi.state].name + "' is bound twice");
      } else if (gi.bind == InputBind::residual || gi.bind == InputBind::positions || gi.bind == InputBind::mask) {
        if (seen[{gi.bind, gi.window.value_or(0)}]++) ins[i].at("bind").fail(std::string("'") + bind_name(gi.bind) + "' is bound twice" + (gi.window ? " with window " + std::to_string(*gi.window) : ""));
      }
      out.inputs.push_back(gi);
    }
    Node outs = g.at("outputs");
    std::set<int> written_state;
    std::map<OutputBind, int> seen_out;
    for (size_t i = 0, n = outs.array(1); i < n; i++) {
      Node o = outs[i];
      GraphOutput go = output(o, N, H);
      if (go.state >= 0) {
        const StateSpec& s = m.state[go.state];
        if (!written_state.insert(go.state).second) o.at("state").fail("'" + s.name + "' is written twice");
        if (!read_state.count(go.state)) o.at("state").fail("'" + s.name + "' is written but not an input of this graph");
      } else if (go.bind != OutputBind::router_logits && go.bind != OutputBind::encoder_output && go.bind != OutputBind::hand_off && seen_out[go.bind]++) {
        o.at("bind").fail(std::string("'") + bind_name(go.bind) + "' is bound twice");
      }
      out.outputs.push_back(go);
    }
    // A shared state may be read where another graph writes it (K/V shared across layers).
    for (int s : read_state)
      if (!written_state.count(s) && !m.state[s].shared) ins.fail("state '" + m.state[s].name + "' is read but its next value is not an output");
    return out;
  }

  void contexts(const Node& cs, FileChecker& files) {
    std::map<std::pair<std::string, std::string>, std::string> variants;  // (component, role) → path
    for (size_t ci = 0, n = cs.array(1); ci < n; ci++) {
      Node c = cs[ci];
      c.object({"name", "files", "graphs"}, {"precision"});
      // The per-matrix precision map is for people and tools: its shape is checked, nothing reads it.
      if (c.has("precision")) {
        Node ps = c.at("precision");
        for (size_t i = 0, k = ps.array(); i < k; i++) {
          Node pm = ps[i];
          pm.object({"tensor", "weights"}, {"why"});
          pm.at("tensor").str();
          pm.at("weights").one_of({"fp32", "fp16", "w8", "w4"});
          if (pm.has("why")) pm.at("why").str();
        }
      }
      Context ctx;
      ctx.path = c.path;
      ctx.name = c.at("name").str();
      Node fs = c.at("files");
      for (size_t i = 0, k = fs.array(); i < k; i++) {
        Node f = fs[i];
        // `nondeterministic`: the file's bytes differ between builds (QNN context binaries); forge compares
        // bundles by it. The runtime checks the real sha256 and size all the same.
        f.object({"path", "sha256", "bytes"}, {"nondeterministic"});
        if (f.has("nondeterministic")) {
          Node nd = f.at("nondeterministic");
          nd.object({"why", "describeSha256"});
          nd.at("why").str();
          nd.at("describeSha256").sha256();
        }
        ContextFile cf{f.at("path").rel_path(), f.at("sha256").sha256(), uint64_t(f.at("bytes").integer(0))};
        uint64_t size = files.exists(f.at("path"), cf.path);
        if (size != cf.bytes) f.at("bytes").fail(std::to_string(cf.bytes) + " but '" + cf.path + "' has " + std::to_string(size) + " bytes");
        files.check(f.at("sha256"), cf.path, cf.sha256, true);
        ctx.files.push_back(cf);
      }
      Node gs = c.at("graphs");
      // One graph per role and layer range: a shard's prefill and decode, or one attention graph per
      // layer of a component (PhiMoE routes on the host between every layer's attention and experts).
      std::set<std::string> roles;
      for (size_t gi = 0, k = gs.array(1); gi < k; gi++) {
        Node gn = gs[gi];
        Graph g = graph(gn);
        const std::string key = g.role + " graph" + (g.layers ? " of layers " + std::to_string(g.layers->first) + ".." + std::to_string(g.layers->second) : "");
        if (!roles.insert(key).second) gn.at("role").fail("a context has at most one " + key);
        auto [at, fresh] = variants.emplace(std::make_pair(g.component, key), gn.path);
        if (!fresh) gn.at("role").fail("component '" + g.component + "' already has a " + key + " at " + at->second);
        if (!g.file.empty()) files.check(gn.at("sha256"), g.file, g.sha256);
        if (g.qnn) {
          files.check(gn.at("qnn").at("sha256"), g.qnn->wrapper, g.qnn->sha256);
          files.exists(gn.at("qnn").at("binary"), g.qnn->binary);
        }
        ctx.graphs.push_back(std::move(g));
      }
      m.contexts.push_back(std::move(ctx));
    }

    // What bindings name beyond their own graph: an encoder component's output, a layer's router, a hand-off.
    // An encoder-output input names a component that gives encoder-outputs and, with `output`, one
    // of them. Under a host-op that runs without its encoder (HostOpSpec::runs_without_encoder,
    // qwen3_vl_generate: zeros, as for every text token) the component may be absent: one bundle
    // carries several manifests over the same graphs, and its text manifest leaves the encoder out.
    std::set<std::string> components, encoders;
    std::map<std::string, std::vector<std::string>> encoder_outputs;  // component → its encoder-output names
    std::set<int> routed;
    std::map<std::string, const GraphOutput*> handed;
    for (const Context& c : m.contexts)
      for (const Graph& g : c.graphs) {
        components.insert(g.component);
        for (const GraphOutput& o : g.outputs) {
          if (o.bind == OutputBind::router_logits) routed.insert(o.layer);
          if (o.bind == OutputBind::encoder_output) {
            encoders.insert(g.component);
            encoder_outputs[g.component].push_back(o.name);
          }
          if (o.bind == OutputBind::hand_off) handed.emplace(o.handoff, &o);
        }
      }
    for (size_t ci = 0; ci < m.contexts.size(); ci++)
      for (size_t gi = 0; gi < m.contexts[ci].graphs.size(); gi++) {
        const Graph& g = m.contexts[ci].graphs[gi];
        for (size_t ii = 0; ii < g.inputs.size(); ii++) {
          const GraphInput& in = g.inputs[ii];
          Node at = cs[ci].at("graphs")[gi].at("inputs")[ii];
          if (in.bind == InputBind::encoder_output && !components.count(in.component) && !find_host_op(m.host_op)->runs_without_encoder)
            at.at("component").fail("'" + in.component + "' is not a component of this manifest");
          if (in.bind == InputBind::encoder_output && components.count(in.component)) {
            if (!encoders.count(in.component)) at.at("component").fail("component '" + in.component + "' gives no encoder-output");
            const std::vector<std::string>& outs = encoder_outputs[in.component];
            if (!in.output.empty() && std::find(outs.begin(), outs.end(), in.output) == outs.end()) {
              std::string names;
              for (const std::string& n : outs) names += (names.empty() ? "" : ", ") + n;
              at.at("output").fail("'" + in.output + "' is not an encoder-output of component '" + in.component + "' (its encoder-outputs: " + names + ")");
            }
          }
          if (in.bind == InputBind::routing_weights && in.layer && !routed.count(*in.layer))
            at.at("layer").fail("no graph gives router-logits for layer " + std::to_string(*in.layer));
          if (in.bind == InputBind::routing_weights && !in.layer && routed.empty()) at.at("bind").fail("no graph gives router-logits");
          if (in.bind == InputBind::hand_off) {
            auto h = handed.find(in.handoff);
            if (h == handed.end()) at.at("handoff").fail("no graph gives hand-off '" + in.handoff + "'");
            if (h->second->dtype != in.dtype || h->second->shape != in.shape)
              at.at("shape").fail("hand-off '" + in.handoff + "' is " + h->second->dtype + " " + shape_str(h->second->shape) + " at " + h->second->path + ", " + in.dtype + " " + shape_str(in.shape) + " here");
          }
        }
      }

    // A state is carried by one context's graphs (unless it is shared), and written by some graph.
    std::vector<int> owner(m.state.size(), -1);
    std::vector<bool> written(m.state.size(), false);
    for (size_t ci = 0; ci < m.contexts.size(); ci++)
      for (size_t gi = 0; gi < m.contexts[ci].graphs.size(); gi++) {
        const Graph& g = m.contexts[ci].graphs[gi];
        for (const GraphOutput& o : g.outputs)
          if (o.state >= 0) written[o.state] = true;
        for (const GraphInput& in : g.inputs) {
          if (in.bind != InputBind::state) continue;
          if (owner[in.state] >= 0 && owner[in.state] != int(ci) && !m.state[in.state].shared)
            cs[ci].at("graphs")[gi].fail("state '" + m.state[in.state].name + "' is already carried by context " + m.contexts[owner[in.state]].name +
                                         " (a state carried by several contexts declares shared: true)");
          if (owner[in.state] < 0) owner[in.state] = int(ci);
        }
      }
    for (size_t s = 0; s < m.state.size(); s++) {
      if (owner[s] < 0) m.fail(m.state[s].path, "'" + m.state[s].name + "' is used by no graph");
      if (!written[s]) m.fail(m.state[s].path, "'" + m.state[s].name + "' is read but no graph writes its next value");
    }
  }

  void state(const Node& st) {
    for (size_t i = 0, n = st.array(); i < n; i++) {
      Node s = st[i];
      std::string kind = s.at("kind").one_of({"kv-cache", "recurrent"});
      if (kind == "kv-cache") s.object({"name", "kind", "dtype", "shape", "positionAxis"}, {"window", "shared"});
      else s.object({"name", "kind", "dtype", "shape"}, {"shared"});
      StateSpec spec;
      spec.path = s.path;
      spec.name = s.at("name").str();
      spec.kind = kind == "kv-cache" ? StateKind::kv_cache : StateKind::recurrent;
      spec.shape = s.at("shape").shape();
      s.at("dtype").one_of({"float32"});
      if (s.has("shared")) {
        if (!s.at("shared").j.is_boolean()) s.at("shared").fail("expected true or false");
        spec.shared = s.at("shared").j.get<bool>();
      }
      if (spec.kind == StateKind::kv_cache) {
        spec.position_axis = s.at("positionAxis").int32(0);
        if (spec.position_axis >= int(spec.shape.size())) s.at("positionAxis").fail(std::to_string(spec.position_axis) + " is not an axis of " + shape_str(spec.shape));
        // A ring cache holds `window` slots; any other holds one per position up to maxContext.
        if (s.has("window")) {
          spec.window = s.at("window").int32(1);
          if (*spec.window > m.max_context) s.at("window").fail(std::to_string(*spec.window) + " is wider than limits.maxContext " + std::to_string(m.max_context));
        }
        const int64_t slots = spec.window ? *spec.window : m.max_context;
        if (spec.shape[spec.position_axis] != slots)
          s.at("shape").fail(shape_str(spec.shape) + " has " + std::to_string(spec.shape[spec.position_axis]) + " slots on the position axis, " +
                             (spec.window ? "window is " : "limits.maxContext is ") + std::to_string(slots));
      }
      if (!state_index.emplace(spec.name, int(i)).second) s.at("name").fail("'" + spec.name + "' is declared twice");
      m.state.push_back(spec);
    }
  }

  void host_tables(const Node& tables, FileChecker& files) {
    for (size_t i = 0, n = tables.array(); i < n; i++) {
      Node t = tables[i];
      t.object({"name", "use", "file", "sha256", "dtype", "shape"});
      HostTable h;
      h.path = t.path;
      h.name = t.at("name").str();
      if (!table_index.emplace(h.name, int(i)).second) t.at("name").fail("'" + h.name + "' is declared twice");
      h.use = t.at("use").one_of({"embedding", "per-layer-embedding", "expert-weights", "expert-scales", "patch-embedding", "position-embedding"});
      h.dtype = t.at("dtype").one_of({"float16", "float32", "int8", "bfloat16"});
      h.shape = t.at("shape").shape();
      h.file = t.at("file").rel_path();
      h.sha256 = t.at("sha256").sha256();
      const uint64_t item = h.dtype == "float32" ? 4 : h.dtype == "int8" ? 1 : 2;
      const uint64_t want = uint64_t(h.elements()) * item;
      uint64_t size = files.exists(t.at("file"), h.file);
      if (size != want)
        t.at("file").fail("'" + h.file + "' has " + std::to_string(size) + " bytes, expected " + shape_str(h.shape) + " " + h.dtype + " = " + std::to_string(want));
      files.check(t.at("sha256"), h.file, h.sha256, true);
      m.host_tables.push_back(h);
    }
  }

  void parse(const Node& r, FileChecker& files) {
    r.object({"format", "version", "recipe", "arch", "hostOp", "model", "contexts", "state", "hostTables", "mask", "tokenizer", "limits", "generation"}, {"hostOpParams"});
    if (r.at("format").str() != kFormat) r.at("format").fail("'" + r.at("format").str() + "' is not " + kFormat);
    if (int64_t v = r.at("version").integer(); v != kVersion)
      r.at("version").fail("version " + std::to_string(v) + " is not supported: this runtime reads manifest version " + std::to_string(kVersion) +
                           " (rebuild the bundle with this forge)");
    m.recipe = r.at("recipe").str();
    Node arch = r.at("arch");
    arch.object({"id", "socModel", "dspArch"});
    m.arch_id = arch.at("id").str();
    m.soc_model = arch.at("socModel").int32();
    arch.at("dspArch").str();
    // The registry decides which host-ops exist: refused here, before any file is hashed or graph loaded.
    m.host_op = identifier(r.at("hostOp"));
    if (!find_host_op(m.host_op)) {
      std::string names;
      for (const std::string& n : host_op_names()) names += (names.empty() ? "" : ", ") + n;
      r.at("hostOp").fail("'" + m.host_op + "' is not a registered host-op (registered: " + names + ")");
    }
    Node model = r.at("model");
    model.object({"family", "layers", "hidden", "vocab"});
    m.family = model.at("family").str();
    m.layers = model.at("layers").int32(1);
    m.hidden = model.at("hidden").int32(1);
    m.vocab = model.at("vocab").int32(1);
    Node limits = r.at("limits");
    limits.object({"maxContext"});
    m.max_context = limits.at("maxContext").int32(1);
    if (r.has("hostOpParams")) {
      Node params = r.at("hostOpParams");
      if (!params.j.is_object()) params.fail("expected an object");
      for (const auto& [key, value] : params.j.items()) {
        Node v = params.at(key.c_str());
        if (key.empty() || !(key[0] >= 'a' && key[0] <= 'z') || key.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
          v.fail("'" + key + "' is not a lowercase identifier (a-z, 0-9, _)");
        if (value.is_boolean()) m.host_op_numbers[key] = value.get<bool>() ? 1 : 0;
        else if (value.is_number()) m.host_op_numbers[key] = value.get<double>();
        else if (value.is_string()) m.host_op_strings[key] = value.get<std::string>();
        else v.fail("expected a number, a string or a boolean");
      }
    }
    Node gen = r.at("generation");
    gen.object({"maxNewTokens", "greedy"});
    m.max_new_tokens = gen.at("maxNewTokens").int32(1);
    if (gen.at("greedy").j != true) gen.at("greedy").fail("must be true");
    Node mask = r.at("mask");
    mask.object({"masked", "layout"});
    if (!mask.at("masked").j.is_number()) mask.at("masked").fail("expected a number");
    m.mask_masked = mask.at("masked").j.get<float>();
    mask.at("layout").one_of({"past-then-new"});

    state(r.at("state"));
    host_tables(r.at("hostTables"), files);

    Node tok = r.at("tokenizer");
    tok.object({"file", "sha256", "bos", "eos", "chatTemplate", "chat"}, {"config", "chatNotApplied", "chatOptions", "chatOptionsNotApplied"});
    m.tokenizer_file = tok.at("file").rel_path();
    files.check(tok.at("sha256"), m.tokenizer_file, tok.at("sha256").sha256());
    if (tok.has("config")) files.exists(tok.at("config"), tok.at("config").rel_path());
    if (!tok.at("bos").j.is_null()) {
      m.bos = tok.at("bos").int32(0);
      if (*m.bos >= m.vocab) tok.at("bos").fail(std::to_string(*m.bos) + " is past model.vocab " + std::to_string(m.vocab));
    }
    Node eos = tok.at("eos");
    for (size_t i = 0, n = eos.array(); i < n; i++) {
      int id = eos[i].int32(0);
      if (id >= m.vocab) eos[i].fail(std::to_string(id) + " is past model.vocab " + std::to_string(m.vocab));
      m.eos.push_back(id);
    }
    if (!tok.at("chatTemplate").j.is_null()) m.chat_template = tok.at("chatTemplate").str();
    // Either may be empty; both are tokenized as prompt text, so they must be UTF-8.
    auto text = [](const Node& n) {
      if (!n.j.is_string()) n.fail("expected a string");
      try {
        utf8_decode(n.j.get<std::string>());
      } catch (const std::exception& e) {
        n.fail(e.what());
      }
      return n.j.get<std::string>();
    };
    if (Node chat = tok.at("chat"); !chat.j.is_null()) {
      chat.object({"prefix", "suffix"});
      m.chat = Manifest::ChatWrap{text(chat.at("prefix")), text(chat.at("suffix"))};
    }
    if (tok.has("chatNotApplied")) {
      if (m.chat) tok.at("chatNotApplied").fail("given with a chat wrap: it says why there is none");
      m.chat_not_applied = tok.at("chatNotApplied").str();
    }
    if (tok.has("chatOptions")) {
      Node variants = tok.at("chatOptions");
      if (!m.chat) variants.fail("given without a chat wrap (tokenizer.chat): switches only change a wrap");
      for (size_t i = 0, n = variants.array(1); i < n; i++) {
        Node v = variants[i];
        v.object({"options", "prefix", "suffix"});
        Node options = v.at("options");
        if (!options.j.is_object() || options.j.empty()) options.fail("expected an object naming at least one switch");
        Manifest::ChatOptionWrap w;
        for (auto it = options.j.begin(); it != options.j.end(); ++it) {
          if (!it.value().is_boolean()) Node{it.value(), options.child(it.key()), options.label}.fail("expected true or false");
          w.options[it.key()] = it.value().get<bool>();
        }
        for (const Manifest::ChatOptionWrap& seen : m.chat_options)
          if (seen.options == w.options) v.at("options").fail("this combination of options is given twice");
        w.wrap = Manifest::ChatWrap{text(v.at("prefix")), text(v.at("suffix"))};
        m.chat_options.push_back(std::move(w));
      }
    }
    if (tok.has("chatOptionsNotApplied")) {
      if (!m.chat) tok.at("chatOptionsNotApplied").fail("given without a chat wrap (tokenizer.chat)");
      if (!m.chat_options.empty()) tok.at("chatOptionsNotApplied").fail("given with chatOptions: it says why there are none");
      m.chat_options_not_applied = tok.at("chatOptionsNotApplied").str();
    }

    contexts(r.at("contexts"), files);
  }
};

}  // namespace

void Manifest::fail(const std::string& at, const std::string& msg) const {
  throw ManifestError(one_line(label + ": " + (at.empty() ? "" : at + ": ") + msg));
}

Manifest parse_manifest(const json& doc, const std::string& label, const std::string& artifacts_root, const LoadOptions& opts) {
  Parser p{label, {}, {}, {}};
  p.m.root = artifacts_root;
  p.m.label = label;
  FileChecker files(artifacts_root, opts);
  p.parse(Node{doc, "", label}, files);
  // Then the host-op's own rules: what it runs of all the manifest may say.
  find_host_op(p.m.host_op)->validate(p.m);
  return std::move(p.m);
}

Manifest load_manifest(const std::string& manifest_path, const std::string& artifacts_root, const LoadOptions& opts) {
  std::string label = manifest_path.substr(manifest_path.find_last_of('/') + 1);
  std::ifstream in(manifest_path);
  if (!in) throw ManifestError(manifest_path + ": cannot be read");
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) {
    throw ManifestError(label + ": not valid JSON: " + e.what());
  }
  Manifest m = parse_manifest(doc, label, artifacts_root, opts);
  m.path = manifest_path;
  return m;
}

}  // namespace forge
