// gemma4_split_generate: Gemma 4, a prompt (and an image) → greedy tokens. It is DecoderGenerate's
// step (parts in sequence, per-layer-embedding rows from a host table, ring and shared caches, the
// embedding and per-layer rows scaled as HF's scaled embeddings, decode over the prompt) and, with
// the bundle's vision graph, an image's soft tokens in the prompt, as HF's Gemma4Model merges them:
//   - the vision graph runs once per image over the processor's patches and (x, y) positions
//     (gemma4_image.h), giving max_soft_tokens rows in the text width; the image's own soft tokens
//     are the first T (T depends on the image's aspect ratio; the rest is the budget's padding);
//   - the prompt holds the image as <start_of_image>, T image tokens, <end_of_image>; at the image
//     tokens the residual entering the first part and the embedding rows the parts' per-layer
//     projection reads are the soft tokens, and the per-layer-embedding rows are the pad token's
//     (HF replaces image ids by pad_token_id for the per-layer lookup);
//   - attention stays causal: E2B/E4B have no bidirectional image attention (the family refuses a
//     config that asks for it), so decoding over the prompt is HF's computation.
// A manifest without the vision graph (a text-only bundle, or the bundle's text manifest) runs text.
//
// What it runs is what validate_gemma4_split_generate (gemma4_manifest.cpp) admits.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "decoder_generate.h"
#include "executor.h"
#include "host_op.h"
#include "manifest.h"

namespace forge {

namespace gemma4 {
constexpr const char* vision_role = "vision";
}  // namespace gemma4

void validate_gemma4_split_generate(const Manifest& m);
std::unique_ptr<Generator> make_gemma4_split_generate(const Manifest& m, Executor& exec);
/** HostOpSpec::image: HF's Gemma 4 image processor for the bundle's budget, and the image's block; refuses a manifest without the vision graph. */
ImageReader gemma4_image_reader(const Manifest& m);
/** The vision graph (role `vision`), or nullptr in a text manifest. */
const Graph* gemma4_vision_graph(const Manifest& m);

class Gemma4Generate final : public DecoderGenerate {
 public:
  Gemma4Generate(const Manifest& manifest, Executor& executor);
  ~Gemma4Generate() override;
  /** Finds the prompt's image (one run of image tokens, as long as the encoded image's soft tokens), then the one loop. */
  GenerateResult generate(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced = {}) override;
  double encode_image(const Pixels& pixels) override;

 protected:
  void input_rows(int start, int valid, float* x) const override;
  const int* row_ids(int start, int valid, const int* ids) const override;

 private:
  /** Whether cache slot `slot` holds one of this call's image tokens. */
  bool image_slot(int slot) const { return image_slot_ >= 0 && slot >= image_slot_ && slot < image_slot_ + tokens_; }

  int image_token_ = -1, pad_token_ = -1;
  const Graph* vision_ = nullptr;
  std::unique_ptr<GraphBinding> vision_run_;
  std::vector<float> pixels_;        // the vision graph's inputs, bound once
  std::vector<int32_t> positions_;
  std::vector<float> soft_;          // its output [max_soft_tokens, hidden], bound once
  int tokens_ = 0;                   // soft tokens of the encoded image; 0: none encoded
  int image_slot_ = -1;              // the slot of this call's first image token; -1: none
  mutable std::vector<int> row_ids_;  // row_ids' answer for one call
};

}  // namespace forge
