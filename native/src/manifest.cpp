#include "manifest.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "sha256.h"
#include "utf8.h"

namespace forge {
namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "forge-bundle";
constexpr int kVersion = 1;

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); i++) o << (i ? "," : "") << s[i];
  o << ']';
  return o.str();
}

/** A JSON value with the field path that leads to it, so every complaint can name that path. */
struct Node {
  const json& j;
  std::string path;
  const std::string& label;

  [[noreturn]] void fail(const std::string& msg) const {
    throw ManifestError(one_line(label + ": " + (path.empty() ? "" : path + ": ") + msg));
  }
  std::string child(const std::string& key) const { return path.empty() ? key : path + "." + key; }

  /** Object with exactly these keys allowed (the schema is strict), the required ones present. */
  void object(std::initializer_list<const char*> required, std::initializer_list<const char*> optional = {}) const {
    if (!j.is_object()) fail("expected an object");
    for (const char* k : required)
      if (!j.contains(k)) Node{j, child(k), label}.fail("missing");
    for (auto it = j.begin(); it != j.end(); ++it) {
      auto known = [&](std::initializer_list<const char*> l) {
        return std::any_of(l.begin(), l.end(), [&](const char* k) { return it.key() == k; });
      };
      if (!known(required) && !known(optional)) Node{it.value(), child(it.key()), label}.fail("unknown field");
    }
  }
  bool has(const char* key) const { return j.contains(key); }
  Node at(const char* key) const {
    if (!j.is_object() || !j.contains(key)) Node{j, child(key), label}.fail("missing");
    return Node{j.at(key), child(key), label};
  }
  size_t array(size_t min_len = 0) const {
    if (!j.is_array()) fail("expected an array");
    if (j.size() < min_len) fail("expected at least " + std::to_string(min_len) + " entries");
    return j.size();
  }
  Node operator[](size_t i) const { return Node{j.at(i), path + "[" + std::to_string(i) + "]", label}; }
  std::string str() const {
    if (!j.is_string() || j.get<std::string>().empty()) fail("expected a non-empty string");
    return j.get<std::string>();
  }
  int64_t integer(int64_t min = INT64_MIN, int64_t max = INT64_MAX) const {
    if (!j.is_number_integer()) fail("expected an integer");
    if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(INT64_MAX)) fail(std::to_string(j.get<uint64_t>()) + " is above " + std::to_string(max));
    int64_t v = j.get<int64_t>();
    if (v < min) fail(std::to_string(v) + " is below " + std::to_string(min));
    if (v > max) fail(std::to_string(v) + " is above " + std::to_string(max));
    return v;
  }
  /** An integer the runtime keeps in an int: larger values would wrap, not fail. */
  int int32(int64_t min = INT32_MIN) const { return int(integer(min, INT32_MAX)); }
  std::string one_of(std::initializer_list<const char*> allowed) const {
    std::string v = str();
    for (const char* a : allowed)
      if (v == a) return v;
    std::string list;
    for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
    fail("'" + v + "' is not one of " + list);
  }
  std::string sha256() const {
    std::string v = str();
    if (v.size() != 64 || v.find_first_not_of("0123456789abcdef") != std::string::npos)
      fail("'" + v + "' is not a lowercase hex sha256");
    return v;
  }
  /** A path inside the bundle: relative, no '..' segment. */
  std::string rel_path() const {
    std::string v = str();
    if (v[0] == '/') fail("'" + v + "' must be a path inside the bundle");
    std::istringstream parts(v);
    for (std::string seg; std::getline(parts, seg, '/');)
      if (seg == "..") fail("'" + v + "' must be a path inside the bundle");
    return v;
  }
  std::vector<int64_t> shape() const {
    size_t n = array(1);
    std::vector<int64_t> out;
    for (size_t i = 0; i < n; i++) out.push_back((*this)[i].integer(1, INT32_MAX));
    return out;
  }
};

bool file_size(const std::string& path, uint64_t* size) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  *size = uint64_t(st.st_size);
  return true;
}

