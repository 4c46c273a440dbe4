// `gelu_tanh(gate) · up` on bf16 values in ATen's bits, 16 or 8 lanes at a time, and the bf16 conversions it
// rounds with: used by tanh.cpp (the product in one call) and by the matrix kernels (dot4.cpp, fma4.cpp), which
// compute it on the way out of the feed-forward block's stacked gate/up product. tanh.cpp's header says what ATen
// computes and why these are its bits.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

extern "C" __m512 Sleef_tanhf16_u10(__m512);
extern "C" __m256 Sleef_tanhf8_u10(__m256);

namespace gelu {

const float BETA = float(M_SQRT2 * M_2_SQRTPI * 0.5), KAPPA = float(0.044715);

inline __attribute__((target("avx512f"))) __m512 widened(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// cvtfp32_bf16 (vec512_bfloat16.h)
inline __attribute__((target("avx512f"))) __m256i rounded(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  __m512i r = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(r, _mm512_set1_epi32(0x7FFF)), bits), 16);
  r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), _mm512_set1_epi32(0xFFFF), r);
  return _mm512_cvtusepi32_epi16(r);
}

// v rounded to bf16, as float32 again: what the next op of ATen's reads
inline __attribute__((target("avx512f"))) __m512 through_bf16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded(v)), 16));
}

inline __attribute__((target("avx512f"))) void gelu_wide(const uint16_t* gate, const uint16_t* other, uint16_t* y, int64_t begin,
                                             int64_t end) {
  const __m512 beta = _mm512_set1_ps(BETA), kappa = _mm512_set1_ps(KAPPA), half = _mm512_set1_ps(0.5f),
               one = _mm512_set1_ps(1.0f);
  // --8<-- [start:gelu]
  for (int64_t i = begin; i < end; i += 16) {
    const __m512 x = widened(gate + i);
    const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 inner = _mm512_mul_ps(_mm512_fmadd_ps(cube, kappa, x), beta);
    const __m512 g = _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, Sleef_tanhf16_u10(inner)));
    _mm256_storeu_si256((__m256i*)(y + i), rounded(_mm512_mul_ps(through_bf16(g), widened(other + i))));
  }
  // --8<-- [end:gelu]
}

inline __attribute__((target("avx2,fma"))) __m256 widened8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

// cvtfp32_bf16 (vec256_bfloat16.h), 8 lanes: the 32-bit results, not yet packed
inline __attribute__((target("avx2,fma"))) __m256i rounded8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  __m256i r = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(r, _mm256_set1_epi32(0x7FFF)), bits), 16);
  return _mm256_blendv_epi8(_mm256_set1_epi32(0xFFFF), r, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));
}

inline __attribute__((target("avx2,fma"))) __m256 through_bf16_8(__m256 v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(rounded8(v), 16));
}

// rounded8's 8 results stored as bf16: packed within each 128-bit lane, then the two lanes' halves brought together
inline __attribute__((target("avx2,fma"))) void stored8(uint16_t* y, __m256i r) {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128((__m128i*)y, _mm256_castsi256_si128(packed));
}

inline __attribute__((target("avx2,fma"))) void gelu_narrow(const uint16_t* gate, const uint16_t* other, uint16_t* y,
                                                int64_t begin, int64_t end) {
  const __m256 beta = _mm256_set1_ps(BETA), kappa = _mm256_set1_ps(KAPPA), half = _mm256_set1_ps(0.5f),
               one = _mm256_set1_ps(1.0f);
  for (int64_t i = begin; i < end; i += 8) {
    const __m256 x = widened8(gate + i);
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 inner = _mm256_mul_ps(_mm256_fmadd_ps(cube, kappa, x), beta);
    const __m256 g = _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, Sleef_tanhf8_u10(inner)));
    stored8(y + i, rounded8(_mm256_mul_ps(through_bf16_8(g), widened8(other + i))));
  }
}

}  // namespace gelu
