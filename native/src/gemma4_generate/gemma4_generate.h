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
// With its audio graph, a clip likewise: the feature extractor's log-mel frames padded to the graph's
// frames (mask 0 past the clip), its first T soft tokens (T = the processor's count: the frame mask
// through the two stride-2 subsampling convs) at <start_of_audio>, T audio tokens, <end_of_audio>.
// A manifest without an encoder's graph (a text-only bundle, or the bundle's text manifest) refuses
// that medium; one image and one clip per prompt at most.
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
constexpr const char* audio_role = "audio";
}  // namespace gemma4

void validate_gemma4_split_generate(const Manifest& m);
std::unique_ptr<Generator> make_gemma4_split_generate(const Manifest& m, Executor& exec);
/** HostOpSpec::image: HF's Gemma 4 image processor for the bundle's budget, and the image's block; refuses a manifest without the vision graph. */
ImageReader gemma4_image_reader(const Manifest& m);
/** HostOpSpec::audio: HF's Gemma 4 feature extractor, padded to the audio graph's frames, and the clip's block; refuses a manifest without the audio graph. */
AudioReader gemma4_audio_reader(const Manifest& m);
/** The graph of this role (vision, audio), or nullptr where the manifest leaves that encoder out. */
const Graph* gemma4_encoder_graph(const Manifest& m, const char* role);
/** Gemma4Processor's audio token count for a frame mask: the mask through the two stride-2 subsampling convs, counted. */
int gemma4_audio_tokens(const std::vector<uint8_t>& mask);

class Gemma4Generate final : public DecoderGenerate {
 public:
  Gemma4Generate(const Manifest& manifest, Executor& executor);
  ~Gemma4Generate() override;
  /** Finds the prompt's image and clip (one run of each token, as long as what was encoded), then the one loop. */
  GenerateResult generate(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced = {}) override;
  double encode_image(const Pixels& pixels) override;
  double encode_audio(const AudioFeatures& features) override;

 protected:
  void input_rows(int start, int valid, float* x) const override;
  const int* row_ids(int start, int valid, const int* ids) const override;

 private:
  /** A media encoder: its graph bound once to its inputs and its soft-token output. */
  struct Encoder {
    const char* what = "";                // "image", "audio clip"
    const char* flag = "";                // the qhx_generate option that gives one
    const Graph* graph = nullptr;         // null: the manifest leaves it out
    std::unique_ptr<GraphBinding> run;
    std::vector<float> soft;              // [rows, hidden]: the first `tokens` are the input's own
    int token_id = -1;                    // the prompt's token for one of its soft tokens
    int tokens = 0;                       // soft tokens of the last input encoded; 0: none
    int slot = -1;                        // this call's first such token; -1: none
    bool holds(int s) const { return slot >= 0 && s >= slot && s < slot + tokens; }
  };
  void bind(Encoder& e, Executor& executor, const char* role, const char* token_param);
  double run_encoder(Encoder& e, int tokens);
  void find_run(Encoder& e, const std::vector<int>& prompt) const;

  int pad_token_ = -1;
  Encoder image_, audio_;
  std::vector<float> pixels_, features_, frame_mask_;  // the encoders' inputs, bound once
  std::vector<int32_t> positions_;
  mutable std::vector<int> row_ids_;  // row_ids' answer for one call
};

}  // namespace forge
