#include "phimoe_generate/phimoe_generate.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace forge {
namespace {

size_t element_bytes(const std::string& dtype) { return dtype == "int8" ? 1 : dtype == "float16" ? 2 : 4; }

}  // namespace

PhimoeGenerate::PhimoeGenerate(const Manifest& manifest, Executor& executor) : GreedyGenerator(manifest), exec_(executor) {
  const int64_t H = m_.hidden, V = m_.vocab;
  experts_ = int(m_.host_op_numbers.at("experts"));
  jitter_eps_ = m_.host_op_numbers.at("router_jitter_eps");
  embedding_ = map_host_table(m_.resolve(m_.tables("embedding").at(0)->file), uint64_t(V) * H * 2, "the embedding table");
  for (const HostTable& t : m_.host_tables)
    tables_.push_back(t.use == "embedding" ? nullptr : map_host_table(m_.resolve(t.file), t.elements() * element_bytes(t.dtype), "host table '" + t.name + "'"));
  for (const StateSpec& s : m_.state) caches_.emplace_back(s.elements(), 0.0f);
  logits_.assign(size_t(V), 0.0f);

  decode_ = make_pass(phimoe_role::attn_router, phimoe_role::experts, 1, false);
  // The validator admits the prefill roles all or none, with one tokens N for all.
  for (const Context& c : m_.contexts)
    if (const Graph* g = c.graph(phimoe_role::experts_prefill)) prefill_ = make_pass(phimoe_role::attn_router_prefill, phimoe_role::experts_prefill, g->tokens, true);

  for (size_t ci = 0; ci < m_.contexts.size(); ci++) {
    const Context& c = m_.contexts[ci];
    for (size_t gi = 0; gi < c.graphs.size(); gi++) {
      const Graph& g = c.graphs[gi];
      if (g.role != role::lm_head) continue;
      // The final residual in (a prefill copies its last real row there), logits out.
      lm_head_ = exec_.bind(ci, gi);
      lm_head_->bind_input(g.inputs.at(0).name, decode_->x[0].data(), g.inputs[0].shape);
      lm_head_->bind_output(g.outputs.at(0).name, logits_.data(), g.outputs[0].shape);
    }
  }
}

PhimoeGenerate::~PhimoeGenerate() = default;

std::unique_ptr<PhimoeGenerate::Pass> PhimoeGenerate::make_pass(const char* attn_role, const char* experts_role, int n, bool both) {
  auto p = std::make_unique<Pass>();
  const int64_t H = m_.hidden, C = m_.max_context;
  p->n = n;
  p->x[0].assign(size_t(n) * H, 0.0f);
  p->x[1].assign(size_t(n) * H, 0.0f);
  p->positions.assign(size_t(n), 0);
  p->mask = std::make_unique<StepMask>(int(C), n, m_.mask_masked);
  p->router_logits.assign(size_t(n) * size_t(experts_), 0.0f);
  p->routes.resize(size_t(n));
  p->used.assign(size_t(experts_), 0);
  p->layers.resize(size_t(m_.layers));
  auto handoff = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return p->handoffs.try_emplace(name, elements(shape), 0.0f).first->second.data();  // map nodes do not move
  };
  auto unrunnable = [](const std::string& path) { return std::logic_error(path + ": not a binding phimoe_generate runs (its validator refuses it)"); };

  for (size_t ci = 0; ci < m_.contexts.size(); ci++) {
    const Context& c = m_.contexts[ci];
    for (size_t gi = 0; gi < c.graphs.size(); gi++) {
      const Graph& g = c.graphs[gi];
      if (g.role == attn_role) {
        Pass::Layer& layer = p->layers.at(size_t(g.layers->first));
        layer.rows.reserve(g.outputs.size());  // the bindings hold pointers into the rows' buffers
        for (int f : both ? std::vector<int>{0, 1} : std::vector<int>{0}) {
          auto b = exec_.bind(ci, gi);
          for (const GraphInput& in : g.inputs) {
            switch (in.bind) {
              case InputBind::residual: b->bind_input(in.name, p->x[f].data(), in.shape); break;
              case InputBind::positions: b->bind_input(in.name, p->positions.data(), in.shape); break;
              case InputBind::mask: b->bind_input(in.name, p->mask->data(), in.shape); break;
              case InputBind::state: b->bind_input(in.name, caches_[size_t(in.state)].data(), in.shape); break;
              default: throw unrunnable(in.path);
            }
          }
          size_t rows = 0;
          for (const GraphOutput& o : g.outputs) {
            switch (o.bind) {
              case OutputBind::residual: b->bind_output(o.name, p->x[1 - f].data(), o.shape); break;
              case OutputBind::hand_off: b->bind_output(o.name, handoff(o.handoff, o.shape), o.shape); break;
              case OutputBind::router_logits: b->bind_output(o.name, p->router_logits.data(), o.shape); break;
              case OutputBind::state_rows:
                if (rows == layer.rows.size()) layer.rows.emplace_back(o);
                b->bind_output(o.name, layer.rows[rows++].buf.data(), o.shape);
                break;
              default: throw unrunnable(o.path);
            }
          }
          layer.attn[f] = std::move(b);
        }
      } else if (g.role == experts_role) {
        bool first_binding = true;  // the expert inputs are listed once
        for (int f : both ? std::vector<int>{0, 1} : std::vector<int>{1}) {
          auto b = exec_.bind(ci, gi);
          for (const GraphInput& in : g.inputs) {
            switch (in.bind) {
              case InputBind::residual: b->bind_input(in.name, p->x[f].data(), in.shape); break;
              case InputBind::hand_off: b->bind_input(in.name, handoff(in.handoff, in.shape), in.shape); break;
              case InputBind::routing_weights:
                p->routing.resize(elements(in.shape), 0.0f);  // the same shape for both bindings: no reallocation
                b->bind_input(in.name, p->routing.data(), in.shape);
                break;
              case InputBind::host_rows: {
                if (!first_binding) break;
                const HostTable& t = m_.host_tables[size_t(in.table)];
                p->expert_inputs.push_back({in.name, t.dtype, in.shape, tables_[size_t(in.table)].get(), t.elements() / size_t(t.shape[0] * t.shape[1]), *in.slot});
                break;
              }
              default: throw unrunnable(in.path);
            }
          }
          b->bind_output(g.outputs.at(0).name, p->x[1 - f].data(), g.outputs[0].shape);
          p->experts[f] = std::move(b);
          first_binding = false;
        }
      }
    }
  }
  // Bound before the first step, so a graph run before any routing still has every input bound.
  const int first[2] = {0, 1};
  for (auto& b : p->experts)
    if (b) bind_expert_rows(*b, p->expert_inputs, 0, first);
  return p;
}

