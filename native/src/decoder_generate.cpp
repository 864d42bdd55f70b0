#include "decoder_generate.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "step_buffers.h"

namespace forge {
namespace {

size_t graph_index(const Context& c, const Graph* g) { return size_t(g - c.graphs.data()); }

}  // namespace

struct Step {
  // binding[f] reads recurrent states from buffer f and writes buffer 1 - f; binding[1] is null for
  // a graph without recurrent state.
  std::unique_ptr<GraphBinding> binding[2];
  std::vector<StateRows> rows;
};

/** A host-rows input's buffer: the token's row of a table (a layer's slice of it), times a scale. */
struct RowsFeed {
  int table;
  int64_t offset, width;  // columns [offset, offset + width) of the table's rows
  float scale;
  std::vector<float> buf;
};

struct DecoderGenerate::Pass {
  int n = 1;
  std::vector<float> residual[2];
  // f16 hand-offs: the shards write and the next graphs read these; the first shard still reads
  // the host's float32 embedding rows in residual[0].
  std::vector<Ort::Float16_t> half[2], lm_in_half;
  // By (window, rows): window 0 the absolute positions and the mask over the whole cache; w the ring
  // slots (position mod w) and the mask over a ring of w slots. rows 3: multimodal RoPE [3, n].
  std::map<std::pair<int, int>, std::vector<int32_t>> positions;
  std::map<int, std::unique_ptr<StepMask>> masks;
  std::map<std::pair<int, int>, RowsFeed> rows;  // by (table, layer or -1), shared by the graphs that read it
  struct EncoderFeed {
    int64_t width;
    std::vector<float> buf;  // [n, width]
  };
  std::map<std::string, EncoderFeed> encoder;  // encoder-output inputs by output name, shared by the graphs that read it
  std::vector<Step> steps;
  std::vector<float> lm_in, logits;
  std::unique_ptr<GraphBinding> lm_head;  // null when the last shard gives the logits
  int final_residual() const { return int(steps.size() % 2); }  // the residual buffer the last shard writes
};

DecoderGenerate::DecoderGenerate(const Manifest& manifest, Executor& executor, DecoderOptions options)
    : GreedyGenerator(manifest), exec_(executor), opts_(std::move(options)) {
  // What each host-op accepts (recurrent state, prefill graphs, a separate lm-head, one f16
  // embedding table) was checked when the manifest was loaded, before any graph: load_manifest runs
  // the host-op's validator (decoder_manifest.cpp), the one gate a bundle passes.
  // Each table mapped once: the embedding (the first shard's residual) and whatever host-rows inputs read.
  tables_.resize(m_.host_tables.size());
  auto map_table = [&](size_t i) {
    const HostTable& t = m_.host_tables[i];
    if (!tables_[i]) tables_[i] = map_host_table(m_.resolve(t.file), uint64_t(t.elements()) * 2, "host table '" + t.name + "'");
    return tables_[i].get();
  };
  embedding_ = map_table(size_t(m_.tables("embedding").at(0) - m_.host_tables.data()));
  for (const Context& c : m_.contexts)
    for (const Graph& g : c.graphs)
      for (const GraphInput& i : g.inputs)
        if (i.bind == InputBind::host_rows) map_table(size_t(i.table));

  // The validator holds every residual hand-off to one dtype: any residual output says which.
  for (const Context& c : m_.contexts)
    for (const Graph& g : c.graphs)
      for (const GraphOutput& o : g.outputs)
        if (o.bind == OutputBind::residual) half_ = o.dtype == "float16";
  for (const StateSpec& s : m_.state) {
    caches_.emplace_back(s.elements(), 0.0f);
    shadows_.emplace_back(s.kind == StateKind::recurrent ? s.elements() : 0, 0.0f);
  }
  decode_ = make_pass(role::decode, 1);
  bool all_prefill = true;
  int prefill_tokens = 0;
  for (const Context& c : m_.contexts) {
    if (c.graph(role::lm_head) || !c.graph(role::decode)) continue;  // the lm-head; an encoder (not a shard)
    const Graph* p = c.graph(role::prefill);
    if (!p || (prefill_tokens && p->tokens != prefill_tokens)) all_prefill = false;
    else prefill_tokens = p->tokens;
  }
  if (all_prefill && prefill_tokens) prefill_ = make_pass(role::prefill, prefill_tokens);
}

DecoderGenerate::~DecoderGenerate() = default;

std::unique_ptr<DecoderGenerate::Pass> DecoderGenerate::make_pass(const char* variant, int n) {
  auto pass = std::make_unique<Pass>();
  const int64_t H = m_.hidden, C = m_.max_context, V = m_.vocab;
  pass->n = n;
  pass->residual[0].assign(size_t(n) * H, 0.0f);
  pass->residual[1].assign(size_t(n) * H, 0.0f);
  if (half_)
    for (auto& h : pass->half) h.assign(size_t(n) * H, Ort::Float16_t::FromBits(0));
  pass->masks[0] = std::make_unique<StepMask>(int(C), n, m_.mask_masked);
  int shard = 0;
  for (size_t ci = 0; ci < m_.contexts.size(); ci++) {
    const Context& c = m_.contexts[ci];
    if (const Graph* lm = c.graph(role::lm_head)) {
      pass->lm_head = exec_.bind(ci, graph_index(c, lm));
      pass->logits.assign(size_t(V), 0.0f);
      // One token: the lm-head reads the final residual where the last shard wrote it (no copy);
      // N tokens: its own row, which run() copies the last real row into. In f16 or f32 alike.
      auto bind_lm = [&](auto& residual, auto& lm_in, auto zero) {
        const auto* in = residual[shard % 2].data();
        if (n > 1) {
          lm_in.assign(size_t(H), zero);
          in = lm_in.data();
        }
        pass->lm_head->bind_input(lm->inputs[0].name, in, {1, 1, H});
      };
      if (half_) bind_lm(pass->half, pass->lm_in_half, Ort::Float16_t::FromBits(0));
      else bind_lm(pass->residual, pass->lm_in, 0.0f);
      pass->lm_head->bind_output(lm->outputs[0].name, pass->logits.data(), {1, 1, V});
      continue;
    }
    const Graph* g = c.graph(variant);
    if (!g) continue;  // not a shard: an encoder context, which its host-op runs
    Step step;
    float* in = pass->residual[shard % 2].data();
    float* out = pass->residual[(shard + 1) % 2].data();
    for (const GraphOutput& o : g->outputs) {
      if (o.bind == OutputBind::logits) pass->logits.assign(size_t(n) * V, 0.0f);
      if (o.bind != OutputBind::state_rows) continue;
      step.rows.emplace_back(o);
    }
    bool replaces = std::any_of(g->outputs.begin(), g->outputs.end(), [](const GraphOutput& o) { return o.bind == OutputBind::state_replace; });
    for (int f = 0; f < (replaces ? 2 : 1); f++) {
      auto& b = step.binding[f];
      b = exec_.bind(ci, graph_index(c, g));
      auto buffer = [&](int state, int which) {  // a recurrent state's buffer 0 or 1; a KV cache has one
        return (which && m_.state[state].kind == StateKind::recurrent ? shadows_ : caches_)[state].data();
      };
      for (const GraphInput& i : g->inputs) {
        switch (i.bind) {
          case InputBind::residual:
            if (half_ && shard > 0) b->bind_input(i.name, static_cast<const Ort::Float16_t*>(pass->half[shard % 2].data()), i.shape);
            else b->bind_input(i.name, in, i.shape);
            break;
          case InputBind::positions: {
            auto& p = pass->positions[{i.window.value_or(0), int(i.shape.size() == 2 ? i.shape[0] : 1)}];
            p.resize(elements(i.shape));
            b->bind_input(i.name, p.data(), i.shape);
            break;
          }
          case InputBind::mask: {
            auto& mask = pass->masks[i.window.value_or(0)];
            if (!mask) mask = std::make_unique<StepMask>(*i.window, n, m_.mask_masked, true, i.sliding.value_or(*i.window));
            b->bind_input(i.name, mask->data(), i.shape);
            break;
          }
          case InputBind::state: b->bind_input(i.name, buffer(i.state, f), i.shape); break;
          case InputBind::host_rows: {
            const HostTable& t = m_.host_tables[size_t(i.table)];
            const int64_t width = i.shape.back();
            auto [it, fresh] = pass->rows.try_emplace({i.table, i.layer.value_or(-1)});
            RowsFeed& r = it->second;
            if (fresh) {
              auto scale = opts_.row_scale.find(t.use);
              r = RowsFeed{i.table, i.layer ? int64_t(*i.layer) * width : 0, width, scale == opts_.row_scale.end() ? 1.0f : scale->second, std::vector<float>(size_t(n) * size_t(width), 0.0f)};
            }
            b->bind_input(i.name, r.buf.data(), i.shape);
            break;
          }
          case InputBind::encoder_output: {
            auto& e = pass->encoder[i.output.empty() ? i.name : i.output];
            if (e.buf.empty()) e = {i.shape.back(), std::vector<float>(elements(i.shape), 0.0f)};
            b->bind_input(i.name, e.buf.data(), i.shape);
            break;
          }
          default: throw std::logic_error(i.path + ": not a binding of the decoder host-ops (their validator refuses it)");
        }
      }
      size_t rows = 0;
      for (const GraphOutput& o : g->outputs) {
        switch (o.bind) {
          case OutputBind::residual:
            if (half_) b->bind_output(o.name, pass->half[(shard + 1) % 2].data(), o.shape);
            else b->bind_output(o.name, out, o.shape);
            break;
          case OutputBind::logits: b->bind_output(o.name, pass->logits.data(), o.shape); break;
          case OutputBind::state_rows: b->bind_output(o.name, step.rows[rows++].buf.data(), o.shape); break;
          case OutputBind::state_replace: b->bind_output(o.name, buffer(o.state, 1 - f), o.shape); break;
          default: throw std::logic_error(o.path + ": not a binding of the decoder host-ops (their validator refuses it)");
        }
      }
    }
    pass->steps.push_back(std::move(step));
    shard++;
  }
  return pass;
}

int DecoderGenerate::run(Pass& p, const int* ids, int start, int valid, bool want_token, double* run_ms) {
  const int H = m_.hidden, C = m_.max_context, V = m_.vocab;
  float* x = p.residual[0].data();
  embed_rows(embedding_->as<uint16_t>(), ids, valid, H, x);
  std::fill(x + size_t(valid) * H, x + size_t(p.n) * H, 0.0f);  // padding rows of a short chunk
  if (opts_.embed_scale != 1.0f)
    for (size_t e = 0; e < size_t(valid) * size_t(H); e++) x[e] *= opts_.embed_scale;
  input_rows(start, valid, x);
  for (auto& [key, pos] : p.positions) {
    const int window = key.first;
    if (key.second == 3) position_rows(start, p.n, valid, pos.data());
    else
      for (int r = 0; r < p.n; r++) pos[size_t(r)] = window ? (start + r) % window : std::min(start + r, C - 1);
  }
  for (auto& [output, e] : p.encoder) encoder_rows(output, start, p.n, valid, e.width, e.buf.data());
  for (auto& [window, mask] : p.masks) mask->fill(start, valid);
  const int* table_ids = row_ids(start, valid, ids);
  for (auto& [key, r] : p.rows) {
    const HostTable& t = m_.host_tables[size_t(r.table)];
    gather_rows(tables_[size_t(r.table)]->as<uint16_t>(), t.shape.back(), r.offset, r.width, table_ids, valid, r.scale, r.buf.data());
    // A graph's embedding rows are the residual's first rows (Gemma 4's per-layer projection reads them): replaced alike.
    if (t.use == "embedding") input_rows(start, valid, r.buf.data());
  }

  for (Step& s : p.steps) {
    GraphBinding& b = s.binding[1] && flip_ ? *s.binding[1] : *s.binding[0];
    auto t0 = Clock::now();
    b.run();
    *run_ms += ms_since(t0);
    // Only the real rows enter the caches, at the call's positions.
    for (const StateRows& r : s.rows) {
      const std::optional<int>& ring = m_.state[size_t(r.state)].window;
      r.write(caches_[size_t(r.state)].data(), ring ? *ring : C, p.n, start, valid, ring.has_value());
    }
  }
  // Every recurrent state was just written to its other buffer: the next call reads that one. (A
  // bundle without recurrent state has no second bindings, so the flip changes nothing there.)
  flip_ ^= 1;
  if (!want_token) return -1;
  const float* logits = p.logits.data();
  if (p.lm_head) {
    if (p.n > 1 && half_) std::memcpy(p.lm_in_half.data(), p.half[p.final_residual()].data() + size_t(valid - 1) * H, size_t(H) * sizeof(Ort::Float16_t));
    else if (p.n > 1) std::memcpy(p.lm_in.data(), p.residual[p.final_residual()].data() + size_t(valid - 1) * H, size_t(H) * sizeof(float));
    auto t0 = Clock::now();
    p.lm_head->run();
    *run_ms += ms_since(t0);
  } else {
    logits += size_t(valid - 1) * V;
  }
  return token_of(logits, start + valid - 1);
}

void DecoderGenerate::reset() {
  // KV slots are written before they are read (a slot past the position is masked), so only the
  // recurrent states, which every step reads whole, start from zeros: not 1.2 GB of caches per call.
  for (size_t s = 0; s < m_.state.size(); s++)
    if (m_.state[s].kind == StateKind::recurrent) std::fill(caches_[s].begin(), caches_[s].end(), 0.0f);
  flip_ = 0;
  decode_->masks.at(0)->reset();
}

int DecoderGenerate::prefill_tokens() const { return prefill_ ? prefill_->n : 0; }

void DecoderGenerate::position_rows(int start, int n, int /*valid*/, int32_t* rows) const {
  for (int a = 0; a < 3; a++)
    for (int r = 0; r < n; r++) rows[size_t(a) * size_t(n) + size_t(r)] = std::min(start + r, m_.max_context - 1);
}

void DecoderGenerate::encoder_rows(const std::string&, int, int n, int, int64_t width, float* rows) const {
  std::fill(rows, rows + size_t(n) * size_t(width), 0.0f);
}

int DecoderGenerate::step(const int* ids, int start, int valid, bool want_token, bool prefill, double* run_ms) {
  return run(prefill ? *prefill_ : *decode_, ids, start, valid, want_token, run_ms);
}

size_t context_of(const Manifest& m, const Graph* g) {
  for (size_t ci = 0; ci < m.contexts.size(); ci++)
    if (!m.contexts[ci].graphs.empty() && g >= m.contexts[ci].graphs.data() && g < m.contexts[ci].graphs.data() + m.contexts[ci].graphs.size()) return ci;
  throw std::logic_error("graph is not in the manifest");
}

std::unique_ptr<Generator> make_decoder_generate(const Manifest& m, Executor& exec) { return std::make_unique<DecoderGenerate>(m, exec); }

}  // namespace forge
