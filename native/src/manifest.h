// The bundle manifest as the runtime sees it: parsed from manifest.json (written by forge from the
// zod schema in src/bundle/manifest.ts) and validated on load. Validation throws ONE ManifestError
// whose message names the offending field path, e.g.
//   manifest.json: contexts[0].graphs[1].inputs[3].state: 'kv.9.k' is not a declared state
// so a bad bundle is refused before any graph is loaded, never half-run. Version 2: open host-op
// names and roles, typed bindings to host tables, routing and encoders, windowed and shared state,
// positions [N] or [3, N] (multimodal RoPE rows t, h, w).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace forge {

class ManifestError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class InputBind { residual, positions, mask, state, host_rows, routing_weights, encoder_output, pixels, audio_features, audio_samples, hand_off };
enum class OutputBind { residual, logits, state_rows, state_replace, router_logits, encoder_output, hand_off };
enum class StateKind { kv_cache, recurrent };
enum class RowIndex { token, expert };

/** The roles today's decoders use. Roles are open names: a host-op may define others. */
namespace role {
constexpr const char* prefill = "prefill";
constexpr const char* decode = "decode";
constexpr const char* lm_head = "lm_head";
}  // namespace role

struct TensorSpec {
  std::string name;
  std::string dtype;  // float32, int32, ... as in the schema
  std::vector<int64_t> shape;
};

struct GraphInput : TensorSpec {
  InputBind bind;
  int state = -1;              // index into Manifest::state when bind == state
  int table = -1;              // host_rows: index into Manifest::host_tables
  RowIndex index = RowIndex::token;  // host_rows: what picks the rows
  std::optional<int> layer;    // host_rows, routing_weights (optional: absent = the layer whose router ran last)
  std::optional<int> slot;     // host_rows: which of the selected experts
  std::optional<int> window;   // positions: ring slots (position mod window); mask: over a ring of window slots
  std::optional<int> sliding;  // mask over a ring: how far back a row sees (q - p < sliding, HF's sliding window); absent: the ring's slots
  std::string component;       // encoder_output: the encoder component (absent from a manifest that runs without it: the host-op says what it feeds)
  std::string output;          // encoder_output: which of the component's encoder-output outputs ("" = not named)
  std::string handoff;         // hand_off: what an earlier graph of the same step handed over
  std::string path;            // e.g. contexts[0].graphs[1].inputs[3], for a validator's complaint
};

struct GraphOutput : TensorSpec {
  OutputBind bind;
  int state = -1;  // index into Manifest::state when bind == state_rows / state_replace
  int axis = 0;    // the rows axis of a state_rows output
  int layer = -1;  // router_logits: the layer routed
  int top_k = 0;   // router_logits: experts selected
  std::string handoff;  // hand_off: the name the next graph takes it by
  std::string path;
};

/** The schema's name of a binding (as a refusal quotes it). */
const char* bind_name(InputBind b);
const char* bind_name(OutputBind b);

struct QnnFiles {
  std::string wrapper, sha256, binary;
};

struct Graph {
  std::string name;
  std::string component;  // the family component this graph is a variant of
  std::string role;       // prefill, decode, lm_head, or a role a host-op defines
  int tokens = 1;
  std::string file, sha256;
  std::optional<QnnFiles> qnn;
  std::optional<std::pair<int, int>> layers;
  std::vector<GraphInput> inputs;
  std::vector<GraphOutput> outputs;
  std::string weights;  // fp32 / fp16 / w8 / w4
  std::string path;     // contexts[i].graphs[j]
};

struct ContextFile {
  std::string path, sha256;
  uint64_t bytes = 0;
};

struct Context {
  std::string name;
  std::vector<ContextFile> files;
  std::vector<Graph> graphs;
  std::string path;  // contexts[i]
  /** The graph of a role, or nullptr (a context has at most one of each). */
  const Graph* graph(const std::string& role) const;
};

/** Elements of a tensor of this shape. */
size_t elements(const std::vector<int64_t>& shape);
/** "[1,2,3]": a shape as refusals write it. */
std::string shape_str(const std::vector<int64_t>& shape);

