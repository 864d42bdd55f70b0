// The manifest rules of the decoder host-ops (decoder_generate, qwen3_5_generate,
// gemma4_split_generate): what the one decoder step in decoder_generate.cpp runs, and nothing else. load_manifest calls them after the
// generic rules; each refusal names the field path.
//
// The loop runs a decoder cut into shard contexts in manifest order, each a decode graph (1 token)
// and optionally a prefill graph (N tokens) over the same layers and state, threading the residual;
// then the logits, from an lm_head context or the last shard. It binds residual, positions, mask and
// state inputs and residual, logits, state-rows and state-replace outputs; it reads one host table,
// the f16 embedding. gemma4_split_generate adds token host-rows (the embedding row and per-layer
// rows of the per-layer-embedding table, scaled by hostOpParams), ring caches with their windowed
// mask and positions, and caches shared across contexts. Anything else a manifest may express
// (routing, encoders, other roles) it would not execute, so it is refused here, not ignored.
// qwen3_vl_generate's decoder (validate_qwen3_vl_decoder) adds positions [3, N], float32 [1, N, hidden]
// encoder-output inputs (DeepStack rows) and leaves its vision context to qwen3_vl_manifest.cpp;
// gemma4_split_generate leaves its own to gemma4_manifest.cpp.
#include <algorithm>
#include <cmath>
#include <set>

#include "decoder_generate.h"

