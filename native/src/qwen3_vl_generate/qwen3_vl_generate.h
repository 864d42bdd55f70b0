// qwen3_vl_generate: Qwen3-VL, an image and a prompt → greedy tokens. It is DecoderGenerate's step
// (the dense decoder, batched prefill in chunks, the one greedy loop) with three things fed
// differently through its hooks, and the vision graph run once per image before the prompt:
//   - positions [3, N] (interleaved multimodal RoPE, rows t, h, w). The cache slot of prompt token k
//     is k (state rows written at slots, the mask over slots, as every decoder), but its RoPE
//     position follows HF's get_rope_index: a text token gets (p, p, p), p running; the T tokens of
//     an image of merged grid gh × gw, entered at running position s, get (s, s + row, s + col) in
//     raster order, and p resumes at s + max(gh, gw); generated tokens continue from there (HF's
//     cache position + rope_delta);
//   - the residual rows of the image tokens are the encoder's `image_embeds` rows instead of the
//     embedding table's;
//   - each DeepStack input (encoder-output {component, output: deepstack_i}) gets the encoder's
//     `deepstack_i` rows at the call's image tokens, zeros at every other token (prefill chunks and
//     decode steps alike; generated tokens get zeros).
// A manifest without the vision graph (the bundle's text manifest: same shards, DeepStack inputs
// still bound to the absent component) runs as a text model: zeros for DeepStack, t = h = w.
//
// What it runs is what validate_qwen3_vl_generate (qwen3_vl_manifest.cpp) admits.
#pragma once
#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "decoder_generate.h"
#include "executor.h"
#include "host_op.h"
#include "image_input.h"
#include "manifest.h"

namespace forge {

/** The vision graph's role, and the output whose rows replace the image tokens' embedding rows. */
namespace qwen3_vl {
constexpr const char* vision_role = "vision";
constexpr const char* image_embeds = "image_embeds";
}  // namespace qwen3_vl

void validate_qwen3_vl_generate(const Manifest& m);
std::unique_ptr<Generator> make_qwen3_vl_generate(const Manifest& m, Executor& exec);
/** HostOpSpec::image: the pre-processing and prompt block from hostOpParams; refuses a manifest without the vision graph. */
ImageReader qwen3_vl_image_reader(const Manifest& m);
/** The vision graph (role `vision`), or nullptr in a text manifest. */
const Graph* qwen3_vl_vision_graph(const Manifest& m);

/** The multimodal RoPE positions of a prompt, as HF's get_rope_index gives them. */
struct MropePlan {
  std::vector<std::array<int, 3>> rows;  // (t, h, w) of each prompt token
  std::vector<int> images;               // prompt index of each image's first token
  int next = 0;                          // the position of the token after the prompt: generated token j (0-based) gets next + j on all three rows
};
/**
 * Every maximal run of `image_token` in `ids` is one image of merged grid grid_h × grid_w (HF groups
 * consecutive image tokens into one image); a run of another length is refused, naming where it is.
 */
MropePlan mrope_positions(const std::vector<int>& ids, int image_token, int grid_h, int grid_w);

class Qwen3VLGenerate final : public DecoderGenerate {
 public:
  Qwen3VLGenerate(const Manifest& manifest, Executor& executor);
  ~Qwen3VLGenerate() override;
  /** Plans the prompt's positions and image slots, then the one loop. */
  GenerateResult generate(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced = {}) override;
  double encode_image(const Pixels& pixels) override;

 protected:
  void position_rows(int start, int n, int valid, int32_t* rows) const override;
  void encoder_rows(const std::string& output, int start, int n, int valid, int64_t width, float* rows) const override;
  void input_rows(int start, int valid, float* x) const override;

 private:
  int image_token_ = -1, grid_h_ = 0, grid_w_ = 0, tokens_ = 0;  // the merged grid and its tokens (T = grid_h · grid_w)
  const Graph* vision_ = nullptr;
  std::unique_ptr<GraphBinding> vision_run_;
  std::vector<float> pixels_;                         // the vision graph's input, bound once
  std::map<std::string, std::vector<float>> features_;  // its outputs [T, hidden] by name, bound once
  const std::vector<float>* embeds_ = nullptr;       // features_'s image_embeds
  bool encoded_ = false;                             // an image went through the encoder
  std::vector<int32_t> slot_positions_;              // [maxContext][3]: (t, h, w) of the token at each cache slot, this call
  int image_slot_ = -1;                              // the slot of this call's first image token; -1: none
};

}  // namespace forge
