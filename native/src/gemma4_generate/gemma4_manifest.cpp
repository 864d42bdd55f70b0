// The manifest rules of gemma4_split_generate: what its step (gemma4_generate.cpp) runs, and nothing
// else, each refusal naming the field path. Besides the decoder's rules (decoder_manifest.cpp,
// validate_gemma4_decoder: parts over every layer, token host-rows, ring and shared caches, the
// scales), with a vision graph:
//   hostOpParams  image_token_id, boi_token_id, eoi_token_id, pad_token_id: ids in the vocabulary;
//                 max_soft_tokens (one of HF's budgets), patch_size, pooling_kernel_size;
//   vision        one graph of role `vision`, alone in its context, no layers: two pixels inputs,
//                 float32 [P, 3 · patch²] (the patches) and int32 [P, 2] (their (x, y)), P =
//                 max_soft_tokens · pooling²; one encoder-output output float32 [max_soft_tokens,
//                 model.hidden] (the soft tokens); no graph reads it (its rows replace the image
//                 tokens' embedding rows on the host).
// With an audio graph:
//   hostOpParams  audio_token_id, boa_token_id, eoa_token_id, pad_token_id: ids in the vocabulary;
//                 audio_max_seconds (the longest clip, a positive number up to HF's 30 s);
//   audio         one graph of role `audio`, alone in its context, no layers: two audio-features
//                 inputs, float32 [F, mel] (log-mel frames) and float32 [F] (their mask); one
//                 encoder-output output float32 [⌈⌈F/2⌉/2⌉, model.hidden] (the soft tokens).
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "gemma4_generate/gemma4_generate.h"
#include "gemma4_image.h"

namespace forge {
namespace {

Gemma4ImageSpec image_spec(const Manifest& m) {
  Gemma4ImageSpec s{host_op_integer(m, "max_soft_tokens", 1), host_op_integer(m, "patch_size", 1), host_op_integer(m, "pooling_kernel_size", 1)};
  try {
    validate_gemma4_image_spec(s);
  } catch (const std::exception& e) {
    m.fail("hostOpParams", e.what());
  }
  return s;
}

void token_params(const Manifest& m, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    const int id = host_op_integer(m, key, 0);
    if (id >= m.vocab) m.fail(std::string("hostOpParams.") + key, std::to_string(id) + " is past model.vocab " + std::to_string(m.vocab));
  }
}

void vision_graph(const Manifest& m, const Graph& g) {
  const Gemma4ImageSpec s = image_spec(m);
  const int64_t P = int64_t(s.max_soft_tokens) * s.pooling * s.pooling, dim = int64_t(3) * s.patch * s.patch;
  if (g.layers) m.fail(g.path + ".layers", "the vision graph is not a decoder shard");
  if (g.tokens != P) m.fail(g.path + ".tokens", std::to_string(g.tokens) + " must be the budget's " + std::to_string(P) + " patches (max_soft_tokens · pooling²)");
  bool values = false, positions = false;
  for (const GraphInput& in : g.inputs) {
    if (in.bind != InputBind::pixels) m.fail(in.path + ".bind", "the vision graph takes pixels inputs only, not " + std::string(bind_name(in.bind)));
    const bool is_positions = in.dtype == "int32";
    if (!is_positions && in.dtype != "float32") m.fail(in.path + ".dtype", "'" + in.dtype + "': the patches are float32, their positions int32");
    const std::vector<int64_t> want = is_positions ? std::vector<int64_t>{P, 2} : std::vector<int64_t>{P, dim};
    if (in.shape != want)
      m.fail(in.path + ".shape", shape_str(in.shape) + " must be " + shape_str(want) + (is_positions ? " ((x, y) of each patch)" : " (3 · patch² values per patch)"));
    if ((is_positions ? positions : values)) m.fail(in.path, std::string("a second ") + (is_positions ? "positions" : "patches") + " input");
    (is_positions ? positions : values) = true;
  }
  if (!values || !positions) m.fail(g.path + ".inputs", "the vision graph takes the patches (float32) and their positions (int32)");
  if (g.outputs.size() != 1 || g.outputs[0].bind != OutputBind::encoder_output)
    m.fail(g.path + ".outputs", "the vision graph gives exactly one encoder-output output (the soft tokens)");
  const GraphOutput& o = g.outputs[0];
  const std::vector<int64_t> rows{s.max_soft_tokens, m.hidden};
  if (o.dtype != "float32") m.fail(o.path + ".dtype", "'" + o.dtype + "' must be float32");
  if (o.shape != rows) m.fail(o.path + ".shape", shape_str(o.shape) + " must be [max_soft_tokens, model.hidden] = " + shape_str(rows));
}

void audio_graph(const Manifest& m, const Graph& g) {
  auto seconds = m.host_op_numbers.find("audio_max_seconds");
  if (seconds == m.host_op_numbers.end() || !(seconds->second > 0) || seconds->second > 30)
    m.fail("hostOpParams.audio_max_seconds", m.host_op + " needs the longest clip in seconds here (more than 0, at most 30)");
  if (g.layers) m.fail(g.path + ".layers", "the audio graph is not a decoder shard");
  if (g.inputs.size() != 2) m.fail(g.path + ".inputs", "the audio graph takes the clip's log-mel frames and their mask");
  int64_t frames = -1;
  for (const GraphInput& in : g.inputs) {
    if (in.bind != InputBind::audio_features) m.fail(in.path + ".bind", "the audio graph takes audio-features inputs only, not " + std::string(bind_name(in.bind)));
    if (in.dtype != "float32") m.fail(in.path + ".dtype", "'" + in.dtype + "' must be float32");
    if (in.shape.empty() || in.shape.size() > 2) m.fail(in.path + ".shape", shape_str(in.shape) + " must be [frames, mel bins] or [frames] (the mask)");
    if (frames >= 0 && in.shape[0] != frames) m.fail(in.path + ".shape", shape_str(in.shape) + ": the features and the mask have one row per frame");
    frames = in.shape[0];
  }
  if (g.inputs[0].shape.size() == g.inputs[1].shape.size()) m.fail(g.path + ".inputs", "the audio graph takes one [frames, mel bins] input and one [frames] mask");
  if (g.outputs.size() != 1 || g.outputs[0].bind != OutputBind::encoder_output)
    m.fail(g.path + ".outputs", "the audio graph gives exactly one encoder-output output (the soft tokens)");
  const GraphOutput& o = g.outputs[0];
  const std::vector<int64_t> rows{((frames + 1) / 2 + 1) / 2, m.hidden};
  if (o.dtype != "float32") m.fail(o.path + ".dtype", "'" + o.dtype + "' must be float32");
  if (o.shape != rows) m.fail(o.path + ".shape", shape_str(o.shape) + " must be [⌈⌈frames/2⌉/2⌉, model.hidden] = " + shape_str(rows));
}

/** The one graph of this role, alone in its context, or nullptr. */
const Graph* encoder(const Manifest& m, const char* role) {
  const Graph* found = nullptr;
  for (const Context& c : m.contexts)
    for (const Graph& g : c.graphs) {
      if (g.role != role) continue;
      if (found) m.fail(g.path + ".role", "a second " + std::string(role) + " graph (" + found->path + " is the first); " + m.host_op + " runs one");
      if (c.graphs.size() != 1) m.fail(c.path + ".graphs", "the " + std::string(role) + " context holds only the " + role + " graph");
      found = &g;
    }
  return found;
}

}  // namespace

