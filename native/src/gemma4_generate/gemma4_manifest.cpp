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

void token_params(const Manifest& m) {
  for (const char* key : {"image_token_id", "boi_token_id", "eoi_token_id", "pad_token_id"}) {
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

}  // namespace

void validate_gemma4_split_generate(const Manifest& m) {
  const Graph* vision = nullptr;
  for (const Context& c : m.contexts)
    for (const Graph& g : c.graphs) {
      if (g.role != gemma4::vision_role) continue;
      if (vision) m.fail(g.path + ".role", "a second vision graph (" + vision->path + " is the first); " + m.host_op + " encodes one image with one encoder");
      if (c.graphs.size() != 1) m.fail(c.path + ".graphs", "the vision context holds only the vision graph");
      vision = &g;
    }
  if (vision) {
    token_params(m);
    vision_graph(m, *vision);
  }
  for (const Context& c : m.contexts)
    for (const Graph& g : c.graphs)
      for (const GraphInput& in : g.inputs)
        if (in.bind == InputBind::encoder_output)
          m.fail(in.path + ".bind", "the soft tokens replace the image tokens' rows on the host; " + m.host_op + " binds no encoder-output input");
  validate_gemma4_decoder(m);
}

ImageReader gemma4_image_reader(const Manifest& m) {
  if (!gemma4_vision_graph(m)) m.fail("contexts", "no vision graph (role vision): this manifest reads no image");
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

}  // namespace forge
