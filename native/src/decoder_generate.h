// The decoder_generate host-op: greedy generation over a KV-cache decoder split into shards.
// It is the ONLY implementation of the decode loop (TypeScript calls the runtime for it):
//   embedding lookup (f16 host table → f32 rows) → shards in manifest order, threading the residual
//   → lm-head (or the last shard's logits) on the last real row → argmax.
// The prompt goes through the prefill graphs in chunks of their token count (the last chunk
// padded) when every shard has one, else token by token through the decode graphs ("decode over
// the prompt"; also forced by GenerateOptions::use_prefill = false). New K/V rows come back as
// state-rows outputs and only the real rows are written into the caches at the call's positions.
//
// Every buffer (caches, residuals, positions, mask, rows, logits) is allocated once here and bound
// to the graphs once; a decode step allocates nothing and copies no state.
#pragma once
#include <cstdint>
#include <memory>
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

class DecoderGenerate {
 public:
  DecoderGenerate(const Manifest& manifest, Executor& executor);
  ~DecoderGenerate();
  GenerateResult generate(const std::vector<int>& prompt, const GenerateOptions& opts);
  bool has_prefill() const { return prefill_ != nullptr; }

 private:
  struct Pass;
  std::unique_ptr<Pass> make_pass(GraphRole role, int tokens);
  /** Runs N tokens at positions start.. (valid of them real); returns the argmax of the last real row when `want_token`. */
  int run(Pass& pass, const int* ids, int start, int valid, bool want_token, double* run_ms);
  void fill_mask(Pass& pass, int start, int valid);

  const Manifest& m_;
  Executor& exec_;
  const uint16_t* embedding_ = nullptr;
  size_t embedding_bytes_ = 0;
  std::vector<std::vector<float>> caches_;
  std::unique_ptr<Pass> decode_, prefill_;
};

}  // namespace forge
