// phimoe_generate's batched prefill: a chunk of up to N prompt tokens per call (see phimoe_generate.h).
#include <algorithm>
#include <cstring>

#include "phimoe_generate/phimoe_generate.h"

namespace forge {

int PhimoeGenerate::prefill_step(const int* ids, int start, int valid, bool want_token, double* run_ms) {
  Pass& p = *prefill_;
  const int H = m_.hidden, C = m_.max_context, N = p.n, E = experts_;
  embed_rows(embedding_->as<uint16_t>(), ids, valid, H, p.x[0].data());
  std::fill(p.x[0].begin() + size_t(valid) * size_t(H), p.x[0].end(), 0.0f);  // padding rows of a short chunk: finite, masked from the real rows
  for (int r = 0; r < N; r++) p.positions[size_t(r)] = std::min(start + r, C - 1);
  p.mask->fill(start, valid);

  int cur = 0;  // which of x[0], x[1] holds the residual
  for (int l = 0; l < m_.layers; l++) {
    Pass::Layer& layer = p.layers[size_t(l)];
    timed_run(*layer.attn[cur], run_ms);
    cur ^= 1;  // the attention residual: the running sum the experts add to
    for (const StateRows& r : layer.rows) r.write(caches_[size_t(r.state)].data(), C, N, start, valid);
    for (int r = 0; r < valid; r++) {
      const PhimoeRoute& q = p.routes[size_t(r)] = route(p.router_logits.data() + size_t(r) * size_t(E), l, start + r);
      p.used[size_t(q.expert[0])] = p.used[size_t(q.expert[1])] = 1;
      if (record_) routes_.push_back({start + r, l, q});
    }
    // Every expert some real row chose, ascending as HF's index_add_ sums them; a row that did not
    // choose it (a padding row included) adds 0 times its output.
    for (int e = 0; e < E; e++) {
      if (!p.used[size_t(e)]) continue;
      p.used[size_t(e)] = 0;
      for (int r = 0; r < N; r++) {
        const PhimoeRoute& q = p.routes[size_t(r)];
        p.routing[size_t(r)] = r >= valid ? 0.0f : q.expert[0] == e ? q.weight[0] : q.expert[1] == e ? q.weight[1] : 0.0f;
      }
      const int expert[1] = {e};  // the prefill experts graph has slot 0 only
      bind_expert_rows(*p.experts[cur], p.expert_inputs, l, expert);
      timed_run(*p.experts[cur], run_ms);
      cur ^= 1;
    }
    // The layer's output is in x[cur], which attn[cur] of the next layer reads: no copy, no rebinding.
  }
  if (!want_token) return -1;
  // The last real row into the decode pass's residual, which the lm-head reads (one row of H).
  std::memcpy(decode_->x[0].data(), p.x[size_t(cur)].data() + size_t(valid - 1) * size_t(H), size_t(H) * sizeof(float));
  timed_run(*lm_head_, run_ms);
  return token_of(logits_.data(), start + valid - 1);
}

}  // namespace forge
