#include "executor.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <optional>
#include <stdexcept>

namespace forge {
namespace {

bool is_file(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dir_of(const std::string& p) {
  size_t s = p.find_last_of('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

ONNXTensorElementDataType ort_type(const std::string& dtype) {
  if (dtype == "float32") return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  if (dtype == "float16") return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  if (dtype == "int32") return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  if (dtype == "int64") return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  if (dtype == "int8") return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
  if (dtype == "uint8") return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  if (dtype == "int16") return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16;
  if (dtype == "uint16") return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
}

/** The session's real inputs/outputs must be the ones the manifest declares, in name, type and shape. */
template <typename Spec>
void check_io(const std::string& graph, const char* what, const std::vector<Spec>& specs,
              const std::vector<std::string>& names, const std::vector<Ort::TypeInfo>& types) {
  if (names.size() != specs.size())
    throw std::runtime_error("graph '" + graph + "' has " + std::to_string(names.size()) + " " + what + ", the manifest declares " + std::to_string(specs.size()));
  for (const Spec& s : specs) {
    size_t i = 0;
    while (i < names.size() && names[i] != s.name) i++;
    if (i == names.size()) throw std::runtime_error("graph '" + graph + "' has no " + what + " named '" + s.name + "'");
    auto info = types[i].GetTensorTypeAndShapeInfo();
    if (info.GetElementType() != ort_type(s.dtype)) throw std::runtime_error("graph '" + graph + "' " + what + " '" + s.name + "' is not " + s.dtype);
    std::vector<int64_t> shape = info.GetShape();
    bool same = shape.size() == s.shape.size();
    for (size_t d = 0; same && d < shape.size(); d++) same = shape[d] < 0 || shape[d] == s.shape[d];
    if (!same) throw std::runtime_error("graph '" + graph + "' " + what + " '" + s.name + "' has a different shape than the manifest declares");
  }
}

void check_session(Ort::Session& s, const Graph& g) {
  Ort::AllocatorWithDefaultOptions alloc;
  std::vector<std::string> in_names, out_names;
  std::vector<Ort::TypeInfo> in_types, out_types;
  for (size_t i = 0; i < s.GetInputCount(); i++) {
    in_names.push_back(s.GetInputNameAllocated(i, alloc).get());
    in_types.push_back(s.GetInputTypeInfo(i));
  }
  for (size_t i = 0; i < s.GetOutputCount(); i++) {
    out_names.push_back(s.GetOutputNameAllocated(i, alloc).get());
    out_types.push_back(s.GetOutputTypeInfo(i));
  }
  check_io(g.name, "inputs", g.inputs, in_names, in_types);
  check_io(g.name, "outputs", g.outputs, out_names, out_types);
}

/** ORT's own log goes to stderr, which would break the tool's one-line error contract: it is off
 *  (fatal only) unless FORGE_ORT_LOG asks for verbose|info|warning|error, e.g. to see which nodes an
 *  EP refused. The error that stops a run is always in the exception message. */
OrtLoggingLevel ort_log_level() {
  const char* v = std::getenv("FORGE_ORT_LOG");
  std::string s = v ? v : "";
  if (s == "verbose") return ORT_LOGGING_LEVEL_VERBOSE;
  if (s == "info") return ORT_LOGGING_LEVEL_INFO;
  if (s == "warning") return ORT_LOGGING_LEVEL_WARNING;
  if (s == "error") return ORT_LOGGING_LEVEL_ERROR;
  return ORT_LOGGING_LEVEL_FATAL;
}

}  // namespace

std::string qnn_ep_library_for(const std::string& backend) {
  if (const char* env = std::getenv("FORGE_QNN_EP_LIB"); env && *env) return env;
  return dir_of(backend) + "/libonnxruntime_providers_qnn.so";
}

GraphBinding::GraphBinding(Ort::Session& session, const Graph& graph)
    : session_(session), graph_(graph), binding_(session),
      cpu_(Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault)) {}

void GraphBinding::check_name(const std::string& name, bool input) const {
  bool found = false;
  if (input) {
    for (const auto& i : graph_.inputs) found |= i.name == name;
  } else {
    for (const auto& o : graph_.outputs) found |= o.name == name;
  }
  if (!found) throw std::logic_error("graph '" + graph_.name + "' has no " + (input ? "input " : "output ") + name);
}

template <class T>
void GraphBinding::bind(const std::string& name, T* data, const std::vector<int64_t>& shape, bool input) {
  check_name(name, input);
  Ort::Value v = Ort::Value::CreateTensor<T>(cpu_, data, elements(shape), shape.data(), shape.size());
  auto [at, fresh] = slot_.emplace((input ? "in:" : "out:") + name, values_.size());
  if (fresh) {
    values_.push_back(std::move(v));
    bound_++;
  } else {
    values_[at->second] = std::move(v);  // IoBinding replaces a name bound again
  }
  if (input) binding_.BindInput(name.c_str(), values_[at->second]);
  else binding_.BindOutput(name.c_str(), values_[at->second]);
}

void GraphBinding::bind_input(const std::string& name, float* data, const std::vector<int64_t>& shape) { bind(name, data, shape, true); }
void GraphBinding::bind_input(const std::string& name, int32_t* data, const std::vector<int64_t>& shape) { bind(name, data, shape, true); }
void GraphBinding::bind_output(const std::string& name, float* data, const std::vector<int64_t>& shape) { bind(name, data, shape, false); }
void GraphBinding::bind_output(const std::string& name, Ort::Float16_t* data, const std::vector<int64_t>& shape) { bind(name, data, shape, false); }
// Inputs are only read: ORT's tensor views take non-const pointers, nothing writes through them.
void GraphBinding::bind_input(const std::string& name, const int8_t* data, const std::vector<int64_t>& shape) {
  bind(name, const_cast<int8_t*>(data), shape, true);
}
void GraphBinding::bind_input(const std::string& name, const Ort::Float16_t* data, const std::vector<int64_t>& shape) {
  bind(name, const_cast<Ort::Float16_t*>(data), shape, true);
}
void GraphBinding::bind_input(const std::string& name, const float* data, const std::vector<int64_t>& shape) {
  bind(name, const_cast<float*>(data), shape, true);
}

void GraphBinding::run() {
  if (bound_ != graph_.inputs.size() + graph_.outputs.size())
    throw std::logic_error("graph '" + graph_.name + "' run with unbound inputs or outputs");
  session_.Run(run_options_, binding_);
}

Ort::SessionOptions Executor::session_options(const ExecutorOptions& opts) {
  Ort::SessionOptions so;
  if (opts.intra_op_threads > 0) so.SetIntraOpNumThreads(opts.intra_op_threads);
  if (opts.backend == "cpu") {
    configure_cpu_session(so);  // sets its own optimization level
    return so;
  }
  so.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);

  // QNN: the plugin EP, found before anything else so a missing piece fails with its name.
  if (!is_file(opts.backend)) throw std::runtime_error("QNN backend library '" + opts.backend + "' does not exist");
  std::string plugin = qnn_ep_library_for(opts.backend);
  if (!is_file(plugin))
    throw std::runtime_error("QNN EP plugin library '" + plugin + "' not found: set FORGE_QNN_EP_LIB to libonnxruntime_providers_qnn.so (the onnxruntime-qnn plugin) or put it next to the backend library");
  if (opts.system_lib != "-") {
    // The EP dlopens libQnnSystem.so by name; loading the given file first makes that name resolve to it.
    if (!dlopen(opts.system_lib.c_str(), RTLD_NOW | RTLD_GLOBAL))
      throw std::runtime_error("cannot load QNN system library '" + opts.system_lib + "': " + dlerror());
  }
  // The plugin names its EP after the registration name, so register under the EP's usual name.
  const std::string ep_name = "QNNExecutionProvider";
  env_.RegisterExecutionProviderLibrary(ep_name.c_str(), plugin);
  std::vector<Ort::ConstEpDevice> qnn_devices;
  for (const auto& d : env_.GetEpDevices())
    if (d.EpName() == ep_name) qnn_devices.push_back(d);
  if (qnn_devices.empty()) throw std::runtime_error("QNN EP plugin '" + plugin + "' registered but offers no QNNExecutionProvider device");
  std::unordered_map<std::string, std::string> ep_options{{"backend_path", opts.backend}};
  if (manifest_.soc_model > 0) ep_options["soc_model"] = std::to_string(manifest_.soc_model);
  so.AppendExecutionProvider_V2(env_, qnn_devices, ep_options);
  so.AddConfigEntry("session.disable_cpu_ep_fallback", "1");
  so.AddConfigEntry("ep.share_ep_contexts", "1");  // prefill and decode wrappers share one context binary
  qnn_ = true;
  return so;
}

Executor::Executor(const Manifest& manifest, const ExecutorOptions& opts)
    : manifest_(manifest), env_(ort_log_level(), "forge") {
  Ort::SessionOptions so = session_options(opts);
  for (const Context& c : manifest.contexts) {
    sessions_.emplace_back();
    for (const Graph& g : c.graphs) {
      std::string file;
      if (qnn_) {
        if (!g.qnn) throw std::runtime_error("graph '" + g.name + "' has no compiled QNN context (qnn.wrapper) in this bundle; run it with backend 'cpu'");
        file = manifest.resolve(g.qnn->wrapper);
      } else {
        if (g.file.empty()) throw std::runtime_error("graph '" + g.name + "' ships only a compiled QNN context (a device bundle); run it with a QNN backend library, not 'cpu'");
        file = manifest.resolve(g.file);
      }
      // CPU: this graph's weights are views into the one mapping of its data files (shared_weights.h);
      // QNN: the wrappers carry no weights, and every session takes the one set of options.
      std::optional<Ort::SessionOptions> graph_so;
      if (!qnn_) {
        graph_so = so.Clone();
        weights_.add_to(*graph_so, file);
      }
      try {
        sessions_.back().push_back(std::make_unique<Ort::Session>(env_, file.c_str(), graph_so ? *graph_so : so));
      } catch (const Ort::Exception& e) {
        throw std::runtime_error("graph '" + g.name + "' (" + file + ") does not load: " + e.what());
      }
      check_session(*sessions_.back().back(), g);
    }
  }
}

Ort::Session& Executor::session(size_t context, size_t graph) { return *sessions_.at(context).at(graph); }

std::unique_ptr<GraphBinding> Executor::bind(size_t context, size_t graph) {
  return std::make_unique<GraphBinding>(session(context, graph), manifest_.contexts.at(context).graphs.at(graph));
}

}  // namespace forge
