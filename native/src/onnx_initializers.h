// Which initializers of an ONNX model live in external data files, and where: just enough of the
// ONNX protobuf (ModelProto.graph.initializer: name, data_type, dims, data_location, external_data)
// to map those bytes once and hand ONNX Runtime views of them (shared_weights.h). Everything else in
// the file is skipped; ORT itself still parses and checks the whole model.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <onnxruntime_c_api.h>

namespace forge {

class OnnxFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ExternalInitializer {
  std::string name;
  int32_t onnx_type = 0;        // TensorProto.DataType (the same numbers as ONNXTensorElementDataType)
  std::vector<int64_t> dims;
  std::string location;         // as written in the model: relative to the model's directory
  uint64_t offset = 0;
  std::optional<uint64_t> length;  // absent: the tensor's own byte size
};

/** The initializers of `onnx_path`'s main graph that keep their bytes in external data files.
 *  A file that is not an ONNX protobuf throws OnnxFileError naming it. */
std::vector<ExternalInitializer> read_external_initializers(const std::string& onnx_path);

/** Bytes per element of a fixed-size ONNX tensor type; 0 for types forge does not map (string,
 *  sub-byte and 8-bit float types), which SharedWeights refuses in one line naming the tensor. */
size_t element_bytes(int32_t onnx_type);

}  // namespace forge
