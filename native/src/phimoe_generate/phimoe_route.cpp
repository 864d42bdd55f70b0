#include "phimoe_route.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace forge {
namespace {

struct Slot {
  int expert;
  float weight;
};

// One sparsemixer slot; `taken` is the expert an earlier slot picked (-1 for none).
Slot route_slot(const float* s, int n, int taken, float threshold) {
  int e = -1;
  for (int i = 0; i < n; i++)
    if (i != taken && (e < 0 || s[i] > s[e])) e = i;  // strict >: the first of equal maxima wins
  const float m = s[e];
  // The winner is the max of the unmasked set, so its softmax numerator is exp(0) = 1 and its
  // share is 1 / sum. The sum is taken in double: torch sums float32 exps in a vectorised order
  // that a scalar loop cannot reproduce, so this is the exact value rounded once (the test's
  // tolerance covers torch's own rounding).
  double sum = 0;
  for (int i = 0; i < n; i++) {
    if (i == taken) continue;  // -inf in HF's masked scores: exp(-inf) = 0
    const float factor = std::fabs(s[i]) > m ? std::fabs(s[i]) : m;  // clamp(|s_i|, min=m)
    const float ratio = (m - s[i]) / factor;                        // float32, as torch
    if (ratio > threshold) continue;                                // NaN (0/0) compares false: kept
    sum += std::exp(static_cast<double>(s[i] - m));
  }
  return {e, static_cast<float>(1.0 / sum)};
}

}  // namespace

PhimoeRoute phimoe_route(const float* logits, int n_experts, double jitter_eps) {
  if (n_experts < 2)
    throw std::invalid_argument("phimoe_route: " + std::to_string(n_experts) + " experts, top-2 needs at least 2");
  for (int i = 0; i < n_experts; i++)
    if (!std::isfinite(logits[i]))
      throw std::invalid_argument("phimoe_route: router logit " + std::to_string(i) + " is not finite (" +
                                  std::to_string(logits[i]) + ")");
  const float threshold = static_cast<float>(2.0 * jitter_eps);
  const Slot a = route_slot(logits, n_experts, -1, threshold);
  const Slot b = route_slot(logits, n_experts, a.expert, threshold);
  return {{a.expert, b.expert}, {a.weight, b.weight}};
}

}  // namespace forge
