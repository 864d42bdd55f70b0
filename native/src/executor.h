// Runs the manifest's graphs through the ONNX Runtime C++ API: one Ort::Env, one session per graph.
// backend "cpu" → the CPU EP on each graph's ONNX file, its external weights mapped once per data
// file and shared by every session that reads them (shared_weights.h: one copy per shard, in
// file-backed pages, not one private copy per graph). backend = path to a QNN backend library
// (libQnnHtp.so) → the QNN EP as a plugin EP (RegisterExecutionProviderLibrary + GetEpDevices +
// AppendExecutionProvider_V2, backend_path=<backend>) on each graph's qnn.wrapper (an EPContext
// model), with CPU fallback disabled so a graph that does not run on QNN fails instead of silently
// running on the CPU. The plugin library comes from FORGE_QNN_EP_LIB, else it is looked up next to
// the backend library.
//
// Callers own every buffer: a GraphBinding binds host memory to a graph's inputs and outputs once
// (Ort::IoBinding over Ort::Value views), and each run() reuses it: no per-call allocation.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

#include "manifest.h"
#include "shared_weights.h"

namespace forge {

struct ExecutorOptions {
  std::string backend = "cpu";  // "cpu" or the path of libQnnHtp.so
  std::string system_lib = "-";  // libQnnSystem.so to preload, or "-"
  int intra_op_threads = 0;      // 0 = ORT's default
};

/** The QNN EP plugin library to use with `backend` (FORGE_QNN_EP_LIB, else next to it). */
std::string qnn_ep_library_for(const std::string& backend);

class GraphBinding {
 public:
  GraphBinding(Ort::Session& session, const Graph& graph);
  void bind_input(const std::string& name, float* data, const std::vector<int64_t>& shape);
  void bind_input(const std::string& name, int32_t* data, const std::vector<int64_t>& shape);
  /** Rows the host picks per call (expert rows from a mapped table): bind again to move the input to other rows, no copy. */
  void bind_input(const std::string& name, const int8_t* data, const std::vector<int64_t>& shape);
  void bind_input(const std::string& name, const Ort::Float16_t* data, const std::vector<int64_t>& shape);
  void bind_input(const std::string& name, const float* data, const std::vector<int64_t>& shape);
  void bind_output(const std::string& name, float* data, const std::vector<int64_t>& shape);
  void bind_output(const std::string& name, Ort::Float16_t* data, const std::vector<int64_t>& shape);
  /** Runs the graph; every input and output must have been bound. */
  void run();

 private:
  template <class T>
  void bind(const std::string& name, T* data, const std::vector<int64_t>& shape, bool input);
  void check_name(const std::string& name, bool input) const;
  Ort::Session& session_;
  const Graph& graph_;
  Ort::IoBinding binding_;
  Ort::RunOptions run_options_;
  Ort::MemoryInfo cpu_;
  std::vector<Ort::Value> values_;  // keeps the views alive while bound
  std::map<std::string, size_t> slot_;  // (in|out):name → its view in values_: binding a name again replaces it
  size_t bound_ = 0;
};

class Executor {
 public:
  Executor(const Manifest& manifest, const ExecutorOptions& opts);
  /** The session of graphs[graph] in contexts[context]. */
  Ort::Session& session(size_t context, size_t graph);
  std::unique_ptr<GraphBinding> bind(size_t context, size_t graph);
  bool on_qnn() const { return qnn_; }
  /** What the CPU sessions share (all zero on QNN, whose weights are in the context binaries). */
  const SharedWeightStats& shared_weights() const { return weights_.stats(); }

 private:
  Ort::SessionOptions session_options(const ExecutorOptions& opts);
  const Manifest& manifest_;
  Ort::Env env_;
  bool qnn_ = false;
  SharedWeights weights_;  // declared before sessions_: outlives them
  std::vector<std::vector<std::unique_ptr<Ort::Session>>> sessions_;
};

}  // namespace forge
