// The manifest's model once parsed (manifest.h): binding names, lookups and shape helpers, apart
// from the parser and its rules (manifest.cpp).
#include <sstream>

#include "manifest.h"

namespace forge {

const char* bind_name(InputBind b) {
  switch (b) {
    case InputBind::residual: return "residual";
    case InputBind::positions: return "positions";
    case InputBind::mask: return "mask";
    case InputBind::state: return "state";
    case InputBind::host_rows: return "host-rows";
    case InputBind::routing_weights: return "routing-weights";
    case InputBind::encoder_output: return "encoder-output";
    case InputBind::pixels: return "pixels";
    case InputBind::audio_features: return "audio-features";
    case InputBind::audio_samples: return "audio-samples";
    case InputBind::hand_off: return "hand-off";
  }
  return "?";
}

const char* bind_name(OutputBind b) {
  switch (b) {
    case OutputBind::residual: return "residual";
    case OutputBind::logits: return "logits";
    case OutputBind::state_rows: return "state-rows";
    case OutputBind::state_replace: return "state-replace";
    case OutputBind::router_logits: return "router-logits";
    case OutputBind::encoder_output: return "encoder-output";
    case OutputBind::hand_off: return "hand-off";
  }
  return "?";
}

const Graph* Context::graph(const std::string& role) const {
  for (const Graph& g : graphs)
    if (g.role == role) return &g;
  return nullptr;
}

size_t elements(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); i++) o << (i ? "," : "") << s[i];
  o << ']';
  return o.str();
}

std::string Manifest::resolve(const std::string& rel) const { return root + "/" + rel; }

std::vector<const HostTable*> Manifest::tables(const std::string& use) const {
  std::vector<const HostTable*> out;
  for (const HostTable& t : host_tables)
    if (t.use == use) out.push_back(&t);
  return out;
}

}  // namespace forge