/** Checks files exist and hash right (as far as `verify` asks); a file named twice is hashed once. */
class FileChecker {
 public:
  FileChecker(const std::string& root, const LoadOptions& opts) : root_(root), opts_(opts) {}
  uint64_t exists(const Node& at, const std::string& rel) {
    uint64_t size = 0;
    if (!file_size(root_ + "/" + rel, &size)) at.fail("'" + rel + "' does not exist under " + root_);
    return size;
  }
  /** `size_checked`: the caller has checked the file's size against the manifest. */
  void check(const Node& at, const std::string& rel, const std::string& sha, bool size_checked = false) {
    uint64_t size = exists(at, rel);
    if (opts_.verify == Verify::none || (opts_.verify == Verify::small && size_checked && size > opts_.small_bytes)) return;
    auto it = cache_.find(rel);
    if (it == cache_.end()) it = cache_.emplace(rel, sha256_file(root_ + "/" + rel)).first;
    if (it->second != sha) at.fail("sha256 of '" + rel + "' is " + it->second + ", the manifest says " + sha);
  }

 private:
  std::string root_;
  LoadOptions opts_;
  std::map<std::string, std::string> cache_;
};

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
  std::map<std::string, int> state_index;

  int state_ref(const Node& n) {
    std::string s = n.str();
    auto it = state_index.find(s);
    if (it == state_index.end()) n.fail("'" + s + "' is not a declared state");
    return it->second;
  }

  Graph graph(const Node& g) {
    // A device bundle ships only compiled contexts: `file` (the ONNX graph, for the CPU EP) is optional when `qnn` is there.
    g.object({"name", "role", "tokens", "inputs", "outputs", "quant"}, {"qnn", "layers", "file", "sha256"});
    if (!g.has("file") && !g.has("qnn")) g.fail("needs an ONNX graph (file) or a compiled context (qnn)");
    if (g.has("file") != g.has("sha256")) g.fail("'file' and 'sha256' go together");
    Graph out;
    out.name = g.at("name").str();
    std::string role = g.at("role").one_of({"prefill", "decode", "lm_head"});
    out.role = role == "prefill" ? GraphRole::prefill : role == "decode" ? GraphRole::decode : GraphRole::lm_head;
    out.tokens = g.at("tokens").int32(1);
    if (out.role != GraphRole::prefill && out.tokens != 1) g.at("tokens").fail("a " + role + " graph takes 1 token, not " + std::to_string(out.tokens));
    if (out.role == GraphRole::prefill && out.tokens < 2) g.at("tokens").fail("a prefill graph takes more than 1 token");
    if (out.tokens > m.max_context) g.at("tokens").fail(std::to_string(out.tokens) + " exceeds limits.maxContext " + std::to_string(m.max_context));
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
    out.weights = quant.at("weights").one_of({"fp32", "fp16", "w8"});
    quant.at("activations").one_of({"float32"});

    const int64_t N = out.tokens, C = m.max_context, H = m.hidden;
    Node ins = g.at("inputs");
    std::map<InputBind, int> seen;
    std::set<int> read_state;
    for (size_t i = 0, n = ins.array(1); i < n; i++) {
      Node in = ins[i];
      std::string bind = in.at("bind").one_of({"residual", "positions", "mask", "state"});
      if (bind == "state") in.object({"name", "dtype", "shape", "bind", "state"});
      else in.object({"name", "dtype", "shape", "bind"});
      GraphInput gi;
      static_cast<TensorSpec&>(gi) = tensor(in);
      if (bind == "residual") {
        gi.bind = InputBind::residual;
        expect_tensor(in, gi, "float32", {1, N, H}, "[1, tokens, model.hidden]");
      } else if (bind == "positions") {
        gi.bind = InputBind::positions;
        expect_tensor(in, gi, "int32", {N}, "[tokens]");
      } else if (bind == "mask") {
        gi.bind = InputBind::mask;
        expect_tensor(in, gi, "float32", {1, 1, N, C + N}, "[1, 1, tokens, maxContext + tokens], layout past-then-new");
      } else {
        gi.bind = InputBind::state;
        gi.state = state_ref(in.at("state"));
        if (!read_state.insert(gi.state).second) in.at("state").fail("'" + m.state[gi.state].name + "' is bound twice");
        expect_tensor(in, gi, "float32", m.state[gi.state].shape, "the shape of state '" + m.state[gi.state].name + "'");
      }
      if (gi.bind != InputBind::state && seen[gi.bind]++) in.at("bind").fail("'" + bind + "' is bound twice");
      out.inputs.push_back(gi);
    }
    Node outs = g.at("outputs");
    std::set<int> written_state;
    std::map<OutputBind, int> seen_out;
    for (size_t i = 0, n = outs.array(1); i < n; i++) {
      Node o = outs[i];
      std::string bind = o.at("bind").one_of({"residual", "logits", "state-rows", "state-replace"});
      if (bind == "state-rows") o.object({"name", "dtype", "shape", "bind", "state", "axis"});
      else if (bind == "state-replace") o.object({"name", "dtype", "shape", "bind", "state"});
      else o.object({"name", "dtype", "shape", "bind"});
      GraphOutput go;
      static_cast<TensorSpec&>(go) = tensor(o);
      if (bind == "residual") {
        go.bind = OutputBind::residual;
        expect_tensor(o, go, "float32", {1, N, H}, "[1, tokens, model.hidden]");
      } else if (bind == "logits") {
        go.bind = OutputBind::logits;
        expect_tensor(o, go, "float32", {1, N, m.vocab}, "[1, tokens, model.vocab]");
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
        if (!written_state.insert(go.state).second) o.at("state").fail("'" + s.name + "' is written twice");
        if (!read_state.count(go.state)) o.at("state").fail("'" + s.name + "' is written but not an input of this graph");
      }
      if (go.state < 0 && seen_out[go.bind]++) o.at("bind").fail("'" + bind + "' is bound twice");
      out.outputs.push_back(go);
    }
    for (int s : read_state)
      if (!written_state.count(s)) ins.fail("state '" + m.state[s].name + "' is read but its next value is not an output");
    if (out.role == GraphRole::lm_head) {
      if (out.inputs.size() != 1 || out.inputs[0].bind != InputBind::residual) ins.fail("an lm_head graph takes exactly one residual input");
      if (out.outputs.size() != 1 || out.outputs[0].bind != OutputBind::logits) outs.fail("an lm_head graph gives exactly one logits output");
    } else {
      // Positions and the mask serve attention over a KV cache; a shard of recurrent layers only
      // (Qwen3.5's linear attention) takes neither.
      bool reads_kv = false;
      for (int s : read_state) reads_kv |= m.state[s].kind == StateKind::kv_cache;
      for (InputBind b : {InputBind::residual, InputBind::positions, InputBind::mask})
        if (!seen[b] && (b == InputBind::residual || reads_kv)) ins.fail(std::string("a ") + (out.role == GraphRole::prefill ? "prefill" : "decode") + " graph needs a " +
                               (b == InputBind::residual ? "residual" : b == InputBind::positions ? "positions" : "mask") + " input");
      if (!seen_out[OutputBind::residual] && !seen_out[OutputBind::logits]) outs.fail("needs a residual or logits output");
    }
    return out;
  }

  void contexts(const Node& cs, FileChecker& files) {
    int next_layer = 0;
    bool have_logits = false;
    for (size_t ci = 0, n = cs.array(1); ci < n; ci++) {
      Node c = cs[ci];
      c.object({"name", "files", "graphs"});
      Context ctx;
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
      std::set<GraphRole> roles;
      for (size_t gi = 0, k = gs.array(1); gi < k; gi++) {
        Node gn = gs[gi];
        Graph g = graph(gn);
        if (!roles.insert(g.role).second) gn.at("role").fail("a context has at most one graph of each role");
        if (g.role == GraphRole::prefill && m.host_op == "qwen3_5_generate")
          gn.at("role").fail("qwen3_5_generate decodes over the prompt: a prefill graph would need the chunked delta rule");
        if (!g.file.empty()) files.check(gn.at("sha256"), g.file, g.sha256);
        if (g.qnn) {
          files.check(gn.at("qnn").at("sha256"), g.qnn->wrapper, g.qnn->sha256);
          files.exists(gn.at("qnn").at("binary"), g.qnn->binary);
        }
        ctx.graphs.push_back(std::move(g));
      }
      if (have_logits) c.fail("comes after the context that gives the logits");
      if (roles.count(GraphRole::lm_head)) {
        if (roles.size() != 1) gs.fail("an lm_head context holds only the lm_head graph");
        if (next_layer != m.layers) c.fail("the lm-head comes before layers " + std::to_string(next_layer) + ".." + std::to_string(m.layers - 1) + " are run");
        have_logits = true;
      } else {
        if (!roles.count(GraphRole::decode)) gs.fail("a shard context needs a decode graph");
        const Graph& d = *ctx.graph(GraphRole::decode);
        for (size_t gi = 0; gi < ctx.graphs.size(); gi++) {
          const Graph& g = ctx.graphs[gi];
          if (!g.layers) gs[gi].fail("a shard graph needs layers");
          if (g.layers != d.layers) gs[gi].at("layers").fail("prefill and decode graphs of a context run the same layers");
        }
        if (d.layers->first != next_layer) gs.fail("layers start at " + std::to_string(d.layers->first) + ", expected " + std::to_string(next_layer) + " (shards run in order)");
        next_layer = d.layers->second + 1;
        auto gives_logits = [](const Graph& g) {
          return std::any_of(g.outputs.begin(), g.outputs.end(), [](const GraphOutput& o) { return o.bind == OutputBind::logits; });
        };
        // A prefill graph that left out a state its decode graph carries would leave it unfilled.
        auto states = [](const Graph& g) {
          std::set<int> s;
          for (const GraphInput& in : g.inputs)
            if (in.bind == InputBind::state) s.insert(in.state);
          return s;
        };
        const bool logits = gives_logits(d);
        for (size_t gi = 0; gi < ctx.graphs.size(); gi++) {
          if (gives_logits(ctx.graphs[gi]) != logits) gs.fail("prefill and decode graphs of a context must agree on giving logits");
          if (states(ctx.graphs[gi]) != states(d)) gs[gi].at("inputs").fail("carries other state than the context's decode graph");
        }
        if (logits) {
          if (next_layer != m.layers) c.fail("gives logits before all layers are run");
          have_logits = true;
        }
      }
      m.contexts.push_back(std::move(ctx));
    }
    if (m.host_op == "qwen3_5_generate" && (m.contexts.empty() || !m.contexts.back().graph(GraphRole::lm_head)))
      cs.fail("qwen3_5_generate runs the lm-head as a context of its own, and there is none");
    if (!have_logits) cs.fail("no context gives logits (an lm_head context or a last shard with a logits output)");
    if (next_layer != m.layers) cs.fail("shards cover layers 0.." + std::to_string(next_layer - 1) + " of " + std::to_string(m.layers));
    // Every state must be carried by each context's graphs alike, and by some context.
    std::vector<int> owner(m.state.size(), -1);
    for (size_t ci = 0; ci < m.contexts.size(); ci++)
      for (size_t gi = 0; gi < m.contexts[ci].graphs.size(); gi++)
        for (const GraphInput& in : m.contexts[ci].graphs[gi].inputs) {
          if (in.bind != InputBind::state) continue;
          if (owner[in.state] >= 0 && owner[in.state] != int(ci))
            cs[ci].at("graphs")[gi].fail("state '" + m.state[in.state].name + "' is already carried by context " + m.contexts[owner[in.state]].name);
          owner[in.state] = int(ci);
        }
    for (size_t s = 0; s < m.state.size(); s++)
      if (owner[s] < 0) throw ManifestError(label + ": state[" + std::to_string(s) + "]: '" + m.state[s].name + "' is used by no graph");
  }

  void parse(const Node& r, FileChecker& files) {
    r.object({"format", "version", "recipe", "arch", "hostOp", "model", "contexts", "state", "hostTables", "mask", "tokenizer", "limits", "generation"});
    if (r.at("format").str() != kFormat) r.at("format").fail("'" + r.at("format").str() + "' is not " + kFormat);
    if (r.at("version").integer() != kVersion) r.at("version").fail("version " + std::to_string(r.at("version").integer()) + " is not supported (this runtime reads " + std::to_string(kVersion) + ")");
    m.recipe = r.at("recipe").str();
    Node arch = r.at("arch");
    arch.object({"id", "socModel", "dspArch"});
    m.arch_id = arch.at("id").str();
    m.soc_model = arch.at("socModel").int32();
    arch.at("dspArch").str();
    m.host_op = r.at("hostOp").one_of({"decoder_generate", "qwen3_5_generate"});
    Node model = r.at("model");
    model.object({"family", "layers", "hidden", "vocab"});
    m.family = model.at("family").str();
    m.layers = model.at("layers").int32(1);
    m.hidden = model.at("hidden").int32(1);
    m.vocab = model.at("vocab").int32(1);
    Node limits = r.at("limits");
    limits.object({"maxContext"});
    m.max_context = limits.at("maxContext").int32(1);
    Node gen = r.at("generation");
    gen.object({"maxNewTokens", "greedy"});
    m.max_new_tokens = gen.at("maxNewTokens").int32(1);
    if (gen.at("greedy").j != true) gen.at("greedy").fail("must be true");
    Node mask = r.at("mask");
    mask.object({"masked", "layout"});
    if (!mask.at("masked").j.is_number()) mask.at("masked").fail("expected a number");
    m.mask_masked = mask.at("masked").j.get<float>();
    mask.at("layout").one_of({"past-then-new"});

    Node st = r.at("state");
    for (size_t i = 0, n = st.array(); i < n; i++) {
      Node s = st[i];
      std::string kind = s.at("kind").one_of({"kv-cache", "recurrent"});
      if (kind == "kv-cache") s.object({"name", "kind", "dtype", "shape", "positionAxis"});
      else s.object({"name", "kind", "dtype", "shape"});
      StateSpec spec;
      spec.name = s.at("name").str();
      spec.kind = kind == "kv-cache" ? StateKind::kv_cache : StateKind::recurrent;
      if (spec.kind == StateKind::recurrent && m.host_op != "qwen3_5_generate")
        s.at("kind").fail("recurrent state needs hostOp qwen3_5_generate; " + m.host_op + " carries kv-cache state only");
      spec.shape = s.at("shape").shape();
      s.at("dtype").one_of({"float32"});
      if (spec.kind == StateKind::kv_cache) {
        spec.position_axis = s.at("positionAxis").int32(0);
        if (spec.position_axis >= int(spec.shape.size())) s.at("positionAxis").fail(std::to_string(spec.position_axis) + " is not an axis of " + shape_str(spec.shape));
        if (spec.shape[spec.position_axis] != m.max_context)
          s.at("shape").fail(shape_str(spec.shape) + " has " + std::to_string(spec.shape[spec.position_axis]) + " slots on the position axis, limits.maxContext is " + std::to_string(m.max_context));
      }
      if (!state_index.emplace(spec.name, int(i)).second) s.at("name").fail("'" + spec.name + "' is declared twice");
      m.state.push_back(spec);
    }

    Node tables = r.at("hostTables");
    bool have_embedding = false;
    for (size_t i = 0, n = tables.array(); i < n; i++) {
      Node t = tables[i];
      t.object({"name", "file", "sha256", "dtype", "shape"});
      t.at("name").one_of({"embedding"});
      if (have_embedding) t.at("name").fail("'embedding' is declared twice");
      have_embedding = true;
      t.at("dtype").one_of({"float16"});
      std::vector<int64_t> shape = t.at("shape").shape();
      if (shape != std::vector<int64_t>{m.vocab, m.hidden}) t.at("shape").fail(shape_str(shape) + " must be [model.vocab, model.hidden] = " + shape_str({m.vocab, m.hidden}));
      m.embedding_file = t.at("file").rel_path();
      uint64_t size = files.exists(t.at("file"), m.embedding_file);
      if (size != uint64_t(m.vocab) * m.hidden * 2) t.at("file").fail("'" + m.embedding_file + "' has " + std::to_string(size) + " bytes, expected vocab*hidden*2 = " + std::to_string(uint64_t(m.vocab) * m.hidden * 2));
      files.check(t.at("sha256"), m.embedding_file, t.at("sha256").sha256(), true);
    }
    if (!have_embedding) tables.fail("the host-op needs an 'embedding' table");

    Node tok = r.at("tokenizer");
    tok.object({"file", "sha256", "bos", "eos", "chatTemplate"}, {"config"});
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

    contexts(r.at("contexts"), files);
  }
};

}  // namespace

const Graph* Context::graph(GraphRole role) const {
  for (const Graph& g : graphs)
    if (g.role == role) return &g;
  return nullptr;
}

size_t elements(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

std::string Manifest::resolve(const std::string& rel) const { return root + "/" + rel; }

Manifest parse_manifest(const json& doc, const std::string& label, const std::string& artifacts_root, const LoadOptions& opts) {
  Parser p{label, {}, {}};
  p.m.root = artifacts_root;
  FileChecker files(artifacts_root, opts);
  p.parse(Node{doc, "", label}, files);
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
