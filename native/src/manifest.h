// The bundle manifest as the runtime sees it: parsed from manifest.json (written by forge from the
// zod schema in src/bundle/manifest.ts) and validated on load. Validation throws ONE ManifestError
// whose message names the offending field path, e.g.
//   manifest.json: contexts[0].graphs[1].inputs[3].state: 'kv.9.k' is not a declared state
// so a bad bundle is refused before any graph is loaded, never half-run.
#pragma once
#include <cstdint>
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

enum class InputBind { residual, positions, mask, state };
enum class OutputBind { residual, logits, state_rows, state_replace };
enum class StateKind { kv_cache, recurrent };
enum class GraphRole { prefill, decode, lm_head };

struct TensorSpec {
  std::string name;
  std::string dtype;  // float32, int32, ... as in the schema
  std::vector<int64_t> shape;
};

struct GraphInput : TensorSpec {
  InputBind bind;
  int state = -1;  // index into Manifest::state when bind == state
};

struct GraphOutput : TensorSpec {
  OutputBind bind;
  int state = -1;  // index into Manifest::state when bind == state_rows / state_replace
  int axis = 0;    // the rows axis of a state_rows output
};

struct QnnFiles {
  std::string wrapper, sha256, binary;
};

struct Graph {
  std::string name;
  GraphRole role;
  int tokens = 1;
  std::string file, sha256;
  std::optional<QnnFiles> qnn;
  std::optional<std::pair<int, int>> layers;
  std::vector<GraphInput> inputs;
  std::vector<GraphOutput> outputs;
  std::string weights;  // fp32 / fp16 / w8
};

struct ContextFile {
  std::string path, sha256;
  uint64_t bytes = 0;
};

struct Context {
  std::string name;
  std::vector<ContextFile> files;
  std::vector<Graph> graphs;
  /** The graph of a role, or nullptr. */
  const Graph* graph(GraphRole role) const;
};

/** Elements of a tensor of this shape. */
size_t elements(const std::vector<int64_t>& shape);

struct StateSpec {
  std::string name;
  StateKind kind = StateKind::kv_cache;
  std::vector<int64_t> shape;
  int position_axis = -1;  // kv-cache: the axis indexed by absolute position; -1 for recurrent state
  size_t elements() const { return forge::elements(shape); }
};

struct Manifest {
  std::string path;  // manifest.json as given
  std::string root;  // artifacts root every relative path resolves against
  std::string recipe, arch_id, host_op, family;
  int soc_model = 0;  // arch.socModel: the QNN EP's soc_model option
  int layers = 0, hidden = 0, vocab = 0;
  std::vector<Context> contexts;  // execution order: shards, then the lm-head
  std::vector<StateSpec> state;
  std::string embedding_file;  // f16 [vocab, hidden]
  float mask_masked = 0;
  std::string tokenizer_file;
  std::optional<int> bos;
  std::vector<int> eos;
  std::optional<std::string> chat_template;
  int max_context = 0;
  int max_new_tokens = 0;

  std::string resolve(const std::string& rel) const;
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

/** Reads, parses and validates; `artifacts_root` is where the bundle's files live. */
Manifest load_manifest(const std::string& manifest_path, const std::string& artifacts_root,
                       const LoadOptions& opts = {});
/** Validates an already-parsed document; `label` prefixes error messages (the file name). */
Manifest parse_manifest(const nlohmann::json& doc, const std::string& label, const std::string& artifacts_root,
                        const LoadOptions& opts = {});

}  // namespace forge
