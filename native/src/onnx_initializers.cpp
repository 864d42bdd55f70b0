#include "onnx_initializers.h"

#include "utf8.h"

#include <fstream>
#include <iterator>

namespace forge {
namespace {

// Protobuf wire format (https://protobuf.dev/programming-guides/encoding/): each field is a varint
// key (number << 3 | wire type) followed by a varint (0), 8 bytes (1), a length-prefixed run (2) or
// 4 bytes (5). Groups (3, 4) are not used by ONNX and are refused.
class Wire {
 public:
  Wire(const uint8_t* p, const uint8_t* end, const std::string& file) : p_(p), end_(end), file_(file) {}
  bool done() const { return p_ >= end_; }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) fail("truncated varint");
      uint8_t b = *p_++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("varint longer than 10 bytes");
  }
  /** The next field's number and wire type. */
  std::pair<uint32_t, uint32_t> key() {
    uint64_t k = varint();
    return {uint32_t(k >> 3), uint32_t(k & 7)};
  }
  /** A length-delimited field's bytes, as a reader of their own. */
  Wire sub() {
    uint64_t n = varint();
    if (n > uint64_t(end_ - p_)) fail("a field runs past the end of the file");
    Wire w(p_, p_ + n, file_);
    p_ += n;
    return w;
  }
  std::string str() {
    Wire w = sub();
    return std::string(reinterpret_cast<const char*>(w.p_), size_t(w.end_ - w.p_));
  }
  void skip(uint32_t wire) {
    if (wire == 0) varint();
    else if (wire == 2) sub();
    else if (wire == 1 || wire == 5) {
      size_t n = wire == 1 ? 8 : 4;
      if (size_t(end_ - p_) < n) fail("truncated fixed-size field");
      p_ += n;
    } else fail("unsupported wire type " + std::to_string(wire));
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw OnnxFileError(one_line(file_ + ": not a readable ONNX model (" + why + ")"));
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  const std::string& file_;
};

uint64_t parse_u64(const std::string& s, const std::string& what, const std::string& file, const std::string& tensor) {
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || s[0] == '-')
    throw OnnxFileError(one_line(file + ": initializer '" + tensor + "' has external data " + what + " '" + s + "', not a byte count"));
  return v;
}

/** TensorProto fields: 1 dims, 2 data_type, 8 name, 13 external_data, 14 data_location. */
std::optional<ExternalInitializer> read_tensor(Wire w, const std::string& file) {
  ExternalInitializer t;
  bool external = false;
  std::vector<std::pair<std::string, std::string>> kv;
  while (!w.done()) {
    auto [field, wire] = w.key();
    if (field == 1 && wire == 0) t.dims.push_back(int64_t(w.varint()));
    else if (field == 1 && wire == 2) {  // packed dims
      Wire d = w.sub();
      while (!d.done()) t.dims.push_back(int64_t(d.varint()));
    } else if (field == 2 && wire == 0) t.onnx_type = int32_t(w.varint());
    else if (field == 8 && wire == 2) t.name = w.str();
    else if (field == 13 && wire == 2) {
      Wire e = w.sub();
      std::string k, v;
      while (!e.done()) {
        auto [f, wt] = e.key();
        if (f == 1 && wt == 2) k = e.str();
        else if (f == 2 && wt == 2) v = e.str();
        else e.skip(wt);
      }
      kv.emplace_back(k, v);
    } else if (field == 14 && wire == 0) external = w.varint() == 1;  // DataLocation.EXTERNAL
    else w.skip(wire);
  }
  if (!external) return std::nullopt;
  for (const auto& [k, v] : kv) {
    if (k == "location") t.location = v;
    else if (k == "offset") t.offset = parse_u64(v, "offset", file, t.name);
    else if (k == "length") t.length = parse_u64(v, "length", file, t.name);
  }
  if (t.location.empty()) throw OnnxFileError(one_line(file + ": initializer '" + t.name + "' is marked external but names no location"));
  return t;
}

}  // namespace

size_t element_bytes(int32_t onnx_type) {
  switch (onnx_type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return 1;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return 8;
    default: return 0;
  }
}

std::vector<ExternalInitializer> read_external_initializers(const std::string& onnx_path) {
  std::ifstream in(onnx_path, std::ios::binary);
  if (!in) throw OnnxFileError(onnx_path + ": cannot be read");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<ExternalInitializer> out;
  Wire model(bytes.data(), bytes.data() + bytes.size(), onnx_path);
  while (!model.done()) {
    auto [field, wire] = model.key();
    if (field != 7 || wire != 2) {  // ModelProto.graph
      model.skip(wire);
      continue;
    }
    Wire graph = model.sub();
    while (!graph.done()) {
      auto [gf, gw] = graph.key();
      if (gf == 5 && gw == 2) {  // GraphProto.initializer
        if (auto t = read_tensor(graph.sub(), onnx_path)) out.push_back(std::move(*t));
      } else graph.skip(gw);
    }
  }
  return out;
}

}  // namespace forge
