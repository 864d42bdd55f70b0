// qwen3_vl_generate's step: DecoderGenerate with its hooks (see qwen3_vl_generate.h).
#include "qwen3_vl_generate/qwen3_vl_generate.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "greedy_loop.h"

namespace forge {

MropePlan mrope_positions(const std::vector<int>& ids, int image_token, int grid_h, int grid_w) {
  MropePlan plan;
  const int L = int(ids.size()), T = grid_h * grid_w;
  plan.rows.reserve(ids.size());
  int p = 0;  // the running position
  for (int k = 0; k < L;) {
    if (ids[size_t(k)] != image_token) {
      plan.rows.push_back({p, p, p});
      p++, k++;
      continue;
    }
    int end = k;
    while (end < L && ids[size_t(end)] == image_token) end++;
    if (end - k != T)
      throw std::runtime_error("prompt tokens " + std::to_string(k) + ".." + std::to_string(end - 1) + " are a run of " + std::to_string(end - k) +
                               " image tokens (id " + std::to_string(image_token) + "); an image is " + std::to_string(grid_h) + "x" +
                               std::to_string(grid_w) + " = " + std::to_string(T) + " tokens, and images are separated by text");
    plan.images.push_back(k);
    for (int row = 0; row < grid_h; row++)
      for (int col = 0; col < grid_w; col++) plan.rows.push_back({p, p + row, p + col});
    p += std::max(grid_h, grid_w);
    k = end;
  }
  plan.next = p;
  return plan;
}

const Graph* qwen3_vl_vision_graph(const Manifest& m) {
  for (const Context& c : m.contexts)
    if (const Graph* g = c.graph(qwen3_vl::vision_role)) return g;
  return nullptr;
}

Qwen3VLGenerate::Qwen3VLGenerate(const Manifest& manifest, Executor& executor)
    : DecoderGenerate(manifest, executor), slot_positions_(size_t(manifest.max_context) * 3, 0) {
  // The validator has checked every parameter and shape read here.
  image_token_ = int(m_.host_op_numbers.at("image_token_id"));
  vision_ = qwen3_vl_vision_graph(m_);
  if (!vision_) return;  // a text manifest: DeepStack rows are zeros, positions t = h = w
  const int merge = int(m_.host_op_numbers.at("merge_size")), patch = int(m_.host_op_numbers.at("patch_size"));
  grid_h_ = int(m_.host_op_numbers.at("image_height")) / (patch * merge);
  grid_w_ = int(m_.host_op_numbers.at("image_width")) / (patch * merge);
  tokens_ = grid_h_ * grid_w_;
  const size_t ci = context_of(m_, vision_);
  vision_run_ = executor.bind(ci, size_t(vision_ - m_.contexts[ci].graphs.data()));
  const GraphInput& in = vision_->inputs.at(0);
  pixels_.assign(elements(in.shape), 0.0f);
  vision_run_->bind_input(in.name, pixels_.data(), in.shape);
  for (const GraphOutput& o : vision_->outputs) {
    std::vector<float>& f = features_[o.name];
    f.assign(elements(o.shape), 0.0f);
    vision_run_->bind_output(o.name, f.data(), o.shape);
  }
  embeds_ = &features_.at(qwen3_vl::image_embeds);
}

Qwen3VLGenerate::~Qwen3VLGenerate() = default;

double Qwen3VLGenerate::encode_image(const Pixels& px) {
  if (!vision_) throw std::runtime_error(m_.label + " has no vision graph (a text manifest of the bundle): it reads no image");
  const std::vector<int64_t>& shape = vision_->inputs.at(0).shape;
  if (px.patches != shape[0] || px.patch_dim != shape[1] || px.data.size() != pixels_.size())
    throw std::runtime_error("the image's pixels are [" + std::to_string(px.patches) + ", " + std::to_string(px.patch_dim) + "]; the vision graph " +
                             vision_->name + " takes " + shape_str(shape));
  std::memcpy(pixels_.data(), px.data.data(), pixels_.size() * sizeof(float));
  auto t0 = Clock::now();
  vision_run_->run();
  const double ms = ms_since(t0);
  for (const auto& [name, f] : features_) {
    NonFiniteCount nf = count_non_finite(f.data(), int64_t(f.size()));
    if (nf.count)
      throw std::runtime_error("the vision graph's " + name + " holds " + std::to_string(nf.count) + " NaN/Inf values (first at index " +
                               std::to_string(nf.first) + ")");
  }
  encoded_ = true;
  return ms;
}

GenerateResult Qwen3VLGenerate::generate(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced) {
  // A text manifest has no grid: any image token in its prompt is refused below, before the plan needs one.
  const bool has_image_tokens = std::find(prompt.begin(), prompt.end(), image_token_) != prompt.end();
  if (has_image_tokens && !vision_)
    throw std::runtime_error("the prompt holds image tokens (id " + std::to_string(image_token_) + ") but " + m_.label +
                             " has no vision graph (a text manifest of the bundle): give the image to the bundle's vision manifest");
  if (has_image_tokens && !encoded_)
    throw std::runtime_error("the prompt holds image tokens (id " + std::to_string(image_token_) + ") but no image was given to the encoder (qhx_generate --image FILE)");
  const MropePlan plan = mrope_positions(prompt, image_token_, grid_h_, grid_w_);
  if (plan.images.size() > 1)
    throw std::runtime_error("the prompt holds " + std::to_string(plan.images.size()) + " images (runs of " + std::to_string(tokens_) +
                             " image tokens); qwen3_vl_generate encodes one image per prompt");
  image_slot_ = plan.images.empty() ? -1 : plan.images[0];
  // Slot k holds prompt token k, then generated token k - L: its position continues from plan.next.
  const int C = m_.max_context, L = int(std::min(prompt.size(), size_t(C)));
  for (int k = 0; k < C; k++)
    for (int a = 0; a < 3; a++) slot_positions_[size_t(k) * 3 + size_t(a)] = k < L ? plan.rows[size_t(k)][size_t(a)] : plan.next + (k - L);
  return DecoderGenerate::generate(prompt, opts, forced);
}

void Qwen3VLGenerate::position_rows(int start, int n, int valid, int32_t* rows) const {
  const int C = m_.max_context;
  for (int r = 0; r < n; r++) {
    // Padding rows of a short prefill chunk (masked, never written to the caches) go on from the last real row.
    const int slot = std::min(start + std::min(r, valid - 1), C - 1), extra = std::max(0, r - valid + 1);
    for (int a = 0; a < 3; a++) rows[size_t(a) * size_t(n) + size_t(r)] = std::min(slot_positions_[size_t(slot) * 3 + size_t(a)] + extra, C - 1);
  }
}

void Qwen3VLGenerate::encoder_rows(const std::string& output, int start, int n, int valid, int64_t width, float* rows) const {
  std::fill(rows, rows + size_t(n) * size_t(width), 0.0f);
  if (image_slot_ < 0 || start + valid <= image_slot_ || start >= image_slot_ + tokens_) return;  // no image token in this call
  const std::vector<float>& f = features_.at(output);
  for (int r = 0; r < valid; r++) {
    const int at = start + r - image_slot_;
    if (at >= 0 && at < tokens_) std::memcpy(rows + size_t(r) * size_t(width), f.data() + size_t(at) * size_t(width), size_t(width) * sizeof(float));
  }
}

void Qwen3VLGenerate::input_rows(int start, int valid, float* x) const {
  if (image_slot_ < 0 || start + valid <= image_slot_ || start >= image_slot_ + tokens_) return;
  const size_t H = size_t(m_.hidden);
  for (int r = 0; r < valid; r++) {
    const int at = start + r - image_slot_;
    if (at >= 0 && at < tokens_) std::memcpy(x + size_t(r) * H, embeds_->data() + size_t(at) * H, H * sizeof(float));
  }
}

std::unique_ptr<Generator> make_qwen3_vl_generate(const Manifest& m, Executor& exec) { return std::make_unique<Qwen3VLGenerate>(m, exec); }

}  // namespace forge
