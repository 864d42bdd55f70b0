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


}  // namespace

const Graph* gemma4_encoder_graph(const Manifest& m, const char* role) {
  for (const Context& c : m.contexts)
    if (const Graph* g = c.graph(role)) return g;
  return nullptr;
}

int gemma4_audio_tokens(const std::vector<uint8_t>& mask) {
  std::vector<uint8_t> m = mask;
  for (int conv = 0; conv < 2; conv++) {  // kernel 3, stride 2, pad 1: output t reads frame 2t
    std::vector<uint8_t> next;
    for (size_t t = 0; t < m.size(); t += 2) next.push_back(m[t]);
    m.swap(next);
  }
  return int(std::count(m.begin(), m.end(), uint8_t(1)));
}

void Gemma4Generate::bind(Encoder& e, Executor& executor, const char* role, const char* token_param) {
  e.graph = gemma4_encoder_graph(m_, role);
  if (!e.graph) return;
  // The validator has checked every parameter and shape read here.
  e.token_id = int(m_.host_op_numbers.at(token_param));
  const size_t ci = context_of(m_, e.graph);
  e.run = executor.bind(ci, size_t(e.graph - m_.contexts[ci].graphs.data()));
  const GraphOutput& out = e.graph->outputs.at(0);
  e.soft.assign(elements(out.shape), 0.0f);
  e.run->bind_output(out.name, e.soft.data(), out.shape);
}

Gemma4Generate::Gemma4Generate(const Manifest& manifest, Executor& executor) : DecoderGenerate(manifest, executor, gemma4_options(manifest)) {
  image_.what = "image", image_.flag = "--image";
  audio_.what = "audio clip", audio_.flag = "--audio";
  bind(image_, executor, gemma4::vision_role, "image_token_id");
  bind(audio_, executor, gemma4::audio_role, "audio_token_id");
  if (image_.graph || audio_.graph) pad_token_ = int(m_.host_op_numbers.at("pad_token_id"));
  if (image_.graph)
    for (const GraphInput& in : image_.graph->inputs) {
      if (in.dtype == "int32") {
        positions_.assign(elements(in.shape), 0);
        image_.run->bind_input(in.name, positions_.data(), in.shape);
      } else {
        pixels_.assign(elements(in.shape), 0.0f);
        image_.run->bind_input(in.name, pixels_.data(), in.shape);
      }
    }
  if (audio_.graph)
    for (const GraphInput& in : audio_.graph->inputs) {
      std::vector<float>& buf = in.shape.size() == 1 ? frame_mask_ : features_;  // the mask [F], the features [F, mel]
      buf.assign(elements(in.shape), 0.0f);
      audio_.run->bind_input(in.name, buf.data(), in.shape);
    }
}

Gemma4Generate::~Gemma4Generate() = default;

double Gemma4Generate::run_encoder(Encoder& e, int tokens) {
  auto t0 = Clock::now();
  e.run->run();
  const double ms = ms_since(t0);
  e.tokens = tokens;
  NonFiniteCount nf = count_non_finite(e.soft.data(), int64_t(tokens) * m_.hidden);
  if (nf.count)
    throw std::runtime_error(std::string("the ") + e.graph->role + " graph's soft tokens hold " + std::to_string(nf.count) + " NaN/Inf values (first at index " +
                             std::to_string(nf.first) + ")");
  return ms;
}

double Gemma4Generate::encode_image(const Pixels& px) {
  if (!image_.graph) throw std::runtime_error(m_.label + " has no vision graph (a text manifest of the bundle): it reads no image");
  const int64_t patches = int64_t(positions_.size() / 2), dim = int64_t(pixels_.size()) / std::max<int64_t>(patches, 1);
  if (px.patches != patches || px.patch_dim != dim || px.data.size() != pixels_.size() || px.positions.size() != positions_.size())
    throw std::runtime_error("the image's pixels are [" + std::to_string(px.patches) + ", " + std::to_string(px.patch_dim) + "] with " +
                             std::to_string(px.positions.size() / 2) + " positions; the vision graph " + image_.graph->name + " takes [" +
                             std::to_string(patches) + ", " + std::to_string(dim) + "] and as many positions");
  // The image's soft tokens: its real patches pooled k × k (the rows after them are padding).
  const int64_t real = std::count_if(px.positions.begin(), px.positions.end(), [](int32_t v) { return v >= 0; }) / 2;
  const int64_t pool = int64_t(m_.host_op_numbers.at("pooling_kernel_size"));
  std::memcpy(pixels_.data(), px.data.data(), pixels_.size() * sizeof(float));
  std::memcpy(positions_.data(), px.positions.data(), positions_.size() * sizeof(int32_t));
  return run_encoder(image_, int(real / (pool * pool)));
}