void validate_gemma4_split_generate(const Manifest& m) {
  if (const Graph* vision = encoder(m, gemma4::vision_role)) {
    token_params(m, {"image_token_id", "boi_token_id", "eoi_token_id", "pad_token_id"});
    vision_graph(m, *vision);
  }
  if (const Graph* audio = encoder(m, gemma4::audio_role)) {
    token_params(m, {"audio_token_id", "boa_token_id", "eoa_token_id", "pad_token_id"});
    audio_graph(m, *audio);
  }
  for (const Context& c : m.contexts)
    for (const Graph& g : c.graphs)
      for (const GraphInput& in : g.inputs)
        if (in.bind == InputBind::encoder_output)
          m.fail(in.path + ".bind", "the soft tokens replace the image tokens' rows on the host; " + m.host_op + " binds no encoder-output input");
  validate_gemma4_decoder(m);
}

ImageReader gemma4_image_reader(const Manifest& m) {
  if (!gemma4_encoder_graph(m, gemma4::vision_role)) m.fail("contexts", "no vision graph (role vision): this manifest reads no image");
  const Gemma4ImageSpec spec = image_spec(m);
  const int image = int(m.host_op_numbers.at("image_token_id")), boi = int(m.host_op_numbers.at("boi_token_id")),
            eoi = int(m.host_op_numbers.at("eoi_token_id"));
  return [spec, image, boi, eoi](const std::string& path) {
    Gemma4Pixels g = preprocess_gemma4_image(path, spec);
    ImagePrompt p;
    p.pixels = Pixels{std::move(g.pixel_values), g.patches, g.patch_dim, g.grid_h, g.grid_w, g.decode_ms, g.resize_ms, g.patchify_ms, std::move(g.positions)};
    p.image_token = image;
    p.tokens = g.soft_tokens;
    p.block.push_back(boi);
    p.block.insert(p.block.end(), size_t(g.soft_tokens), image);
    p.block.push_back(eoi);
    return p;
  };
}

AudioReader gemma4_audio_reader(const Manifest& m) {
  const Graph* g = gemma4_encoder_graph(m, gemma4::audio_role);
  if (!g) m.fail("contexts", "no audio graph (role audio): this manifest reads no audio");
  AudioFrontEndConfig config;  // Gemma4AudioFeatureExtractor's defaults
  const double seconds = m.host_op_numbers.at("audio_max_seconds");
  const int64_t budget = int64_t(std::llround(seconds * config.sampling_rate));
  const int audio = int(m.host_op_numbers.at("audio_token_id")), boa = int(m.host_op_numbers.at("boa_token_id")),
            eoa = int(m.host_op_numbers.at("eoa_token_id"));
  config.max_length = 0;  // the budget is checked below, in the words of the bundle's setting
  return [config, seconds, budget, audio, boa, eoa](const std::string& path) {
    AudioPrompt p;
    p.features = load_audio_features(path, config);
    if (p.features.samples > budget)
      throw std::runtime_error(path + ": the clip is " + std::to_string(double(p.features.samples) / config.sampling_rate) + " s (" + std::to_string(p.features.samples) +
                               " samples at " + std::to_string(config.sampling_rate) + " Hz), longer than the bundle's audio budget of " + std::to_string(seconds) + " s");
    p.tokens = gemma4_audio_tokens(p.features.mask);
    if (!p.tokens) throw std::runtime_error(path + ": the clip is too short for one audio token");
    p.audio_token = audio;
    p.block.push_back(boa);
    p.block.insert(p.block.end(), size_t(p.tokens), audio);
    p.block.push_back(eoa);
    return p;
  };
}

}  // namespace forge
