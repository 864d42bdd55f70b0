// The generation host-ops: greedy generation over a decoder split into shards. This is the ONLY
// implementation of the decode loop (TypeScript calls the runtime for it), and it serves both:
//   decoder_generate   dense decoders (Qwen3): KV caches; batched prefill when every shard has a
//                      prefill graph, else decode over the prompt.
//   qwen3_5_generate   hybrids (Qwen3.5): KV caches for the full-attention layers plus recurrent
//                      state (conv FIFO, delta-rule state) that each call replaces whole; decode
//                      over the prompt (a prefill would need the chunked delta rule), lm-head separate.
// One token: embedding lookup (f16 host table → f32 rows) → shards in manifest order, threading the
// residual, each updating only its own layers' state → lm-head (or the last shard's logits) on the
// last real row → argmax. New K/V rows come back as state-rows outputs and only the real rows are
// written into the caches at the call's positions. A recurrent state has two buffers: a call reads
// one and writes the other, and the next call swaps them, so its update is never copied.
//
// Every buffer (caches, states, residuals, positions, mask, rows, logits) is allocated once here and
// bound to the graphs once (two bindings for a graph with recurrent state, one per buffer
// direction); a decode step allocates nothing and copies no state.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor.h"
#include "manifest.h"

namespace forge {

struct GenerateOptions {
  int max_new_tokens = 0;
  bool ignore_eos = false;
  bool use_prefill = true;
};

struct GenerateTimings {
  double prefill_ms = 0;                  // the whole prompt, through the first token's argmax
  double decode_ms_per_token = 0;         // one decode step, from token in to argmax out
  double host_overhead_ms_per_token = 0;  // the part of a decode step outside session Run calls
  int decode_steps = 0;
};

struct GenerateResult {
  std::vector<int> generated;
  bool stopped_at_eos = false;
  bool used_prefill = false;
  GenerateTimings timings;
};

/** Count of NaN/±Inf among x[0..n) and the index of the first (-1 when all are finite). */
struct NonFiniteCount {
  int64_t count = 0;
  int64_t first = -1;
};
NonFiniteCount count_non_finite(const float* x, int64_t n);

/**
 * The logits generate() would take the argmax of hold NaN/Inf: an argmax over them means nothing
 * (NaN never compares greater, so it would quietly give token 0). qhx_generate exits with
 * kExitNonFiniteLogits on it, so the parity gate can report it as what it is.
 */
class NonFiniteLogits : public std::runtime_error {
 public:
  NonFiniteLogits(int position, int token_index, NonFiniteCount nf, int vocab);
  int position, token_index;
};
constexpr int kExitNonFiniteLogits = 3;

class DecoderGenerate {
 public:
  DecoderGenerate(const Manifest& manifest, Executor& executor);
  ~DecoderGenerate();
  /**
   * `forced` teacher-forces the continuation: step k (k >= 1) is fed forced[k - 1] instead of the
   * token the runtime chose at step k - 1; past the last forced id the runtime goes on from its own
   * choices. GenerateResult::generated stays what the runtime chose at each step, so a parity gate can
   * compare every step with HF's token while the sequence follows HF's (at most max_new_tokens ids).
   */
  GenerateResult generate(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced = {});
  bool has_prefill() const { return prefill_ != nullptr; }

 private:
  struct Pass;
  std::unique_ptr<Pass> make_pass(GraphRole role, int tokens);
  /** Prefill (or decode over the prompt), then greedy decode into `res`. */
  void loop(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced, GenerateResult& res);
  /** Runs N tokens at positions start.. (valid of them real); returns the argmax of the last real row when `want_token`. */
  int run(Pass& pass, const int* ids, int start, int valid, bool want_token, double* run_ms);
  void fill_mask(Pass& pass, int start, int valid);

  const Manifest& m_;
  Executor& exec_;
  const uint16_t* embedding_ = nullptr;
  size_t embedding_bytes_ = 0;
  std::vector<std::vector<float>> caches_;
  std::vector<std::vector<float>> shadows_;  // a recurrent state's second buffer (empty for KV caches)
  int flip_ = 0;                             // which buffer of each recurrent state a call reads: 0 caches_, 1 shadows_
  std::unique_ptr<Pass> decode_, prefill_;
};

}  // namespace forge