void PhimoeGenerate::bind_expert_rows(GraphBinding& g, const std::vector<ExpertInput>& inputs, int layer, const int* expert) {
  for (const ExpertInput& e : inputs) {
    const size_t at = (size_t(layer) * size_t(experts_) + size_t(expert[e.slot])) * e.slab;
    if (e.dtype == "int8") g.bind_input(e.name, e.table->as<int8_t>() + at, e.shape);
    else if (e.dtype == "float16") g.bind_input(e.name, e.table->as<Ort::Float16_t>() + at, e.shape);
    else g.bind_input(e.name, e.table->as<float>() + at, e.shape);
  }
}

void PhimoeGenerate::timed_run(GraphBinding& g, double* run_ms) {
  auto t0 = Clock::now();
  g.run();
  *run_ms += ms_since(t0);
}

PhimoeRoute PhimoeGenerate::route(const float* logits, int layer, int position) const {
  try {
    return phimoe_route(logits, experts_, jitter_eps_);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error("layer " + std::to_string(layer) + " at position " + std::to_string(position) + ": cannot route: " + e.what());
  }
}

void PhimoeGenerate::reset() {
  decode_->mask->reset();  // a prefill pass's mask is filled whole on every call
  routes_.clear();
}

int PhimoeGenerate::prefill_tokens() const { return prefill_ ? prefill_->n : 0; }

int PhimoeGenerate::step(const int* ids, int start, int valid, bool want_token, bool prefill, double* run_ms) {
  if (prefill) return prefill_step(ids, start, valid, want_token, run_ms);
  if (valid != 1) throw std::logic_error("a phimoe_generate decode step runs one token");
  return decode_step(ids, start, want_token, run_ms);
}

int PhimoeGenerate::decode_step(const int* id, int position, bool want_token, double* run_ms) {
  Pass& p = *decode_;
  const int H = m_.hidden, C = m_.max_context;
  embed_rows(embedding_->as<uint16_t>(), id, 1, H, p.x[0].data());
  p.positions[0] = std::min(position, C - 1);
  p.mask->fill(position, 1);

  for (int l = 0; l < m_.layers; l++) {
    Pass::Layer& layer = p.layers[size_t(l)];
    timed_run(*layer.attn[0], run_ms);  // x[0] → attention residual in x[1]
    for (const StateRows& r : layer.rows) r.write(caches_[size_t(r.state)].data(), C, 1, position, 1);
    const PhimoeRoute r = route(p.router_logits.data(), l, position);
    if (record_) routes_.push_back({position, l, r});
    p.routing[0] = r.weight[0];
    p.routing[1] = r.weight[1];
    bind_expert_rows(*p.experts[1], p.expert_inputs, l, r.expert);
    timed_run(*p.experts[1], run_ms);  // x[1] → the layer's output in x[0]
  }
  if (!want_token) return -1;
  timed_run(*lm_head_, run_ms);
  return token_of(logits_.data(), position);
}

std::unique_ptr<Generator> make_phimoe_generate(const Manifest& m, Executor& exec) { return std::make_unique<PhimoeGenerate>(m, exec); }

}  // namespace forge