struct StateSpec {
  std::string name;
  StateKind kind = StateKind::kv_cache;
  std::vector<int64_t> shape;
  int position_axis = -1;  // kv-cache: the axis indexed by absolute position; -1 for recurrent state
  std::optional<int> window;  // kv-cache: a ring of this many slots (the position axis is this long)
  bool shared = false;        // may be carried by graphs of several contexts
  std::string path;           // state[i]
  size_t elements() const { return forge::elements(shape); }
};

/** A table the host reads rows of: `shape` elements of `dtype` in `file`. */
struct HostTable {
  std::string name, use, file, sha256, dtype;
  std::vector<int64_t> shape;
  std::string path;  // hostTables[i]
  size_t elements() const { return forge::elements(shape); }
};

struct Manifest {
  std::string path;  // manifest.json as given
  std::string root;  // artifacts root every relative path resolves against
  std::string recipe, arch_id, host_op, family;
  int soc_model = 0;  // arch.socModel: the QNN EP's soc_model option
  int layers = 0, hidden = 0, vocab = 0;
  std::vector<Context> contexts;  // in manifest order; how they run is the host-op's (a decoder: shards, then the lm-head)
  std::vector<StateSpec> state;
  std::vector<HostTable> host_tables;
  float mask_masked = 0;
  std::string tokenizer_file;
  std::optional<int> bos;
  std::vector<int> eos;
  std::optional<std::string> chat_template;  // the Jinja source, as shipped (not read by the runtime)
  /** tokenizer.chat: the template as forge rendered it around one user turn (`qhx_generate --chat`). */
  struct ChatWrap {
    std::string prefix, suffix;
  };
  std::optional<ChatWrap> chat;
  /** tokenizer.chatNotApplied: why the checkpoint's template has no wrap (it does not put the content in fixed text). */
  std::optional<std::string> chat_not_applied;
  /**
   * tokenizer.chatOptions: the wrap for each combination of the template's switches (variables it
   * reads as booleans, e.g. enable_thinking), those not named not given; none given is `chat`.
   */
  struct ChatOptionWrap {
    std::map<std::string, bool> options;
    ChatWrap wrap;
  };
  std::vector<ChatOptionWrap> chat_options;
  /** tokenizer.chatOptionsNotApplied: why the template's switches have no wraps. */
  std::optional<std::string> chat_options_not_applied;
  int max_context = 0;
  int max_new_tokens = 0;
  /** hostOpParams: numbers (and booleans, as 0/1) and strings the host-op needs beyond the graphs. */
  std::map<std::string, double> host_op_numbers;
  std::map<std::string, std::string> host_op_strings;

  std::string label;  // how refusals name the file: "manifest.json"

  std::string resolve(const std::string& rel) const;
  /** The tables of a use, in manifest order. */
  std::vector<const HostTable*> tables(const std::string& use) const;
  /** Throws the one-line ManifestError "<label>: <path>: <msg>" (a host-op validator's refusal). */
  [[noreturn]] void fail(const std::string& path, const std::string& msg) const;
};

/**
 * How much of the bundle's content to check against the manifest's sha256 values at load. Every
 * file's existence, and the size of every file whose size the manifest fixes, is always checked.
 *   all:   every file (what `qhx_generate --verify` does: after a push, once);
 *   small: all but the files over kVerifySmallBytes whose size the manifest fixes (the multi-GB
 *          context binaries and embedding table): those get the size check only, as hashing them
 *          is most of start-up;
 *   none:  no hashing (tests of pure structure).
 */
enum class Verify { all, small, none };
constexpr uint64_t kVerifySmallBytes = 64ull << 20;

struct LoadOptions {
  Verify verify = Verify::all;
  /** What counts as big under Verify::small. */
  uint64_t small_bytes = kVerifySmallBytes;
};

/**
 * Reads, parses and validates: first what the manifest language itself defines (fields, shapes,
 * files, every name a binding refers to), then the rules of its host-op (host_op.h), whose
 * registered validator refuses whatever that host-op would not execute. `artifacts_root` is where
 * the bundle's files live.
 */
Manifest load_manifest(const std::string& manifest_path, const std::string& artifacts_root,
                       const LoadOptions& opts = {});
/** Validates an already-parsed document; `label` prefixes error messages (the file name). */
Manifest parse_manifest(const nlohmann::json& doc, const std::string& label, const std::string& artifacts_root,
                        const LoadOptions& opts = {});

}  // namespace forge
