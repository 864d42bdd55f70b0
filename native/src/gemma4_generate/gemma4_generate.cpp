// gemma4_split_generate's step: DecoderGenerate with Gemma 4's scales and, with its vision graph,
// the image hooks (see gemma4_generate.h).
#include "gemma4_generate/gemma4_generate.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "greedy_loop.h"

namespace forge {
namespace {

// The tables hold the checkpoint's rows; HF scales the token embedding by √hidden and the per-layer
// rows by √P (hostOpParams, checked by the validator), which the host applies as it feeds them.
DecoderOptions gemma4_options(const Manifest& m) {
  DecoderOptions o;
  o.embed_scale = float(m.host_op_numbers.at("embed_scale"));
  o.row_scale["embedding"] = o.embed_scale;
  o.row_scale["per-layer-embedding"] = float(m.host_op_numbers.at("per_layer_embed_scale"));
  return o;
}

size_t context_of(const Manifest& m, const Graph* g) {
  for (size_t ci = 0; ci < m.contexts.size(); ci++)
    if (!m.contexts[ci].graphs.empty() && g >= m.contexts[ci].graphs.data() && g < m.contexts[ci].graphs.data() + m.contexts[ci].graphs.size()) return ci;
  throw std::logic_error("graph is not in the manifest");
}

}  // namespace

const Graph* gemma4_vision_graph(const Manifest& m) {
  for (const Context& c : m.contexts)
    if (const Graph* g = c.graph(gemma4::vision_role)) return g;
  return nullptr;
}

Gemma4Generate::Gemma4Generate(const Manifest& manifest, Executor& executor) : DecoderGenerate(manifest, executor, gemma4_options(manifest)) {
  vision_ = gemma4_vision_graph(m_);
  if (!vision_) return;  // text only
  // The validator has checked every parameter and shape read here.
  image_token_ = int(m_.host_op_numbers.at("image_token_id"));
  pad_token_ = int(m_.host_op_numbers.at("pad_token_id"));
  const size_t ci = context_of(m_, vision_);
  vision_run_ = executor.bind(ci, size_t(vision_ - m_.contexts[ci].graphs.data()));
  for (const GraphInput& in : vision_->inputs) {
    if (in.dtype == "int32") {
      positions_.assign(elements(in.shape), 0);
      vision_run_->bind_input(in.name, positions_.data(), in.shape);
    } else {
      pixels_.assign(elements(in.shape), 0.0f);
      vision_run_->bind_input(in.name, pixels_.data(), in.shape);
    }
  }
  const GraphOutput& out = vision_->outputs.at(0);
  soft_.assign(elements(out.shape), 0.0f);
  vision_run_->bind_output(out.name, soft_.data(), out.shape);
}

Gemma4Generate::~Gemma4Generate() = default;

double Gemma4Generate::encode_image(const Pixels& px) {
  if (!vision_) throw std::runtime_error(m_.label + " has no vision graph (a text manifest of the bundle): it reads no image");
  const int64_t patches = int64_t(positions_.size() / 2), dim = int64_t(pixels_.size()) / std::max<int64_t>(patches, 1);
  if (px.patches != patches || px.patch_dim != dim || px.data.size() != pixels_.size() || px.positions.size() != positions_.size())
    throw std::runtime_error("the image's pixels are [" + std::to_string(px.patches) + ", " + std::to_string(px.patch_dim) + "] with " +
                             std::to_string(px.positions.size() / 2) + " positions; the vision graph " + vision_->name + " takes [" +
                             std::to_string(patches) + ", " + std::to_string(dim) + "] and as many positions");
  // The image's soft tokens: its real patches pooled k × k (the rows after them are padding).
  const int64_t real = std::count_if(px.positions.begin(), px.positions.end(), [](int32_t v) { return v >= 0; }) / 2;
  const int64_t pool = int64_t(m_.host_op_numbers.at("pooling_kernel_size"));
  std::memcpy(pixels_.data(), px.data.data(), pixels_.size() * sizeof(float));
  std::memcpy(positions_.data(), px.positions.data(), positions_.size() * sizeof(int32_t));
  auto t0 = Clock::now();
  vision_run_->run();
  const double ms = ms_since(t0);
  tokens_ = int(real / (pool * pool));
  NonFiniteCount nf = count_non_finite(soft_.data(), int64_t(tokens_) * m_.hidden);
  if (nf.count)
    throw std::runtime_error("the vision graph's soft tokens hold " + std::to_string(nf.count) + " NaN/Inf values (first at index " + std::to_string(nf.first) + ")");
  return ms;
}

GenerateResult Gemma4Generate::generate(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced) {
  image_slot_ = -1;
  if (vision_) {
    auto first = std::find(prompt.begin(), prompt.end(), image_token_);
    if (first != prompt.end()) {
      if (!tokens_) throw std::runtime_error("the prompt holds image tokens (id " + std::to_string(image_token_) + ") but no image was given to the encoder (qhx_generate --image FILE)");
      auto end = std::find_if(first, prompt.end(), [&](int id) { return id != image_token_; });
      const int at = int(first - prompt.begin()), run = int(end - first);
      if (std::find(end, prompt.end(), image_token_) != prompt.end())
        throw std::runtime_error("the prompt holds more than one run of image tokens (id " + std::to_string(image_token_) + "); " + m_.host_op + " encodes one image per prompt");
      if (run != tokens_)
        throw std::runtime_error("prompt tokens " + std::to_string(at) + ".." + std::to_string(at + run - 1) + " are a run of " + std::to_string(run) +
                                 " image tokens (id " + std::to_string(image_token_) + "); the encoded image has " + std::to_string(tokens_) + " soft tokens");
      image_slot_ = at;
    }
  }
  return DecoderGenerate::generate(prompt, opts, forced);
}

void Gemma4Generate::input_rows(int start, int valid, float* x) const {
  const size_t H = size_t(m_.hidden);
  for (int r = 0; r < valid; r++)
    if (image_slot(start + r)) std::memcpy(x + size_t(r) * H, soft_.data() + size_t(start + r - image_slot_) * H, H * sizeof(float));
}

const int* Gemma4Generate::row_ids(int start, int valid, const int* ids) const {
  if (image_slot_ < 0 || start + valid <= image_slot_ || start >= image_slot_ + tokens_) return ids;
  row_ids_.assign(ids, ids + valid);
  for (int r = 0; r < valid; r++)
    if (image_slot(start + r)) row_ids_[size_t(r)] = pad_token_;
  return row_ids_.data();
}

std::unique_ptr<Generator> make_gemma4_split_generate(const Manifest& m, Executor& exec) { return std::make_unique<Gemma4Generate>(m, exec); }

}  // namespace forge
