// phimoe_generate: PhiMoE's step for the one greedy loop (greedy_loop.h). Per token and layer: the
// layer's attention+router graph (residual in; attention residual, the normed MoE input handed off,
// router logits and new K/V rows out), then the host's sparsemixer top-2 (phimoe_route.h), then
// the one experts graph every layer shares, its expert inputs bound to the chosen experts' rows of
// the mapped host tables (no copy: rebinding moves the views), the routing weights beside them;
// after the last layer the lm-head (final LayerNorm + biased head).
//
// Batched prefill (phimoe_prefill.cpp), when the manifest has the prefill roles: N prompt tokens per
// call through each layer's attn_router_prefill graph, then the one-expert experts_prefill graph once
// per expert that some row chose (ascending, as HF sums them), each call adding that expert's
// weighted output to the running residual.
//
// Buffers are allocated and bound once; a step allocates nothing but rebinds the expert rows.
//
// What it runs, and nothing else, is what validate_phimoe_generate (phimoe_manifest.cpp) admits.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor.h"
#include "greedy_loop.h"
#include "manifest.h"
#include "step_buffers.h"
#include "phimoe_generate/phimoe_route.h"

namespace forge {

/** Graph roles: per-layer attention+router and the shared experts graph, each for decode and for prefill. */
namespace phimoe_role {
constexpr const char* attn_router = "attn_router";
constexpr const char* experts = "experts";
constexpr const char* attn_router_prefill = "attn_router_prefill";
constexpr const char* experts_prefill = "experts_prefill";
}  // namespace phimoe_role

void validate_phimoe_generate(const Manifest& m);
std::unique_ptr<Generator> make_phimoe_generate(const Manifest& m, Executor& exec);

/** One routing decision as the runtime took it: which experts a layer used at a position. */
struct PhimoeRouteAt {
  int position, layer;
  PhimoeRoute route;
};

class PhimoeGenerate : public GreedyGenerator {
 public:
  PhimoeGenerate(const Manifest& manifest, Executor& executor);
  ~PhimoeGenerate() override;
  /** Keep every route of the next generate() calls (tests; bisecting a drift to the layer that routed otherwise). */
  void record_routes(bool on) { record_ = on; }
  /** In the order taken: a decode step layer by layer; a prefill chunk layer by layer, each layer's rows
   *  in position order. So each layer's routes are in position order. */
  const std::vector<PhimoeRouteAt>& routes() const { return routes_; }

 protected:
  void reset() override;
  int prefill_tokens() const override;
  int step(const int* ids, int start, int valid, bool want_token, bool prefill, double* run_ms) override;

 private:
  struct ExpertInput {
    std::string name, dtype;
    std::vector<int64_t> shape;
    const MappedFile* table;
    size_t slab;  // elements per (layer, expert)
    int slot;
  };
  /**
   * The buffers and bindings of n tokens per call. The residual ping-pongs between x[0] and x[1]:
   * attn[f] reads x[f] and writes the attention residual to x[1-f]; experts[f] adds to x[f] into
   * x[1-f]. Decode binds attn[0] and experts[1] only (x[0] → x[1] → x[0]); prefill binds both of
   * each, as a layer's expert calls vary in number and so in where the layer's output lands.
   */
  struct Pass {
    int n = 1;
    std::vector<float> x[2];
    std::vector<int32_t> positions;
    std::unique_ptr<StepMask> mask;
    std::vector<float> router_logits;  // [n, experts]
    std::vector<float> routing;        // the routing-weights input: decode the two slots', prefill one per row
    std::map<std::string, std::vector<float>> handoffs;  // by name: written by the attention graphs, read by the experts graph
    struct Layer {
      std::unique_ptr<GraphBinding> attn[2];
      std::vector<StateRows> rows;  // the new K/V rows, shared by both bindings
    };
    std::vector<Layer> layers;
    std::unique_ptr<GraphBinding> experts[2];
    std::vector<ExpertInput> expert_inputs;
    // Prefill only: each valid row's route, and which experts some row chose, of the current layer.
    std::vector<PhimoeRoute> routes;
    std::vector<char> used;
  };
  /** The pass of the roles attn/experts over n tokens; `both` binds both residual directions. */
  std::unique_ptr<Pass> make_pass(const char* attn_role, const char* experts_role, int n, bool both);
  /** Moves g's expert inputs to the rows of (layer, expert[slot]) in the mapped tables: no copy. */
  void bind_expert_rows(GraphBinding& g, const std::vector<ExpertInput>& inputs, int layer, const int* expert);
  static void timed_run(GraphBinding& g, double* run_ms);
  /** phimoe_route, its refusal naming the layer and position. */
  PhimoeRoute route(const float* logits, int layer, int position) const;
  int decode_step(const int* id, int position, bool want_token, double* run_ms);
  int prefill_step(const int* ids, int start, int valid, bool want_token, double* run_ms);  // phimoe_prefill.cpp

  Executor& exec_;
  int experts_ = 0;
  double jitter_eps_ = 0;
  std::unique_ptr<MappedFile> embedding_;
  std::vector<std::unique_ptr<MappedFile>> tables_;  // by host table index (null: not an expert table)
  std::vector<std::vector<float>> caches_;
  std::vector<float> logits_;
  std::unique_ptr<Pass> decode_, prefill_;  // prefill_: null without the prefill roles
  std::unique_ptr<GraphBinding> lm_head_;   // reads decode_->x[0]
  bool record_ = false;
  std::vector<PhimoeRouteAt> routes_;
};

}  // namespace forge
