// The manifest rules of qwen3_vl_generate: what its step (qwen3_vl_generate.cpp) runs, and nothing
// else, each refusal naming the field path. Besides the decoder's rules (decoder_manifest.cpp,
// validate_qwen3_vl_decoder: dense shards with positions [3, N] and float32 [1, N, hidden]
// encoder-output inputs, an lm-head):
//   hostOpParams  image_token_id, vision_start_token_id, vision_end_token_id: ids in the vocabulary;
//                 mrope_section "t,h,w": three counts summing to half the KV caches' head size;
//                 with a vision graph also image_height, image_width, patch_size,
//                 temporal_patch_size, merge_size (positive integers, the size a multiple of
//                 patch · merge) and image_mean, image_std (three numbers each, std > 0);
//   vision        at most one graph of role `vision`, alone in its context, no layers: one pixels
//                 input float32 [patches, 3 · temporal · patch²] with tokens = patches =
//                 (height / patch) · (width / patch); encoder-output outputs float32 [T, hidden],
//                 T = patches / merge², one of them `image_embeds`;
//   DeepStack     every encoder-output input names `output`; with the vision graph there, its
//                 component and one of its outputs other than image_embeds (whose rows are the
//                 residual's), and each of its other outputs is read by the prefill and decode graphs;
//                 without it (a text manifest) they all name one component, fed zeros.
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "qwen3_vl_generate/qwen3_vl_generate.h"

namespace forge {
namespace {

/** "a,b,c" in hostOpParams: `n` numbers. */
std::vector<double> list_param(const Manifest& m, const std::string& key, size_t n) {
  auto it = m.host_op_strings.find(key);
  if (it == m.host_op_strings.end()) m.fail("hostOpParams." + key, m.host_op + " needs a string of " + std::to_string(n) + " comma-separated numbers here");
  std::vector<double> out;
  std::stringstream ss(it->second);
  std::string part;
  while (std::getline(ss, part, ',')) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || part.find_first_not_of(" ", used) != std::string::npos || !std::isfinite(v))
      m.fail("hostOpParams." + key, "'" + it->second + "': '" + part + "' is not a number");
    out.push_back(v);
  }
  if (out.size() != n || (!it->second.empty() && it->second.back() == ','))
    m.fail("hostOpParams." + key, "'" + it->second + "' must be " + std::to_string(n) + " comma-separated numbers");
  return out;
}

ImageSpec image_spec(const Manifest& m) {
  ImageSpec s{};
  s.height = host_op_integer(m, "image_height", 1);
  s.width = host_op_integer(m, "image_width", 1);
  s.patch = host_op_integer(m, "patch_size", 1);
  s.temporal = host_op_integer(m, "temporal_patch_size", 1);
  s.merge = host_op_integer(m, "merge_size", 1);
  std::vector<double> mean = list_param(m, "image_mean", 3), std = list_param(m, "image_std", 3);
  for (int c = 0; c < 3; c++) {
    s.mean[c] = float(mean[size_t(c)]);
    s.std[c] = float(std[size_t(c)]);
  }
  try {
    validate_image_spec(s);
  } catch (const std::exception& e) {
    m.fail("hostOpParams", e.what());
  }
  return s;
}

void token_params(const Manifest& m) {
  for (const char* key : {"image_token_id", "vision_start_token_id", "vision_end_token_id"}) {
    int id = host_op_integer(m, key, 0);
    if (id >= m.vocab) m.fail(std::string("hostOpParams.") + key, std::to_string(id) + " is past model.vocab " + std::to_string(m.vocab));
  }
  std::vector<double> section = list_param(m, "mrope_section", 3);
  double sum = 0;
  for (double v : section) {
    if (v < 0 || v != std::floor(v)) m.fail("hostOpParams.mrope_section", "'" + m.host_op_strings.at("mrope_section") + "' must be three counts");
    sum += v;
  }
  // The graphs hold the interleaving; the host checks the bundle is the one it describes.
  for (const StateSpec& s : m.state)
    if (s.kind == StateKind::kv_cache && double(s.shape.back()) != 2 * sum)
      m.fail("hostOpParams.mrope_section", "'" + m.host_op_strings.at("mrope_section") + "' sums to " + std::to_string(int(sum)) +
                                               ", not half the head size " + std::to_string(s.shape.back()) + " of state '" + s.name + "'");
}

