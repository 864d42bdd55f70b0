// The decoder host-ops: greedy generation over a decoder split into shards. The decode loop itself
// is greedy_loop.h's (the one loop of every host-op; TypeScript calls the runtime for it); this
// computes its steps, and serves both:
//   decoder_generate   dense decoders (Qwen3): KV caches; batched prefill when every shard has a
//                      prefill graph, else decode over the prompt.
//   qwen3_5_generate   hybrids (Qwen3.5): KV caches for the full-attention layers plus recurrent
//                      state (conv FIFO, delta-rule state) that each call replaces whole; batched
//                      prefill as decoder_generate (the graphs run the chunked delta rule), lm-head separate.
//   gemma4_split_generate  Gemma 4 (gemma4_generate/): parts in sequence, per-layer-embedding
//                      rows gathered per token from a host table, K/V of a donor layer shared across
//                      parts, ring caches of the sliding window, decode over the prompt; with its
//                      vision graph, an image's soft tokens at its image tokens.
// One token: embedding lookup (f16 host table → f32 rows) → shards in manifest order, threading the
// residual, each updating only its own layers' state → lm-head (or the last shard's logits) on the
// last real row → argmax. New K/V rows come back as state-rows outputs and only the real rows are
// written into the caches at the call's positions. A recurrent state has two buffers: a call reads
// one and writes the other, and the next call swaps them, so its update is never copied.
//
// Every buffer (caches, states, residuals, positions, mask, rows, logits) is allocated once here and
// bound to the graphs once (two bindings for a graph with recurrent state, one per buffer
// direction); a decode step allocates nothing and copies no state.
//
// Both are registered in host_ops.cpp with this one loop and a validator each: what the loop runs
// (roles prefill/decode/lm_head; residual, positions, mask and state bindings; one f16 embedding
// table) is all either accepts. qwen3_vl_generate (qwen3_vl_generate/) is this step with the hooks
// below (positions [3, N], encoder-output rows, image rows in the residual) and its own vision
// graph, whose context has no decode graph: contexts without one are not shards and are skipped here.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor.h"
#include "greedy_loop.h"
#include "host_op.h"
#include "manifest.h"

namespace forge {

/** The host-ops DecoderGenerate serves, each with the rules of what it runs (decoder_manifest.cpp). */
void validate_decoder_generate(const Manifest& m);
/**
 * The decoder part of qwen3_vl_generate (the shards and the lm-head; its validator checks the vision
 * graph and hostOpParams): as decoder_generate, with positions [3, N] in every graph that reads a KV
 * cache, float32 [1, N, model.hidden] encoder-output inputs, and contexts of role `vision` left to it.
 */
void validate_qwen3_vl_decoder(const Manifest& m);
void validate_qwen3_5_generate(const Manifest& m);
/** The decoder part of gemma4_split_generate (its validator, gemma4_manifest.cpp, checks the vision graph and its hostOpParams). */
void validate_gemma4_decoder(const Manifest& m);
std::unique_ptr<Generator> make_decoder_generate(const Manifest& m, Executor& exec);

/** The index of the context holding graph `g` (an encoder graph a host-op binds itself). */
size_t context_of(const Manifest& m, const Graph* g);

/** What a host-op adds to the plain decoder's token step. */
struct DecoderOptions {
  /** The embedding rows entering the first shard are multiplied by this (Gemma: √hidden). */
  float embed_scale = 1;
  /** host-rows inputs from a table of this use are multiplied by the scale (Gemma's PLE rows: √P). */
  std::map<std::string, float> row_scale;
};

class DecoderGenerate : public GreedyGenerator {
 public:
  DecoderGenerate(const Manifest& manifest, Executor& executor, DecoderOptions options = {});
  ~DecoderGenerate() override;

 protected:
  void reset() override;
  int prefill_tokens() const override;
  int step(const int* ids, int start, int valid, bool want_token, bool prefill, double* run_ms) override;

  // What a host-op built on this step (qwen3_vl_generate) feeds differently; the defaults are the
  // plain decoder's. Each gets the call's cache slots start.. (valid of its n rows real); they are
  // called once per call, before the graphs run, and write into buffers bound once (no allocation).
  /** Positions [3, n] (multimodal RoPE rows t, h, w, row-major) of the call's tokens; default: t = h = w = the slot. */
  virtual void position_rows(int start, int n, int valid, int32_t* rows) const;
  /** Rows [n, width] of the encoder-output `output` (the input's `output`, else its name) for the call's tokens; default: zeros. */
  virtual void encoder_rows(const std::string& output, int start, int n, int valid, int64_t width, float* rows) const;
  /**
   * The first shard's residual rows [valid, model.hidden] after the embedding (and its scale): a
   * host-op may replace some (image tokens). The embedding rows a graph reads as host-rows get the same.
   */
  virtual void input_rows(int /*start*/, int /*valid*/, float* /*x*/) const {}
  /** The ids host-rows inputs read their tables at (default: the call's ids); Gemma 4 reads the pad token's rows at image tokens. */
  virtual const int* row_ids(int /*start*/, int /*valid*/, const int* ids) const { return ids; }

 private:
  struct Pass;
  std::unique_ptr<Pass> make_pass(const char* variant, int tokens);
  /** Runs N tokens at positions start.. (valid of them real); returns the argmax of the last real row when `want_token`. */
  int run(Pass& pass, const int* ids, int start, int valid, bool want_token, double* run_ms);

  Executor& exec_;
  DecoderOptions opts_;
  std::vector<std::unique_ptr<MappedFile>> tables_;  // by manifest host-table index: the embedding and those host-rows inputs read
  const MappedFile* embedding_ = nullptr;            // one of tables_
  std::vector<std::vector<float>> caches_;
  std::vector<std::vector<float>> shadows_;  // a recurrent state's second buffer (empty for KV caches)
  int flip_ = 0;                             // which buffer of each recurrent state a call reads: 0 caches_, 1 shadows_
  bool half_ = false;                        // the residual is handed over as f16 (every residual binding says so)
  std::unique_ptr<Pass> decode_, prefill_;
};

}  // namespace forge
