// Weights in memory once, and mapped rather than copied: every external data file a graph reads is
// mmapped (read-only) once per Executor, and each external initializer is handed to ONNX Runtime as
// a shared initializer (SessionOptions::AddInitializer) viewing its bytes in that mapping. The
// prefill and decode graphs of a shard therefore read one set of file-backed pages, which the kernel
// can drop and re-read under pressure, instead of each session holding a private copy.
//
// Why not ORT's own options (measured with ORT 1.30 on this host, native/README.md "Weights"):
//   - plain external data: ORT maps each tensor itself, per session (two mappings per shard);
//   - AddExternalInitializers / AddExternalInitializersFromFilesInMemory: ORT copies the bytes into
//     private memory, per session;
//   - a PrepackedWeightsContainer shares prepacked copies only of shared initializers, and those
//     copies are private: prepacking is off on the CPU path instead (configure_cpu_session).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <onnxruntime_cxx_api.h>

namespace forge {

/** A whole file mapped read-only; unmapped on destruction. */
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return static_cast<const uint8_t*>(base_); }
  template <class T>
  const T* as() const { return static_cast<const T*>(base_); }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /** Device and inode: hard links of one file are one file. */
  std::pair<uint64_t, uint64_t> id() const { return id_; }

 private:
  std::string path_;
  void* base_ = nullptr;
  uint64_t size_ = 0;
  std::pair<uint64_t, uint64_t> id_;
};

/** A host table's file (embedding, expert rows), mapped whole: only the rows a step touches are paged in. Refuses a file under `bytes`. */
std::unique_ptr<MappedFile> map_host_table(const std::string& path, uint64_t bytes, const std::string& what);

struct SharedWeightStats {
  size_t files = 0;           // data files mapped
  uint64_t file_bytes = 0;    // their total size
  size_t tensors = 0;         // distinct external initializers viewed in place
  uint64_t tensor_bytes = 0;  // their bytes
  size_t uses = 0;            // initializers handed to sessions (a tensor in prefill and decode counts twice)
};

class SharedWeights {
 public:
  /** Adds every external initializer of the ONNX model `onnx_path` to `so` as a view into its data
   *  file's one mapping. Throws one line naming the model and tensor when a tensor lies outside its
   *  file (or its file is missing), is not aligned to its element size, or has a length that
   *  disagrees with its shape; a tensor type that cannot be viewed (string, sub-byte) and a name
   *  given twice throw too. */
  void add_to(Ort::SessionOptions& so, const std::string& onnx_path);
  const SharedWeightStats& stats() const { return stats_; }

 private:
  void add_each(Ort::SessionOptions& so, const std::string& onnx_path);
  const MappedFile& file(const std::string& path);
  using FileId = std::pair<uint64_t, uint64_t>;  // MappedFile::id()
  using TensorKey = std::tuple<FileId, uint64_t, uint64_t, int32_t, std::vector<int64_t>>;
  std::map<FileId, std::unique_ptr<MappedFile>> files_;
  std::map<TensorKey, Ort::Value> values_;  // must outlive the sessions that were given them
  SharedWeightStats stats_;
};

/** ORT's settings for CPU sessions over shared, mapped weights (see native/README.md "Weights"):
 *  no prepacking (a packed copy is private memory), no constant folding and ORT_ENABLE_BASIC, the
 *  oracle gate's level (folding and ORT_ENABLE_ALL would turn a weight's Cast into a private fp32
 *  copy; the levels between rewrite DequantizeLinear→MatMul into kernels that quantize
 *  activations), and no CPU arena (what a graph allocates is returned when it has run). Sets the
 *  optimization level. */
void configure_cpu_session(Ort::SessionOptions& so);

/** RssAnon, RssFile and VmHWM of this process in bytes (Linux /proc/self/status); -1 when unknown. */
struct ProcessMemory {
  int64_t anon = -1, file = -1, hwm = -1;
};
ProcessMemory process_memory();

}  // namespace forge
