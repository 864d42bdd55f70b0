// The built-in host-ops. An explicit list, not self-registration from static initialisers: a static
// library drops object files nothing refers to, and their registrations with them.
#include <cmath>
#include <iterator>
#include <sstream>

#include "decoder_generate.h"
#include "gemma4_generate/gemma4_generate.h"
#include "host_op.h"
#include "phimoe_generate/phimoe_generate.h"
#include "qwen3_vl_generate/qwen3_vl_generate.h"

namespace forge {
namespace {

// One decode loop (greedy_loop.h) serves all; each host-op gives its step and a validator admitting what it runs.
const HostOpSpec kHostOps[] = {
    {"decoder_generate", validate_decoder_generate, make_decoder_generate, nullptr, nullptr, false},
    {"qwen3_5_generate", validate_qwen3_5_generate, make_decoder_generate, nullptr, nullptr, false},
    // Gemma 4: the same step with host rows (PLE), ring and shared caches, scales from hostOpParams;
    // an image's and a clip's soft tokens at their tokens. Its text manifest is the same without the encoders.
    {"gemma4_split_generate", validate_gemma4_split_generate, make_gemma4_split_generate, gemma4_image_reader, gemma4_audio_reader, false},
    // PhiMoE: its own step (attention+router, host top-2, shared experts graph) in the same loop.
    {"phimoe_generate", validate_phimoe_generate, make_phimoe_generate, nullptr, nullptr, false},
    // Qwen3-VL: the decoder step with multimodal RoPE positions, the vision encoder's rows at the
    // image tokens (residual and DeepStack inputs); its text manifest runs without the encoder.
    {"qwen3_vl_generate", validate_qwen3_vl_generate, make_qwen3_vl_generate, qwen3_vl_image_reader, nullptr, true},
};

}  // namespace

const HostOpSpec* find_host_op(const std::string& name) {
  for (const HostOpSpec& h : kHostOps)
    if (name == h.name) return &h;
  return nullptr;
}

std::vector<std::string> host_op_names() {
  std::vector<std::string> out;
  for (const HostOpSpec& h : kHostOps) out.push_back(h.name);
  return out;
}

double Generator::encode_image(const Pixels&) { throw std::runtime_error("this host-op reads no image"); }
double Generator::encode_audio(const AudioFeatures&) { throw std::runtime_error("this host-op reads no audio"); }

std::unique_ptr<Generator> make_generator(const Manifest& m, Executor& exec) {
  const HostOpSpec* h = find_host_op(m.host_op);
  if (!h) m.fail("hostOp", "'" + m.host_op + "' is not a registered host-op");
  return h->make(m, exec);
}

int host_op_integer(const Manifest& m, const std::string& key, int min) {
  auto it = m.host_op_numbers.find(key);
  if (it == m.host_op_numbers.end()) {
    if (m.host_op_strings.count(key)) m.fail("hostOpParams." + key, "expected a number, not a string");
    m.fail("hostOpParams." + key, m.host_op + " needs an integer here");
  }
  const double v = it->second;
  if (!std::isfinite(v) || v != std::floor(v) || v < min || v > 1e9) {
    std::ostringstream o;
    o << v;
    m.fail("hostOpParams." + key, o.str() + " is not an integer >= " + std::to_string(min));
  }
  return int(v);
}

}  // namespace forge
