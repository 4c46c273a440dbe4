// bf16 <-> float32 for this step's kernels, one scalar at a time: widening is exact (a bf16 is a float32's top 16
// bits); narrowing rounds to nearest even and keeps NaN a quiet NaN, as c10::BFloat16 does. And a block's 16
// scales widened at once, for the AVX-512 kernels.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

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

// 16 scales of a block of rows, widened to float32 (exact): f16 by the convert instruction, bf16 by a shift
// (dot4.cpp, panels.cpp); and 8 of them, with AVX2 and F16C (fma4.cpp, panels.cpp).
template <bool F16>
__attribute__((target("avx512f,avx512bw"))) inline __m512 widened16(const uint16_t* s) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  if constexpr (F16) return _mm512_cvtph_ps(half);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

template <bool F16>
__attribute__((target("avx2,f16c"))) inline __m256 widened8(const uint16_t* s) {
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  if constexpr (F16) return _mm256_cvtph_ps(half);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

// times · Σ value(k, x[k]) over each group of `group` values of x (bf16, widened to float32), in float32, k in order
// — one sum after another waits on each add's latency, once per value of the row (perf put this prologue at 0.45 ms
// of an E2B decode step on dot4), so eight groups' sums run side by side, each still in its own order: same bits.
// `value` may also keep what it is given (fma4.cpp keeps its scaled activations); dot4.cpp sums x itself.
template <class Value>
inline void group_sums(const uint16_t* x, int64_t groups, int64_t group, float times, float* out, Value value) {
  for (int64_t g = 0; g < groups; g += 8) {
    const int64_t n = groups - g < 8 ? groups - g : 8;
    float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t c = 0; c < group; ++c)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t k = (g + j) * group + c;
        sum[j] += value(k, bf16_to_float(x[k]));
      }
    for (int64_t j = 0; j < n; ++j) out[g + j] = times * sum[j];
  }
}

// dot4's correction (dot4.cpp, amx4.cpp): 136 · Σx over each group of `group` columns of each of x's M rows,
// [M, K / group].
inline std::vector<float> corrections(const uint16_t* x, int64_t M, int64_t K, int64_t group) {
  const int64_t groups = K / group;
  std::vector<float> corr(M * groups);
  for (int64_t m = 0; m < M; ++m)
    group_sums(x + m * K, groups, group, 136.0f, corr.data() + m * groups, [](int64_t, float v) { return v; });
  return corr;
}

// rows of 16 float32 outputs, each rounded once to bf16 (to nearest even), into y, rows N apart (dot4.cpp, amx4.cpp)
__attribute__((target("avx512f,avx512bf16"))) inline void rounded16(const __m512* acc, int64_t rows, uint16_t* y,
                                                                    int64_t N) {
  for (int64_t r = 0; r < rows; ++r)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * N), (__m256i)_mm512_cvtneps_pbh(acc[r]));
}
