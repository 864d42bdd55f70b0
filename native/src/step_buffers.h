// Buffers every host-op's step keeps the same way: the additive attention mask of the manifest's
// past-then-new layout, and the new cache rows a graph gives (state-rows outputs), of which only
// the real rows are written into the KV cache at the call's positions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "manifest.h"

namespace forge {

/** Rows ids[0..n) of an f16 table [vocab, H] (the embedding), widened to float32 into out [n, H]. */
void embed_rows(const uint16_t* table, const int* ids, int n, int H, float* out);

/** Columns [offset, offset + width) of rows ids[0..valid) of an f16 table with `cols` columns, times `scale`, into out [valid, width]. */
void gather_rows(const uint16_t* table, int64_t cols, int64_t offset, int64_t width, const int* ids, int valid, float scale, float* out);

/**
 * The mask [n, C + n] of n new tokens at positions start.. (valid of them real), kept across calls.
 * A ring mask covers a ring cache of C slots, where position q lives in slot q mod C: a slot is
 * visible to the row at q while the position it holds is within the sliding window (q - p < S, S
 * the window, C by default). With C = S (decode) that is every slot but the one the new token's row
 * will overwrite once the ring is full; a ring of S + n - 1 slots lets n rows be written at once
 * without overwriting a position another row of the call still sees.
 */
class StepMask {
 public:
  StepMask(int slots, int n, float masked, bool ring = false, int sliding = 0);
  /** Fills it for this call: cache slot j < start visible; new token k visible to row r when k <= r and k is real. */
  void fill(int start, int valid);
  /** Forgets what the decode row shows (a new sequence). */
  void reset() { visible_ = -1; }
  float* data() { return mask_.data(); }

 private:
  int C_, n_, S_;
  float masked_;
  bool ring_;
  std::vector<float> mask_;
  int visible_ = -1;  // one token: leading cache slots the row shows now (it only grows as the position advances)
};

/** A state-rows output's buffer: `n` new rows on `axis` of a KV cache. */
struct StateRows {
  int state;
  size_t outer, inner;  // elements before / after the rows axis
  std::vector<float> buf;
  explicit StateRows(const GraphOutput& o);
  /**
   * Writes the `valid` real rows (of n) into `cache` ([outer, slots, inner]) at positions start..; a
   * ring cache (`ring`: slots = its window) at slots (start + k) mod slots.
   */
  void write(float* cache, int slots, int n, int start, int valid, bool ring = false) const;
};

}  // namespace forge
