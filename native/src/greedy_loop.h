// The greedy decode loop, once for every host-op: the prompt (batched prefill chunks when the host-op
// has them, else one token at a time), then one token per step, teacher-forced while forced ids
// last, stopping at EOS or max_new_tokens, with the timings. A host-op supplies only what one call
// computes (step) and what a new sequence must not inherit (reset); the loop, its checks and its
// bookkeeping are here, so no host-op re-implements them.
#pragma once
#include <chrono>
#include <vector>

#include "host_op.h"
#include "manifest.h"

namespace forge {

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

/** Index of the first maximum, as torch.argmax. */
int argmax(const float* x, int n);

/** Thrown by a step with the position only; generate() knows which generated token that is. */
struct NonFiniteAt {
  int position;
  NonFiniteCount nf;
};

class GreedyGenerator : public Generator {
 public:
  GenerateResult generate(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced = {}) override;
  bool has_prefill() const override { return prefill_tokens() > 0; }

 protected:
  explicit GreedyGenerator(const Manifest& m) : m_(m) {}
  /** Clears what a new sequence must not inherit (recurrent state, the mask's visible slots). */
  virtual void reset() = 0;
  /** Tokens per batched prefill call; 0 when the prompt is decoded token by token. */
  virtual int prefill_tokens() const { return 0; }
  /**
   * Runs ids[0..valid) at positions start.. (a prefill chunk when `prefill`, else one token) and
   * returns the argmax of the last real row's logits when `want_token` (token_of); adds the time
   * inside graph runs to *run_ms.
   */
  virtual int step(const int* ids, int start, int valid, bool want_token, bool prefill, double* run_ms) = 0;
  /** The argmax of a vocab of logits for `position`; throws NonFiniteAt on NaN/Inf. */
  int token_of(const float* logits, int position) const;

  const Manifest& m_;

 private:
  void loop(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced, GenerateResult& res);
};

}  // namespace forge
