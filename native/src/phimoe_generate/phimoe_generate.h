// phimoe_generate: PhiMoE's step for the one greedy loop (greedy_loop.h). Per token and layer: the
// layer's attention+router graph (residual in; attention residual, the normed MoE input handed off,
// router logits and new K/V rows out), then the host's sparsemixer top-2 (phimoe_route.h), then
// the one experts graph every layer shares, its expert inputs bound to the chosen experts' rows of
// the mapped host tables (no copy: rebinding moves the views), the routing weights beside them;
// after the last layer the lm-head (final LayerNorm + biased head). Buffers are allocated and bound
// once; a step allocates nothing but rebinds the expert rows.
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
  const std::vector<PhimoeRouteAt>& routes() const { return routes_; }

 protected:
  void reset() override;
  int step(const int* ids, int start, int valid, bool want_token, bool prefill, double* run_ms) override;

 private:
  struct Layer {
    std::unique_ptr<GraphBinding> attn;
    std::vector<StateRows> rows;
  };
  struct ExpertInput {
    std::string name, dtype;
    std::vector<int64_t> shape;
    const MappedFile* table;
    size_t slab;  // elements per (layer, expert)
    int slot;
  };
  void bind_expert_rows(int layer, const PhimoeRoute& r);

  Executor& exec_;
  int experts_ = 0;
  double jitter_eps_ = 0;
  std::unique_ptr<MappedFile> embedding_;
  std::vector<std::unique_ptr<MappedFile>> tables_;  // by host table index (null: not an expert table)
  std::vector<std::vector<float>> caches_;
  std::vector<float> x_, attn_res_, router_logits_, logits_;
  std::unique_ptr<StepMask> mask_;
  std::map<std::string, std::vector<float>> handoffs_;
  std::vector<int32_t> positions_;
  float routing_[2] = {0, 0};
  std::vector<Layer> layers_;
  std::unique_ptr<GraphBinding> experts_graph_, lm_head_;
  std::vector<ExpertInput> expert_inputs_;
  bool record_ = false;
  std::vector<PhimoeRouteAt> routes_;
};

}  // namespace forge
