// bf16 <-> float32 for this step's kernels, one scalar at a time: widening is exact (a bf16 is a float32's top 16
// bits); narrowing rounds to nearest even and keeps NaN a quiet NaN, as c10::BFloat16 does.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return uint16_t((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}