double Gemma4Generate::encode_audio(const AudioFeatures& f) {
  if (!audio_.graph) throw std::runtime_error(m_.label + " has no audio graph (a text manifest of the bundle, or one built without audio): it reads no audio");
  const int64_t frames = int64_t(frame_mask_.size()), mel = int64_t(features_.size()) / std::max<int64_t>(frames, 1);
  if (f.mel_bins != mel || f.frames > frames || int64_t(f.mask.size()) != f.frames)
    throw std::runtime_error("the clip's features are [" + std::to_string(f.frames) + ", " + std::to_string(f.mel_bins) + "]; the audio graph " + audio_.graph->name +
                             " takes at most " + std::to_string(frames) + " frames of " + std::to_string(mel) + " mel bins");
  // Padded to the graph's frames as HF pads a clip to the budget: zero features, mask 0.
  std::fill(features_.begin(), features_.end(), 0.0f);
  std::fill(frame_mask_.begin(), frame_mask_.end(), 0.0f);
  std::memcpy(features_.data(), f.data.data(), f.data.size() * sizeof(float));
  std::vector<uint8_t> mask(size_t(frames), 0);
  for (int64_t t = 0; t < f.frames; t++) frame_mask_[size_t(t)] = float(mask[size_t(t)] = f.mask[size_t(t)]);
  return run_encoder(audio_, gemma4_audio_tokens(mask));
}

void Gemma4Generate::find_run(Encoder& e, const std::vector<int>& prompt) const {
  e.slot = -1;
  if (!e.graph) return;  // a text manifest: its token is text to it (HF's text model would read it so too)
  auto first = std::find(prompt.begin(), prompt.end(), e.token_id);
  if (first == prompt.end()) return;
  const std::string tok = " tokens (id " + std::to_string(e.token_id) + ")";
  if (!e.tokens) throw std::runtime_error(std::string("the prompt holds ") + e.what + tok + " but no " + e.what + " was given to the encoder (qhx_generate " + e.flag + " FILE)");
  auto end = std::find_if(first, prompt.end(), [&](int id) { return id != e.token_id; });
  const int at = int(first - prompt.begin()), run = int(end - first);
  if (std::find(end, prompt.end(), e.token_id) != prompt.end())
    throw std::runtime_error(std::string("the prompt holds more than one run of ") + e.what + tok + "; " + m_.host_op + " encodes one " + e.what + " per prompt");
  if (run != e.tokens)
    throw std::runtime_error("prompt tokens " + std::to_string(at) + ".." + std::to_string(at + run - 1) + " are a run of " + std::to_string(run) + " " + e.what + tok +
                             "; the encoded " + e.what + " has " + std::to_string(e.tokens) + " soft tokens");
  e.slot = at;
}

GenerateResult Gemma4Generate::generate(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced) {
  find_run(image_, prompt);
  find_run(audio_, prompt);
  return DecoderGenerate::generate(prompt, opts, forced);
}

void Gemma4Generate::input_rows(int start, int valid, float* x) const {
  const size_t H = size_t(m_.hidden);
  for (const Encoder* e : {&image_, &audio_})
    for (int r = 0; r < valid; r++)
      if (e->holds(start + r)) std::memcpy(x + size_t(r) * H, e->soft.data() + size_t(start + r - e->slot) * H, H * sizeof(float));
}

const int* Gemma4Generate::row_ids(int start, int valid, const int* ids) const {
  bool any = false;
  for (int r = 0; r < valid && !any; r++) any = image_.holds(start + r) || audio_.holds(start + r);
  if (!any) return ids;
  row_ids_.assign(ids, ids + valid);
  for (int r = 0; r < valid; r++)
    if (image_.holds(start + r) || audio_.holds(start + r)) row_ids_[size_t(r)] = pad_token_;
  return row_ids_.data();
}

std::unique_ptr<Generator> make_gemma4_split_generate(const Manifest& m, Executor& exec) { return std::make_unique<Gemma4Generate>(m, exec); }

}  // namespace forge
