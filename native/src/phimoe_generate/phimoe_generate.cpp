#include "phimoe_generate/phimoe_generate.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>


namespace forge {
namespace {

constexpr const char* kAttnRouter = "attn_router";
constexpr const char* kExperts = "experts";

size_t element_bytes(const std::string& dtype) { return dtype == "int8" ? 1 : dtype == "float16" ? 2 : 4; }

}  // namespace

PhimoeGenerate::PhimoeGenerate(const Manifest& manifest, Executor& executor) : GreedyGenerator(manifest), exec_(executor) {
  const int64_t H = m_.hidden, C = m_.max_context, V = m_.vocab;
  experts_ = int(m_.host_op_numbers.at("experts"));
  jitter_eps_ = m_.host_op_numbers.at("router_jitter_eps");
  embedding_ = map_host_table(m_.resolve(m_.tables("embedding").at(0)->file), uint64_t(V) * H * 2, "the embedding table");
  for (const HostTable& t : m_.host_tables)
    tables_.push_back(t.use == "embedding" ? nullptr : map_host_table(m_.resolve(t.file), t.elements() * element_bytes(t.dtype), "host table '" + t.name + "'"));
  for (const StateSpec& s : m_.state) caches_.emplace_back(s.elements(), 0.0f);
  x_.assign(size_t(H), 0.0f);
  attn_res_.assign(size_t(H), 0.0f);
  router_logits_.assign(size_t(experts_), 0.0f);
  logits_.assign(size_t(V), 0.0f);
  mask_ = std::make_unique<StepMask>(int(C), 1, m_.mask_masked);
  positions_.assign(1, 0);
  layers_.resize(size_t(m_.layers));

  // Hand-offs by name: one buffer each (map nodes do not move), written by every layer's attention graph, read by the experts graph.
  auto handoff_buffer = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return handoffs_.try_emplace(name, elements(shape), 0.0f).first->second.data();
  };

  for (size_t ci = 0; ci < m_.contexts.size(); ci++) {
    const Context& c = m_.contexts[ci];
    for (size_t gi = 0; gi < c.graphs.size(); gi++) {
      const Graph& g = c.graphs[gi];
      auto b = exec_.bind(ci, gi);
      if (g.role == kAttnRouter) {
        Layer& layer = layers_.at(size_t(g.layers->first));
        for (const GraphInput& in : g.inputs) {
          switch (in.bind) {
            case InputBind::residual: b->bind_input(in.name, x_.data(), in.shape); break;
            case InputBind::positions: b->bind_input(in.name, positions_.data(), in.shape); break;
            case InputBind::mask: b->bind_input(in.name, mask_->data(), in.shape); break;
            case InputBind::state: b->bind_input(in.name, caches_[in.state].data(), in.shape); break;
            default: throw std::logic_error(in.path + ": not a binding phimoe_generate runs (its validator refuses it)");
          }
        }
        for (const GraphOutput& o : g.outputs) {
          switch (o.bind) {
            case OutputBind::residual: b->bind_output(o.name, attn_res_.data(), o.shape); break;
            case OutputBind::hand_off: b->bind_output(o.name, handoff_buffer(o.handoff, o.shape), o.shape); break;
            case OutputBind::router_logits: b->bind_output(o.name, router_logits_.data(), o.shape); break;
            case OutputBind::state_rows:
              layer.rows.emplace_back(o);
              b->bind_output(o.name, layer.rows.back().buf.data(), o.shape);
              break;
            default: throw std::logic_error(o.path + ": not a binding phimoe_generate runs (its validator refuses it)");
          }
        }
        layer.attn = std::move(b);
      } else if (g.role == kExperts) {
        for (const GraphInput& in : g.inputs) {
          switch (in.bind) {
            case InputBind::residual: b->bind_input(in.name, attn_res_.data(), in.shape); break;
            case InputBind::hand_off: b->bind_input(in.name, handoff_buffer(in.handoff, in.shape), in.shape); break;
            case InputBind::routing_weights: b->bind_input(in.name, routing_, in.shape); break;
            case InputBind::host_rows: {
              const HostTable& t = m_.host_tables[size_t(in.table)];
              expert_inputs_.push_back({in.name, t.dtype, in.shape, tables_[size_t(in.table)].get(), t.elements() / size_t(t.shape[0] * t.shape[1]), *in.slot});
              break;
            }
            default: throw std::logic_error(in.path + ": not a binding phimoe_generate runs (its validator refuses it)");
          }
        }
        b->bind_output(g.outputs.at(0).name, x_.data(), g.outputs[0].shape);
        experts_graph_ = std::move(b);
      } else {  // lm_head: the last residual in, logits out
        b->bind_input(g.inputs.at(0).name, x_.data(), g.inputs[0].shape);
        b->bind_output(g.outputs.at(0).name, logits_.data(), g.outputs[0].shape);
        lm_head_ = std::move(b);
      }
    }
  }
  // Bound before the first step, so a graph run before any routing still has every input bound.
  bind_expert_rows(0, PhimoeRoute{{0, 1}, {0, 0}});
}

PhimoeGenerate::~PhimoeGenerate() = default;

void PhimoeGenerate::bind_expert_rows(int layer, const PhimoeRoute& r) {
  for (const ExpertInput& e : expert_inputs_) {
    const size_t at = (size_t(layer) * size_t(experts_) + size_t(r.expert[e.slot])) * e.slab;
    if (e.dtype == "int8") experts_graph_->bind_input(e.name, e.table->as<int8_t>() + at, e.shape);
    else if (e.dtype == "float16") experts_graph_->bind_input(e.name, e.table->as<Ort::Float16_t>() + at, e.shape);
    else experts_graph_->bind_input(e.name, e.table->as<float>() + at, e.shape);
  }
}

void PhimoeGenerate::reset() {
  mask_->reset();
  routes_.clear();
}

int PhimoeGenerate::step(const int* ids, int start, int valid, bool want_token, bool prefill, double* run_ms) {
  if (prefill || valid != 1) throw std::logic_error("phimoe_generate has no batched prefill");
  const int H = m_.hidden, C = m_.max_context;
  embed_rows(embedding_->as<uint16_t>(), ids, 1, H, x_.data());
  positions_[0] = std::min(start, C - 1);
  mask_->fill(start, 1);

  for (int l = 0; l < m_.layers; l++) {
    Layer& layer = layers_[size_t(l)];
    auto t0 = Clock::now();
    layer.attn->run();
    *run_ms += ms_since(t0);
    for (const StateRows& r : layer.rows) r.write(caches_[size_t(r.state)].data(), C, 1, start, 1);
    PhimoeRoute route;
    try {
      route = phimoe_route(router_logits_.data(), experts_, jitter_eps_);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error("layer " + std::to_string(l) + " at position " + std::to_string(start) + ": cannot route: " + e.what());
    }
    if (record_) routes_.push_back({start, l, route});
    routing_[0] = route.weight[0];
    routing_[1] = route.weight[1];
    bind_expert_rows(l, route);
    t0 = Clock::now();
    experts_graph_->run();
    *run_ms += ms_since(t0);
  }
  if (!want_token) return -1;
  auto t0 = Clock::now();
  lm_head_->run();
  *run_ms += ms_since(t0);
  return token_of(logits_.data(), start);
}

std::unique_ptr<Generator> make_phimoe_generate(const Manifest& m, Executor& exec) { return std::make_unique<PhimoeGenerate>(m, exec); }

}  // namespace forge