/** The vision graph against hostOpParams' image: what the host feeds it and reads from it. */
void vision_graph(const Manifest& m, const Graph& g) {
  const ImageSpec s = image_spec(m);
  const int64_t patches = int64_t(s.height / s.patch) * (s.width / s.patch), dim = int64_t(3) * s.temporal * s.patch * s.patch;
  const int64_t T = patches / (int64_t(s.merge) * s.merge);
  if (g.layers) m.fail(g.path + ".layers", "the vision graph is not a decoder shard");
  if (g.inputs.size() != 1 || g.inputs[0].bind != InputBind::pixels) m.fail(g.path + ".inputs", "the vision graph takes exactly one pixels input");
  const GraphInput& in = g.inputs[0];
  const std::vector<int64_t> want{patches, dim};
  if (in.dtype != "float32") m.fail(in.path + ".dtype", "'" + in.dtype + "' must be float32");
  if (in.shape != want)
    m.fail(in.path + ".shape", shape_str(in.shape) + " must be [patches, 3 · temporal · patch²] = " + shape_str(want) + " for a " +
                                   std::to_string(s.height) + "x" + std::to_string(s.width) + " image (hostOpParams)");
  if (g.tokens != patches) m.fail(g.path + ".tokens", std::to_string(g.tokens) + " must be the image's " + std::to_string(patches) + " patches");
  bool embeds = false;
  for (const GraphOutput& o : g.outputs) {
    if (o.bind != OutputBind::encoder_output) m.fail(o.path + ".bind", "the vision graph gives encoder-output outputs only, not " + std::string(bind_name(o.bind)));
    const std::vector<int64_t> rows{T, m.hidden};
    if (o.dtype != "float32") m.fail(o.path + ".dtype", "'" + o.dtype + "' must be float32");
    if (o.shape != rows) m.fail(o.path + ".shape", shape_str(o.shape) + " must be [image tokens, model.hidden] = " + shape_str(rows));
    embeds |= o.name == qwen3_vl::image_embeds;
  }
  if (!embeds) m.fail(g.path + ".outputs", std::string("the vision graph needs an output named ") + qwen3_vl::image_embeds + " (the image tokens' residual rows)");
}

}  // namespace

void validate_qwen3_vl_generate(const Manifest& m) {
  token_params(m);
  const Graph* vision = nullptr;
  for (const Context& c : m.contexts)
    for (const Graph& g : c.graphs) {
      if (g.role != qwen3_vl::vision_role) continue;
      if (vision) m.fail(g.path + ".role", "a second vision graph (" + vision->path + " is the first); " + m.host_op + " encodes one image with one encoder");
      if (c.graphs.size() != 1) m.fail(c.path + ".graphs", "the vision context holds only the vision graph");
      vision = &g;
    }
  if (vision) vision_graph(m, *vision);
  std::string component;  // the DeepStack inputs' component, when there is no vision graph
  for (const Context& c : m.contexts)
    for (const Graph& g : c.graphs)
      for (const GraphInput& in : g.inputs) {
        if (in.bind != InputBind::encoder_output) continue;
        if (in.output.empty()) m.fail(in.path, "an encoder-output input of " + m.host_op + " names the encoder's `output` it takes");
        if (vision) {
          if (in.component != vision->component)
            m.fail(in.path + ".component", "'" + in.component + "' is not the vision graph's component '" + vision->component + "'");
          if (in.output == qwen3_vl::image_embeds)
            m.fail(in.path + ".output", std::string(qwen3_vl::image_embeds) + " rows replace the image tokens' embedding rows; a graph does not bind them");
        } else {
          if (component.empty()) component = in.component;
          if (in.component != component) m.fail(in.path + ".component", "'" + in.component + "' where the other encoder-output inputs name '" + component + "'");
        }
      }
  // Every encoder output but image_embeds is some shard's input, in each variant (else the host would drop it).
  if (vision) {
    std::map<std::string, std::set<std::string>> read;  // role → outputs its graphs read
    for (const Context& c : m.contexts)
      for (const Graph& g : c.graphs) {
        if (g.role != role::prefill && g.role != role::decode) continue;
        auto& r = read[g.role];
        for (const GraphInput& in : g.inputs)
          if (in.bind == InputBind::encoder_output) r.insert(in.output);
      }
    for (const auto& [role_name, outputs] : read)
      for (const GraphOutput& o : vision->outputs)
        if (o.name != qwen3_vl::image_embeds && !outputs.count(o.name))
          m.fail(o.path + ".name", "'" + o.name + "' is read by no " + role_name + " graph: each DeepStack feature is a shard's input (encoder-output {output})");
  }
  validate_qwen3_vl_decoder(m);
}

ImageReader qwen3_vl_image_reader(const Manifest& m) {
  if (!qwen3_vl_vision_graph(m))
    m.fail("contexts", "no vision graph (role vision): this is a text manifest of the bundle, it reads no image");
  const ImageSpec spec = image_spec(m);
  std::vector<int> block;
  const int image_token = int(m.host_op_numbers.at("image_token_id"));
  const int tokens = (spec.height / (spec.patch * spec.merge)) * (spec.width / (spec.patch * spec.merge));
  block.push_back(int(m.host_op_numbers.at("vision_start_token_id")));
  block.insert(block.end(), size_t(tokens), image_token);
  block.push_back(int(m.host_op_numbers.at("vision_end_token_id")));
  return [spec, block, image_token, tokens](const std::string& path) { return ImagePrompt{preprocess_image(path, spec), block, image_token, tokens}; };
}

}  // namespace forge
