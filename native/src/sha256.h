// SHA-256 (FIPS 180-4), small and dependency-free: the runtime checks every bundle file against
// the manifest before loading it, and pulling in libcrypto for that alone is not worth it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace forge {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t len);
  /** Lowercase hex digest; the object must not be updated afterwards. */
  std::string hexdigest();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const void* data, size_t len);
/** Streams the file; throws std::runtime_error naming it when it cannot be read. */
std::string sha256_file(const std::string& path);

}  // namespace forge