namespace forge {
namespace {

struct DecoderRules {
  bool recurrent;           // carries recurrent state (conv FIFO, delta-rule state)
  const char* no_prefill;   // why a prefill graph is refused; nullptr: prefill graphs are run
  bool separate_lm_head;    // the logits come from an lm_head context, never from the last shard
  bool gemma4 = false;      // token host-rows (embedding, per-layer embedding), ring caches, K/V shared across contexts
  bool vl = false;          // qwen3_vl_generate: positions [3, N], encoder-output rows, a vision context of its own
};

/** The encoder context of qwen3_vl_generate and gemma4_split_generate: their own validators' (qwen3_vl_manifest.cpp, gemma4_manifest.cpp), not a shard. */
constexpr const char* kVisionRole = "vision";
constexpr const char* kAudioRole = "audio";

bool gives_logits(const Graph& g) {
  return std::any_of(g.outputs.begin(), g.outputs.end(), [](const GraphOutput& o) { return o.bind == OutputBind::logits; });
}

std::set<int> states_read(const Graph& g) {
  std::set<int> s;
  for (const GraphInput& in : g.inputs)
    if (in.bind == InputBind::state) s.insert(in.state);
  return s;
}

/** A positive finite number in hostOpParams, or the refusal naming it. */
double param(const Manifest& m, const std::string& key) {
  auto it = m.host_op_numbers.find(key);
  if (it == m.host_op_numbers.end() || !(it->second > 0) || !std::isfinite(it->second))
    m.fail("hostOpParams." + key, m.host_op + " needs a positive number here");
  return it->second;
}

/** Gemma's per-layer embeddings: f16 [vocab, layers · per_layer_dim], one slice of per_layer_dim per layer. */
void per_layer_table(const Manifest& m, const HostTable& t) {
  if (m.tables("per-layer-embedding").size() != 1) m.fail(t.path + ".use", m.host_op + " reads one per-layer-embedding table");
  if (t.dtype != "float16") m.fail(t.path + ".dtype", "'" + t.dtype + "' must be float16");
  const std::vector<int64_t> want{m.vocab, int64_t(m.layers) * int64_t(param(m, "per_layer_dim"))};
  if (t.shape != want) m.fail(t.path + ".shape", shape_str(t.shape) + " must be [model.vocab, model.layers · hostOpParams.per_layer_dim] = " + shape_str(want));
}

void state_and_tables(const Manifest& m, const DecoderRules& r) {
  const std::string& op = m.host_op;
  for (const StateSpec& s : m.state) {
    if (s.kind == StateKind::recurrent && !r.recurrent)
      m.fail(s.path + ".kind", "recurrent state needs hostOp qwen3_5_generate; " + op + " carries kv-cache state only");
    if (s.window && !r.gemma4) m.fail(s.path + ".window", op + " has no ring caches: a kv-cache holds a slot for every position up to limits.maxContext");
    if (s.shared && !r.gemma4) m.fail(s.path + ".shared", op + " keeps each state in the one context that carries it");
  }
  const HostTable* embedding = nullptr;
  for (const HostTable& t : m.host_tables) {
    if (r.gemma4 && t.use == "per-layer-embedding") {
      per_layer_table(m, t);
      continue;
    }
    if (t.use != "embedding") m.fail(t.path + ".use", op + " reads no '" + t.use + "' table (its one host table is the embedding)");
    if (embedding) m.fail(t.path + ".use", "a second embedding table ('" + embedding->name + "' is the first); " + op + " reads one");
    embedding = &t;
    if (t.dtype != "float16") m.fail(t.path + ".dtype", "'" + t.dtype + "' must be float16 (the embedding rows " + op + " widens to float32)");
    const std::vector<int64_t> want{m.vocab, m.hidden};
    if (t.shape != want) m.fail(t.path + ".shape", shape_str(t.shape) + " must be [model.vocab, model.hidden] = " + shape_str(want));
  }
  if (!embedding) m.fail("hostTables", op + " needs an 'embedding' table");
}

/** A token host-rows input of gemma4: the scaled embedding row [1, N, H] or a layer's per-layer rows [1, N, P]. */
void token_rows(const Manifest& m, const GraphInput& in) {
  const HostTable& t = m.host_tables[size_t(in.table)];
  if (in.index != RowIndex::token || in.slot) m.fail(in.path + ".index", m.host_op + " gathers rows by token only");
  if (in.dtype != "float32") m.fail(in.path + ".dtype", "'" + in.dtype + "' must be float32 (the host widens the f16 rows)");
  const int64_t N = in.shape.size() == 3 ? in.shape[1] : -1;
  std::vector<int64_t> want;
  if (t.use == "embedding") {
    if (in.layer) m.fail(in.path + ".layer", "the embedding rows have no layer slice");
    want = {1, N, m.hidden};
  } else if (t.use == "per-layer-embedding") {
    if (!in.layer) m.fail(in.path + ".layer", "per-layer-embedding rows need the layer whose slice they are");
    want = {1, N, int64_t(param(m, "per_layer_dim"))};
  } else {
    m.fail(in.path + ".table", m.host_op + " gathers no rows of a '" + t.use + "' table");
  }
  if (in.shape != want) m.fail(in.path + ".shape", shape_str(in.shape) + " must be " + shape_str(want));
}

/**
 * Ring caches: a graph reading a ring of w slots binds the mask over w slots; a windowed mask or
 * positions input serves a ring of that width the graph reads; a prefill graph's ring has room for
 * its rows.
 */
void rings(const Manifest& m, const Graph& g) {
  std::set<int> read, masked;
  for (const GraphInput& in : g.inputs)
    if (in.bind == InputBind::state && m.state[size_t(in.state)].window) read.insert(*m.state[size_t(in.state)].window);
  for (const GraphInput& in : g.inputs) {
    if (!in.window) continue;
    if (!read.count(*in.window)) m.fail(in.path + ".window", "the graph reads no ring cache of " + std::to_string(*in.window) + " slots");
    if (in.bind != InputBind::mask) continue;
    masked.insert(*in.window);
    // N rows are written into the ring at once: a ring shorter than window + N - 1 would overwrite a
    // position an earlier row of the call (or a later context reading the ring) still sees. A ring
    // of maxContext slots never wraps.
    const int S = in.sliding.value_or(*in.window);
    if (g.tokens > 1 && *in.window < m.max_context && *in.window < S + g.tokens - 1)
      m.fail(in.path + ".window", "a ring of " + std::to_string(*in.window) + " slots under a " + std::to_string(S) + "-position window cannot take " +
                                      std::to_string(g.tokens) + " tokens per call: it needs window + tokens - 1 = " + std::to_string(S + g.tokens - 1));
  }
  for (int w : read)
    if (!masked.count(w)) m.fail(g.path + ".inputs", "reads a ring cache of " + std::to_string(w) + " slots but binds no mask with window " + std::to_string(w));
}

void graph(const Manifest& m, const Graph& g, const DecoderRules& r) {
  const std::string& op = m.host_op;
  if (g.role != role::prefill && g.role != role::decode && g.role != role::lm_head)
    m.fail(g.path + ".role", op + " runs no '" + g.role + "' graph (its roles: prefill, decode, lm_head)");
  if (g.role == role::prefill && r.no_prefill) m.fail(g.path + ".role", op + " " + r.no_prefill);
  for (const GraphInput& in : g.inputs) {
    if (in.bind == InputBind::host_rows && r.gemma4) {
      token_rows(m, in);
      continue;
    }
    if (in.bind == InputBind::encoder_output && r.vl) {
      // Rows of the encoder's output at the call's image tokens, zeros elsewhere (the vision validator checks `output`).
      const std::vector<int64_t> want{1, g.tokens, m.hidden};
      if (in.dtype != "float32") m.fail(in.path + ".dtype", "'" + in.dtype + "' must be float32");
      if (in.shape != want) m.fail(in.path + ".shape", shape_str(in.shape) + " must be [1, tokens, model.hidden] = " + shape_str(want));
      continue;
    }
    if (in.bind != InputBind::residual && in.bind != InputBind::positions && in.bind != InputBind::mask && in.bind != InputBind::state)
      m.fail(in.path + ".bind", op + " does not bind " + bind_name(in.bind) + " inputs");
    if (in.window && !r.gemma4) m.fail(in.path + ".window", op + " has no ring caches");
    if (in.bind == InputBind::positions && (in.shape.size() == 2) != r.vl)
      m.fail(in.path + ".shape", r.vl ? op + " feeds multimodal RoPE positions [3, tokens] (rows t, h, w), not " + shape_str(in.shape)
                                      : shape_str(in.shape) + ": positions [3, tokens] (multimodal RoPE) need hostOp qwen3_vl_generate; " + op + " feeds [tokens]");
  }
  if (r.gemma4) rings(m, g);
  for (const GraphOutput& o : g.outputs)
    if (o.bind == OutputBind::router_logits || o.bind == OutputBind::encoder_output || o.bind == OutputBind::hand_off) m.fail(o.path + ".bind", op + " does not bind " + bind_name(o.bind) + " outputs");

  if (g.role == role::lm_head) {
    if (g.tokens != 1) m.fail(g.path + ".tokens", "a lm_head graph takes 1 token, not " + std::to_string(g.tokens));
    if (g.inputs.size() != 1 || g.inputs[0].bind != InputBind::residual) m.fail(g.path + ".inputs", "an lm_head graph takes exactly one residual input");
    if (g.outputs.size() != 1 || g.outputs[0].bind != OutputBind::logits) m.fail(g.path + ".outputs", "an lm_head graph gives exactly one logits output");
    return;
  }
  // Positions and the mask serve attention over a KV cache; a shard of recurrent layers only
  // (Qwen3.5's linear attention) takes neither.
  bool reads_kv = false;
  for (int s : states_read(g)) reads_kv |= m.state[s].kind == StateKind::kv_cache;
  auto has = [&](InputBind b) { return std::any_of(g.inputs.begin(), g.inputs.end(), [b](const GraphInput& i) { return i.bind == b; }); };
  for (InputBind b : {InputBind::residual, InputBind::positions, InputBind::mask})
    if (!has(b) && (b == InputBind::residual || reads_kv))
      m.fail(g.path + ".inputs", "a " + g.role + " graph needs a " + bind_name(b) + " input");
  bool residual_out = std::any_of(g.outputs.begin(), g.outputs.end(), [](const GraphOutput& o) { return o.bind == OutputBind::residual; });
  if (!residual_out && !gives_logits(g)) m.fail(g.path + ".outputs", "needs a residual or logits output");
}

/** Shards in order over every layer, then the logits: the shape the loop runs. */
void contexts(const Manifest& m, const DecoderRules& r) {
  int next_layer = 0;
  bool have_logits = false;
  for (const Context& c : m.contexts) {
    // An encoder: checked by the host-op's own validator.
    if ((r.vl || r.gemma4) && c.graph(kVisionRole)) continue;
    if (r.gemma4 && c.graph(kAudioRole)) continue;
    std::set<std::string> roles;
    for (const Graph& g : c.graphs) {
      graph(m, g, r);
      roles.insert(g.role);
    }
    const std::string graphs = c.path + ".graphs";
    if (have_logits) m.fail(c.path, "comes after the context that gives the logits");
    if (roles.count(role::lm_head)) {
      if (roles.size() != 1) m.fail(graphs, "an lm_head context holds only the lm_head graph");
      if (next_layer != m.layers) m.fail(c.path, "the lm-head comes before layers " + std::to_string(next_layer) + ".." + std::to_string(m.layers - 1) + " are run");
      have_logits = true;
      continue;
    }
    if (!roles.count(role::decode)) m.fail(graphs, "a shard context needs a decode graph");
    const Graph& d = *c.graph(role::decode);
    for (const Graph& g : c.graphs) {
      if (!g.layers) m.fail(g.path, "a shard graph needs layers");
      if (g.layers != d.layers) m.fail(g.path + ".layers", "prefill and decode graphs of a context run the same layers");
    }
    if (d.layers->first != next_layer)
      m.fail(graphs, "layers start at " + std::to_string(d.layers->first) + ", expected " + std::to_string(next_layer) + " (shards run in order)");
    next_layer = d.layers->second + 1;
    // A prefill graph that left out a state its decode graph carries would leave it unfilled.
    const bool logits = gives_logits(d);
    for (const Graph& g : c.graphs) {
      if (gives_logits(g) != logits) m.fail(graphs, "prefill and decode graphs of a context must agree on giving logits");
      if (states_read(g) != states_read(d)) m.fail(g.path + ".inputs", "carries other state than the context's decode graph");
    }
    if (logits) {
      if (next_layer != m.layers) m.fail(c.path, "gives logits before all layers are run");
      have_logits = true;
    }
  }
  if (r.separate_lm_head && (m.contexts.empty() || !m.contexts.back().graph(role::lm_head)))
    m.fail("contexts", m.host_op + " runs the lm-head as a context of its own, and there is none");
  if (!have_logits) m.fail("contexts", "no context gives logits (an lm_head context or a last shard with a logits output)");
  if (next_layer != m.layers) m.fail("contexts", "shards cover layers 0.." + std::to_string(next_layer - 1) + " of " + std::to_string(m.layers));
}

/**
 * The residual hand-offs between contexts (a shard's residual output, the next shard's and the
 * lm-head's input) in one dtype, float32 or float16 (the recipe's hand-off): the host keeps one pair
 * of buffers for them. The first shard's residual input is the host's own float32 embedding rows.
 */
void residual_dtype(const Manifest& m) {
  std::string first, where;
  // The first shard: the first context with a decode graph (an encoder context may come before it).
  size_t first_shard = 0;
  while (first_shard + 1 < m.contexts.size() && !m.contexts[first_shard].graph(role::decode)) first_shard++;
  auto check = [&](const std::string& dtype, const std::string& path) {
    if (dtype != "float32" && dtype != "float16") m.fail(path + ".dtype", "'" + dtype + "': a residual is handed over as float32 or float16");
    if (first.empty()) {
      first = dtype;
      where = path;
    } else if (dtype != first) {
      m.fail(path + ".dtype", "'" + dtype + "' where " + where + " is '" + first + "': every residual hand-off has one dtype");
    }
  };
  for (size_t c = 0; c < m.contexts.size(); c++)
    for (const Graph& g : m.contexts[c].graphs) {
      for (const GraphOutput& o : g.outputs)
        if (o.bind == OutputBind::residual) check(o.dtype, o.path);
      for (const GraphInput& in : g.inputs) {
        if (in.bind != InputBind::residual) continue;
        if (c > first_shard) check(in.dtype, in.path);
        else if (in.dtype != "float32") m.fail(in.path + ".dtype", "'" + in.dtype + "' must be float32: the first shard's residual is the host's embedding rows, not a hand-off");
      }
    }
}

void validate_decoder(const Manifest& m, const DecoderRules& r) {
  state_and_tables(m, r);
  contexts(m, r);
  residual_dtype(m);
  if (r.gemma4) {
    param(m, "embed_scale");
    param(m, "per_layer_embed_scale");
  }
}

}  // namespace

// Dense decoders (Qwen3): KV caches only; batched prefill when every shard has a prefill graph.
void validate_decoder_generate(const Manifest& m) { validate_decoder(m, {false, nullptr, false}); }

// Gemma 4's decoder: rows and scales from the host, ring and shared caches; batched prefill when
// every shard has a prefill graph (its rings hold window + N - 1 slots, the masks say the window);
// its vision context is gemma4_manifest.cpp's.
void validate_gemma4_decoder(const Manifest& m) { validate_decoder(m, {false, nullptr, false, true}); }

// Qwen3-VL's text decoder: dense shards with multimodal positions and DeepStack rows; batched prefill as decoder_generate.
void validate_qwen3_vl_decoder(const Manifest& m) { validate_decoder(m, {false, nullptr, false, false, true}); }

// Hybrids (Qwen3.5): recurrent state besides the KV caches, a separate lm-head; batched prefill (the
// chunked delta rule inside the graphs) when every shard has a prefill graph, as decoder_generate.
void validate_qwen3_5_generate(const Manifest& m) { validate_decoder(m, {true, nullptr, true}); }

}  // namespace forge
