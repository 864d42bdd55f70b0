#include "step_buffers.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "half.h"

namespace forge {

void embed_rows(const uint16_t* table, const int* ids, int n, int H, float* out) {
  for (int r = 0; r < n; r++) {
    const uint16_t* row = table + size_t(ids[r]) * size_t(H);
    for (int h = 0; h < H; h++) out[size_t(r) * size_t(H) + size_t(h)] = half_to_float(row[h]);
  }
}

void gather_rows(const uint16_t* table, int64_t cols, int64_t offset, int64_t width, const int* ids, int valid, float scale, float* out) {
  for (int r = 0; r < valid; r++) {
    const uint16_t* row = table + size_t(ids[r]) * size_t(cols) + size_t(offset);
    for (int64_t c = 0; c < width; c++) out[size_t(r) * size_t(width) + size_t(c)] = half_to_float(row[c]) * scale;
  }
}

StepMask::StepMask(int slots, int n, float masked, bool ring, int sliding)
    : C_(slots), n_(n), S_(sliding > 0 ? sliding : slots), masked_(masked), ring_(ring), mask_(size_t(n) * size_t(slots + n), masked) {
  if (S_ > C_) throw std::logic_error("a ring mask's window is wider than its ring");
}

void StepMask::fill(int start, int valid) {
  const int W = C_ + n_;
  if (ring_) {
    // Before this call's rows are written, slot j holds the latest position p < start with
    // p = j (mod C); row r (position start + r) sees it while start + r - p < S. New token k shows to
    // row r when it is real, not later than r, and inside the window.
    for (int r = 0; r < n_; r++) {
      float* row = mask_.data() + size_t(r) * W;
      for (int j = 0; j < C_; j++) {
        const int p = start - 1 - ((start - 1 - j) % C_ + C_) % C_;
        row[j] = p >= 0 && start + r - p < S_ ? 0.0f : masked_;
      }
      for (int k = 0; k < n_; k++) row[C_ + k] = k <= r && k < valid && r - k < S_ ? 0.0f : masked_;
    }
    return;
  }
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

void StateRows::write(float* cache, int slots, int n, int start, int valid, bool ring) const {
  for (size_t o = 0; o < outer; o++)
    for (int k = 0; k < valid; k++) {
      const size_t slot = ring ? size_t((start + k) % slots) : size_t(start + k);
      std::memcpy(cache + (o * size_t(slots) + slot) * inner, buf.data() + (o * size_t(n) + size_t(k)) * inner, inner * sizeof(float));
    }
}

}  // namespace forge
