// The PhiMoE router's expert choice on the host: HF's sparsemixer at inference (transformers
// models/phimoe/modeling_phimoe.py `sparsemixer`, training=False), top-2, in float32.
#pragma once

namespace forge {

struct PhimoeRoute {
  int expert[2];    // slot order: the first pick, then the second
  float weight[2];  // each slot's own softmax share; not renormalised (they may sum to up to 2)
};

// Routes one token from its router logits (n_experts >= 2, all finite; throws
// std::invalid_argument naming the first bad entry otherwise). jitter_eps is the config's
// router_jitter_noise (0.01 on Phi-tiny-MoE).
//
// Per slot, as HF computes it: the winner e is the largest logit not yet picked (the first index
// among equal maxima, as torch.max); a logit s_i is masked when (m - s_i) / max(|s_i|, m) > 2ε,
// m = s_e, computed in float32 against the ORIGINAL logits, with 2ε cast to float32 as torch does
// when it compares a float32 tensor with a Python float (a ratio of 0/0, m = s_i = 0, is NaN and
// does not mask); the weight is e's share of a softmax over the unmasked logits of this slot
// (earlier picks are -inf there).
PhimoeRoute phimoe_route(const float* logits, int n_experts, double jitter_eps);

}  // namespace forge
