#include "shared_weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "onnx_initializers.h"
#include "utf8.h"

namespace forge {
namespace {

std::string dir_of(const std::string& p) {
  size_t s = p.find_last_of('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); i++) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

std::unique_ptr<MappedFile> map_host_table(const std::string& path, uint64_t bytes, const std::string& what) {
  auto f = std::make_unique<MappedFile>(path);
  if (f->size() < bytes) throw std::runtime_error(what + " " + path + " has " + std::to_string(f->size()) + " bytes, " + std::to_string(bytes) + " expected");
  return f;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("weight file '" + path + "' cannot be opened: " + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    throw std::runtime_error("weight file '" + path + "' cannot be read: " + std::strerror(e));
  }
  size_ = uint64_t(st.st_size);
  id_ = {uint64_t(st.st_dev), uint64_t(st.st_ino)};
  if (size_ > 0) {
    // Read-only and shared: the pages are the page cache's, never a private copy.
    base_ = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (base_ == MAP_FAILED) {
      int e = errno;
      base_ = nullptr;
      close(fd);
      throw std::runtime_error("weight file '" + path + "' cannot be mapped: " + std::strerror(e));
    }
  }
  close(fd);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
  if (base_) munmap(base_, size_);
}

const MappedFile& SharedWeights::file(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) throw std::runtime_error("weight file '" + path + "' does not exist");
  FileId id{uint64_t(st.st_dev), uint64_t(st.st_ino)};
  auto it = files_.find(id);
  if (it != files_.end()) return *it->second;
  auto m = std::make_unique<MappedFile>(path);
  stats_.files++;
  stats_.file_bytes += m->size();
  return *files_.emplace(id, std::move(m)).first->second;
}

void SharedWeights::add_to(Ort::SessionOptions& so, const std::string& onnx_path) {
  // Names and locations are outside input: every refusal is one line (control characters escaped).
  try {
    add_each(so, onnx_path);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(one_line(e.what()));
  }
}

void SharedWeights::add_each(Ort::SessionOptions& so, const std::string& onnx_path) {
  const std::string dir = dir_of(onnx_path);
  for (const ExternalInitializer& t : read_external_initializers(onnx_path)) {
    const std::string where = onnx_path + ": initializer '" + t.name + "'";
    // int4 (W4 in the QAIRT path's QDQ form) packs two elements a byte: ⌈count/2⌉ bytes at any offset.
    const bool packed4 = t.onnx_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT4 || t.onnx_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT4;
    const size_t elem = packed4 ? 1 : element_bytes(t.onnx_type);
    if (elem == 0) throw std::runtime_error(where + " has ONNX data type " + std::to_string(t.onnx_type) + ", which the runtime cannot map in place");
    uint64_t count = 1;
    for (int64_t d : t.dims) {
      if (d < 0 || (d > 0 && count > UINT64_MAX / uint64_t(d))) throw std::runtime_error(where + " has an invalid shape " + dims_text(t.dims));
      count *= uint64_t(d);
    }
    const uint64_t bytes = packed4 ? (count + 1) / 2 : count * elem;
    if (t.length && *t.length != bytes)
      throw std::runtime_error(where + " declares " + std::to_string(*t.length) + " bytes of external data, its shape " + dims_text(t.dims) + " needs " + std::to_string(bytes));
    if (t.location.empty() || t.location[0] == '/') throw std::runtime_error(where + " has external data location '" + t.location + "', not a path relative to the model");
    const MappedFile* mapped = nullptr;
    try {
      mapped = &file(dir + "/" + t.location);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(where + ": " + e.what());
    }
    const MappedFile& f = *mapped;
    if (t.offset > f.size() || bytes > f.size() - t.offset)
      throw std::runtime_error(where + " lies past the end of " + f.path() + " (offset " + std::to_string(t.offset) + " + " + std::to_string(bytes) + " bytes > " + std::to_string(f.size()) + ")");
    if (t.offset % elem != 0)
      throw std::runtime_error(where + " starts at offset " + std::to_string(t.offset) + " of " + f.path() + ", not a multiple of its element size " + std::to_string(elem));

    TensorKey key{f.id(), t.offset, bytes, t.onnx_type, t.dims};
    auto it = values_.find(key);
    if (it == values_.end()) {
      static const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
      // ORT only reads initializers; the mapping is PROT_READ, so a write would fault, not corrupt.
      void* data = const_cast<uint8_t*>(f.data() + t.offset);
      it = values_.emplace(key, Ort::Value::CreateTensor(cpu, data, bytes, t.dims.data(), t.dims.size(), ONNXTensorElementDataType(t.onnx_type))).first;
      stats_.tensors++;
      stats_.tensor_bytes += bytes;
    }
    try {
      so.AddInitializer(t.name.c_str(), it->second);
    } catch (const Ort::Exception& e) {  // e.g. two initializers of one name
      throw std::runtime_error(where + ": " + e.what());
    }
    stats_.uses++;
  }
}

void configure_cpu_session(Ort::SessionOptions& so) {
  // The level the oracle gate runs the CPU form at (src/gates/cpu-form.ts): parity's CPU numbers are
  // the numbers the oracle checked. Higher levels rewrite DequantizeLinear→MatMul into kernels that
  // quantize activations, and ORT_ENABLE_ALL turns an fp16 initializer behind a Cast into a private
  // fp32 initializer that the disable list below does not reach.
  so.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_BASIC);
  so.AddConfigEntry("session.disable_prepacking", "1");
  so.AddConfigEntry("optimization.disable_specified_optimizers", "ConstantFolding");
  // No arena: a weight's Cast output (1.56 GB for a 4B lm-head) goes back to the system after its
  // graph ran instead of staying reserved, and arenas that keep a fragment of it in use cannot
  // force another region of that size (measured: bench/README.md, parity-memory).
  so.DisableCpuMemArena();
}

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream f("/proc/self/status");
  std::string line;
  auto kb = [&](const char* key, int64_t& out) {
    size_t n = std::strlen(key);
    if (line.compare(0, n, key) == 0) out = std::stoll(line.substr(n)) * 1024;
  };
  while (std::getline(f, line)) {
    kb("RssAnon:", m.anon);
    kb("RssFile:", m.file);
    kb("VmHWM:", m.hwm);
  }
  return m;
}

}  // namespace forge
