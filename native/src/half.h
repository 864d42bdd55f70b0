// IEEE binary16 → binary32, exact (subnormals, infinities and NaN included): host tables are f16.
#pragma once
#include <cstdint>
#include <cstring>

namespace forge {

inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise the mantissa
    int e = -1;
    do { man <<= 1; e++; } while (!(man & 0x400));
    bits = sign | uint32_t(112 - e) << 23 | ((man & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace forge
