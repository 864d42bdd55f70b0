#include "step_buffers.h"

#include <algorithm>
#include <cstring>

#include "half.h"

namespace forge {

void embed_rows(const uint16_t* table, const int* ids, int n, int H, float* out) {
  for (int r = 0; r < n; r++) {
    const uint16_t* row = table + size_t(ids[r]) * size_t(H);
    for (int h = 0; h < H; h++) out[size_t(r) * size_t(H) + size_t(h)] = half_to_float(row[h]);
  }
}

StepMask::StepMask(int max_context, int n, float masked)
    : C_(max_context), n_(n), masked_(masked), mask_(size_t(n) * size_t(max_context + n), masked) {}

void StepMask::fill(int start, int valid) {
  const int W = C_ + n_;
  if (n_ == 1 && visible_ >= 0 && start >= visible_) {
    // Decode: the row only gains visible slots as the position advances.
    std::fill(mask_.begin() + visible_, mask_.begin() + start, 0.0f);
    visible_ = start;
    return;
  }
  for (int r = 0; r < n_; r++) {
    float* row = mask_.data() + size_t(r) * W;
    std::fill(row, row + W, masked_);
    std::fill(row, row + start, 0.0f);
    for (int k = 0; k <= r && k < valid; k++) row[C_ + k] = 0.0f;
  }
  if (n_ == 1) visible_ = start;
}

StateRows::StateRows(const GraphOutput& o) : state(o.state), outer(1), inner(1), buf(elements(o.shape)) {
  for (int d = 0; d < o.axis; d++) outer *= size_t(o.shape[size_t(d)]);
  for (size_t d = size_t(o.axis) + 1; d < o.shape.size(); d++) inner *= size_t(o.shape[d]);
}

void StateRows::write(float* cache, int max_context, int n, int start, int valid) const {
  for (size_t o = 0; o < outer; o++)
    for (int k = 0; k < valid; k++)
      std::memcpy(cache + (o * size_t(max_context) + size_t(start + k)) * inner, buf.data() + (o * size_t(n) + size_t(k)) * inner, inner * sizeof(float));
}

}  // namespace forge
