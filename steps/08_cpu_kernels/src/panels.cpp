// A prompt chunk's int4 product by panels: dot4's words turned back into weights a panel of rows at a time, each
// panel multiplied by torch's matmul. dot4.rs says when. Two kinds:
// - bf16 weights, on a CPU with AMX (dot4's): torch's bf16 matmul, which oneDNN runs on AMX's tiles;
// - float32 weights, on a CPU with AVX2 and no bf16 matmul hardware (fma4's): torch's float32 matmul (MKL's, in its
//   AVX2 code there), which does 8 multiply-adds an instruction as fma4 does, without fma4's widening of every
//   nibble once per four activation rows; and on an Intel CPU with AVX512-BF16 and no AMX (dot4's, cpu.rs), where
//   MKL's 16-lane float32 product outruns dot4's and oneDNN's bf16 pairs.
//
// Why: a chunk multiplies every weight by hundreds of activation rows, so it waits on arithmetic, not memory.
// dot4's `vdpbf16ps` does 32 multiply-adds an instruction; AMX's tile product does 16 × 16 × 32 (the bench's
// "bf16 matmul rate" line measures torch's on each machine). Unpacking costs a few instructions per weight once
// per chunk, where the kernels spend them once per four activation rows.
//
// What it computes: each weight (q − 8) · scale, exact in float32 (a 4-bit integer times a bf16 or f16 scale).
// bf16 panels round it once to bf16 (to nearest even) — with bf16 scales, the bits compressed-tensors'
// decompression and step 03's bf16 path give — then torch's bf16 product: bf16 × bf16 exact, float32 sums, rounded
// once. float32 panels keep it exact, as fma4 does: bf16 activations times those weights are exact in float32 (8
// and 12 significant bits), the sums float32, rounded once to bf16 — the W4A16 arithmetic fma4 computes, its sums in
// MKL's order.
#include "bf16.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstdint>

namespace {

// --8<-- [start:unpack]
// Blocks of 16 rows (words [K / 8, 16], scales [K / group, 16], dot4.cpp's layout; block i's `i * words` words and
// `i * scales` scales after block 0's) into wt [K, ld], k-major: the blocks' 16 weights of column k are neighbours
// wt[k, 16 i .. 16 i + 16]. Two blocks at a time where there are two (B = 2): their 32 weights of a column are one
// 64-byte store, a whole cache line, where a block alone writes half a line and its neighbour the other half long
// after.
template <int B, bool F16>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void unpack(const int32_t* w, const uint16_t* s, int64_t K,
                                                                    int64_t group, uint16_t* wt, int64_t ld) {
  const __m512i nibble = _mm512_set1_epi32(0xF);
  const __m512 eight = _mm512_set1_ps(8.0f);
  const int64_t words = K / 8 * 16, scales = K / group * 16;  // one block's
  for (int64_t g = 0; g < K / group; ++g) {
    __m512 scale[B];
    for (int i = 0; i < B; ++i) scale[i] = widened16<F16>(s + i * scales + g * 16);
    for (int64_t o = g * group / 8; o < (g + 1) * group / 8; ++o) {
      __m512i word[B];
      for (int i = 0; i < B; ++i) word[i] = _mm512_loadu_si512(w + i * words + o * 16);
      // nibble j of the row's octet at bit 4 (j / 2) + 16 (j % 2) (dot4.cpp's layout)
      for (int j = 0; j < 8; ++j) {
        __m256i out[B];
        for (int i = 0; i < B; ++i) {
          const __m512i q = _mm512_and_si512(_mm512_srli_epi32(word[i], 4 * (j / 2) + 16 * (j % 2)), nibble);
          const __m512 weight = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(q), eight), scale[i]);  // exact
          out[i] = (__m256i)_mm512_cvtneps_pbh(weight);
        }
        uint16_t* at = wt + (8 * o + j) * ld;
        if constexpr (B == 2)
          _mm512_storeu_si512(at, _mm512_inserti64x4(_mm512_castsi256_si512(out[0]), out[1], 1));
        else
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(at), out[0]);
      }
    }
  }
}
// --8<-- [end:unpack]

// --8<-- [start:unpack_float]
// The same block into float32 weights, exact, 8 lanes at a time (AVX2, FMA and F16C: fma4's CPUs).
template <bool F16>
__attribute__((target("avx2,fma,f16c"))) void unpack_float(const int32_t* w, const uint16_t* s, int64_t K,
                                                           int64_t group, float* wt, int64_t ld) {
  const __m256i nibble = _mm256_set1_epi32(0xF);
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int64_t g = 0; g < K / group; ++g) {
    const __m256 scale[2] = {widened8<F16>(s + g * 16), widened8<F16>(s + g * 16 + 8)};
    for (int64_t o = g * group / 8; o < (g + 1) * group / 8; ++o) {
      for (int h = 0; h < 2; ++h) {
        const __m256i word = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + o * 16 + h * 8));
        for (int j = 0; j < 8; ++j) {
          const __m256i q = _mm256_and_si256(_mm256_srli_epi32(word, 4 * (j / 2) + 16 * (j % 2)), nibble);
          const __m256 weight = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(q), eight), scale[h]);  // exact
          _mm256_storeu_ps(wt + (8 * o + j) * ld + h * 8, weight);
        }
      }
    }
  }
}
// --8<-- [end:unpack_float]

}  // namespace

// What the panels need of the CPU: AMX's bf16 tiles (their product is oneDNN's) and the AVX-512 the unpacking uses.
extern "C" bool torchtpu_panels_supported() {
  return __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("amx-tile") &&
         __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}

// The bf16 weights of `blocks` blocks of 16 rows, starting at dot4's words w and scales s (f16 where f16_scales, else
// bf16), into wt [K, 16 · blocks], k-major, the blocks split between torch's threads. Shapes as torchtpu_dot4_mm
// takes them (dot4.rs checks them).
extern "C" void torchtpu_unpack_panel(const int32_t* w, const uint16_t* s, bool f16_scales, uint16_t* wt, int64_t blocks,
                                      int64_t K, int64_t group) {
  // pairs of blocks, and the last one alone where their count is odd
  at::parallel_for(0, (blocks + 1) / 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t b = 2 * p;
      const int32_t* wb = w + b * (K / 8) * 16;
      const uint16_t* sb = s + b * (K / group) * 16;
      if (b + 1 < blocks)
        (f16_scales ? unpack<2, true> : unpack<2, false>)(wb, sb, K, group, wt + b * 16, 16 * blocks);
      else
        (f16_scales ? unpack<1, true> : unpack<1, false>)(wb, sb, K, group, wt + b * 16, 16 * blocks);
    }
  });
}

// The same, float32 weights (AVX2, FMA and F16C: what torchtpu_fma4_supported asks).
extern "C" void torchtpu_unpack_panel_float(const int32_t* w, const uint16_t* s, bool f16_scales, float* wt,
                                            int64_t blocks, int64_t K, int64_t group) {
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int32_t* wb = w + b * (K / 8) * 16;
      const uint16_t* sb = s + b * (K / group) * 16;
      (f16_scales ? unpack_float<true> : unpack_float<false>)(wb, sb, K, group, wt + b * 16, 16 * blocks);
    }
  });
}
