// Gemma 4's two uses of tanh, each in one call, the bits of ATen's ops on bf16 tensors: the feed-forward block's
// `gelu_tanh(gate) · up` (and the per-layer input's `gelu_tanh(gate) · input`; gemma.rs' `gelu_times`), and the
// logits' softcap `tanh(x / cap) · cap` (gemma.rs' `head`). ATen spends more of a decode step dispatching the
// first's two ops, 70 of each at E2B, than computing them, and runs the second's three over 262,144 logits one
// after the other. tanh.rs says when these run.
//
// ATen's bf16 gelu widens 16 (AVX-512) or 8 (AVX2) values at a time to float32 and runs Gelu.h's
// `vectorized_gelu_approximated_with_tanh` in the build its dispatch picks, then rounds to bf16; its compiled code
// (disassembled from torch 2.13's libtorch_cpu, both builds) is, lane by lane:
//   x³ = (x · x) · x,  inner = fma(x³, κ, x) · β,  g = (0.5 · x) · (1 + tanh(inner)),  rounded to bf16
// with tanh Sleef's `Sleef_tanhf16_u10` or `Sleef_tanhf8_u10`, which libtorch_cpu exports: called here too, so the
// tanh is the same function, not a copy of it. `mul` then widens g and up, multiplies, rounds; the softcap's `div`,
// `tanh` and `mul` each widen, compute (the same Sleef tanh) and round. All round as vec512/vec256_bfloat16.h's
// `cvtfp32_bf16` does: to nearest even, and every NaN to 0xFFFF (c10::BFloat16's scalar rounding, bf16.h, makes it
// 0x7FC0: only ATen's scalar tail loops use that, and tanh.rs gives these kernels no tail, n being a multiple of
// 64, ATen's AVX-512 loop step).
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>

extern "C" __m512 Sleef_tanhf16_u10(__m512);
extern "C" __m256 Sleef_tanhf8_u10(__m256);

namespace {

const float BETA = float(M_SQRT2 * M_2_SQRTPI * 0.5), KAPPA = float(0.044715);

__attribute__((target("avx512f"))) __m512 widened(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// cvtfp32_bf16 (vec512_bfloat16.h)
__attribute__((target("avx512f"))) __m256i rounded(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  __m512i r = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(r, _mm512_set1_epi32(0x7FFF)), bits), 16);
  r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), _mm512_set1_epi32(0xFFFF), r);
  return _mm512_cvtusepi32_epi16(r);
}

// v rounded to bf16, as float32 again: what the next op of ATen's reads
__attribute__((target("avx512f"))) __m512 through_bf16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded(v)), 16));
}

__attribute__((target("avx512f"))) void gelu_wide(const uint16_t* gate, const uint16_t* other, uint16_t* y, int64_t begin,
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

__attribute__((target("avx2,fma"))) __m256 widened8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

// cvtfp32_bf16 (vec256_bfloat16.h), 8 lanes: the 32-bit results, not yet packed
__attribute__((target("avx2,fma"))) __m256i rounded8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  __m256i r = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(r, _mm256_set1_epi32(0x7FFF)), bits), 16);
  return _mm256_blendv_epi8(_mm256_set1_epi32(0xFFFF), r, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));
}

__attribute__((target("avx2,fma"))) __m256 through_bf16_8(__m256 v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(rounded8(v), 16));
}

// rounded8's 8 results stored as bf16: packed within each 128-bit lane, then the two lanes' halves brought together
__attribute__((target("avx2,fma"))) void stored8(uint16_t* y, __m256i r) {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128((__m128i*)y, _mm256_castsi256_si128(packed));
}

__attribute__((target("avx2,fma"))) void gelu_narrow(const uint16_t* gate, const uint16_t* other, uint16_t* y,
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

__attribute__((target("avx512f"))) void softcap_wide(const uint16_t* x, uint16_t* y, float cap, int64_t begin,
                                                     int64_t end) {
  const __m512 c = _mm512_set1_ps(cap);
  for (int64_t i = begin; i < end; i += 16) {
    const __m512 t = through_bf16(Sleef_tanhf16_u10(through_bf16(_mm512_div_ps(widened(x + i), c))));
    _mm256_storeu_si256((__m256i*)(y + i), rounded(_mm512_mul_ps(t, c)));
  }
}

__attribute__((target("avx2,fma"))) void softcap_narrow(const uint16_t* x, uint16_t* y, float cap, int64_t begin,
                                                        int64_t end) {
  const __m256 c = _mm256_set1_ps(cap);
  for (int64_t i = begin; i < end; i += 8) {
    const __m256 t = through_bf16_8(Sleef_tanhf8_u10(through_bf16_8(_mm256_div_ps(widened8(x + i), c))));
    stored8(y + i, rounded8(_mm256_mul_ps(t, c)));
  }
}

}  // namespace

extern "C" bool torchtpu_tanh_supported() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// y[i] = bf16(bf16(gelu_tanh(gate[i])) · up[i]) for i < n, n a multiple of 64; `avx512`: as ATen's AVX-512 build
// (16 lanes, Sleef_tanhf16_u10), else as its AVX2 build (8 lanes, Sleef_tanhf8_u10).
extern "C" void torchtpu_gelu_times(const uint16_t* gate, const uint16_t* up, uint16_t* y, int64_t n, bool avx512) {
  // a prompt chunk's rows split between threads, in whole 64s (each lane is computed alone: the split changes no
  // bit); a decode step's one row, a few µs of work, stays on this thread
  at::parallel_for(0, n / 64, 256, [&](int64_t begin, int64_t end) {
    if (avx512)
      gelu_wide(gate, up, y, begin * 64, end * 64);
    else
      gelu_narrow(gate, up, y, begin * 64, end * 64);
  });
}

// y[i] = bf16(bf16(tanh(bf16(x[i] / cap))) · cap) for i < n, n a multiple of 64, split between threads as ATen's
// ops split theirs; `avx512` as above.
extern "C" void torchtpu_softcap(const uint16_t* x, uint16_t* y, float cap, int64_t n, bool avx512) {
  at::parallel_for(0, n / 64, 256, [&](int64_t begin, int64_t end) {
    if (avx512)
      softcap_wide(x, y, cap, begin * 64, end * 64);
    else
      softcap_narrow(x, y, cap, begin * 64, end * 64);
  });
}
