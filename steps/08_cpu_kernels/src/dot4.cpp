// This step's own int4 matmul for CPUs with AVX512-BF16 (an Intel Xeon with AMX, an AMD EPYC Zen 4): the same
// W4A16 arithmetic as ATen's kernel, in fewer instructions per weight and with the next page of weights always
// on its way from memory. dot4.rs says when it runs and what it computes; docs/steps/08_cpu_kernels/kernels.md why it is here.
//
// --8<-- [start:layout]
// Layout (made by dot4.rs from the checkpoint's words, a shuffle of the same bits):
//   checkpoint word, one row, columns k..k+7    q7 q6 q5 q4 q3 q2 q1 q0    nibble j at bit 4j
//   dot4 word                                   q7 q5 q3 q1 q6 q4 q2 q0    odd columns high, even columns low
//   (word >> 4i) & 0x000F000F | 0x43004300  =  [bf16 128 + q(2i+1) | bf16 128 + q(2i)]    for i = 0..3
//   words  int32 [N / 16, K / 8, 16]: the 16 rows of a block side by side, one 64-byte register per 8 columns;
//   scales bf16 or f16 [N / 16, K / group, 16]: the checkpoint's scales as stored, widened to float32 in the kernel
//   (both exactly): 2 bytes for 32 weights, Q4_0's count, where float32 scales made a matrix 11% larger.
// --8<-- [end:layout]
//
// Why that layout: `(word >> 4i) & 0x000F000F | 0x43004300` is, in each 32-bit lane, two bfloat16 numbers 128 + q
// (0x4300 is 128.0, whose last mantissa bit is worth 1), for columns k + 2i and k + 2i + 1 — a shift and one
// ternary-logic instruction. `vdpbf16ps` multiplies those pairs by the activations' bf16 pairs and adds both
// products to a float32 lane (bf16 times bf16 is exact in float32). Per group of columns, the sum over 128 + q is
// turned into the sum over q - 8 (the stored nibble is q + 8, see int4.rs) by taking off 136 times the group's
// activation sum, then scaled: y[n] = Σ_g scale[n, g] · (Σ_k (128 + nibble) · x[k] − 136 · Σ_k x[k]).
#include "bf16.h"
#include "blocks.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// How far ahead of the loads to ask for weights: one 4 KB page, past the page end where the hardware prefetcher
// stops, into L2 (`_MM_HINT_T1`), whose own prefetcher brings it on to L1. (Chosen by probes, not a recorded run: on
// an AMX Xeon a streamed [6144 x 1536] mat-vec went from about 16 GB/s without it to 28 with it, 1 and 16 KB ahead
// slower; on another AMX Xeon (2026-12-05, 0.85 GB of distinct copies, best of 7 x 200 calls, twice) from 12.8 GB/s
// without it to 15.0-17.2 into L1 and 20.8-21.2 into L2, 8 and 16 KB ahead into L2 the same. Step 05's bench
// records the kernel's rate as it is.)
constexpr int AHEAD = 4096;

// Rows m..m+R of y for one block of 16 outputs: x [R, K] bf16, corr [R, groups] the 136 · Σx of each group, s the
// block's scales (f16 if F16, else bf16).
template <int R, bool F16>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void block(const uint16_t* x, int64_t K, const float* corr,
                                                                   int64_t groups, const int32_t* w,
                                                                   const uint16_t* s, int64_t group, uint16_t* y,
                                                                   int64_t N) {
  const __m512i low_nibbles = _mm512_set1_epi32(0x000F000F);
  const __m512i bf16_128 = _mm512_set1_epi32(0x43004300);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t octets = group / 8;
  for (int64_t g = 0; g < groups; ++g) {
    // four sums per row, one per shift, so that four vdpbf16ps are in flight instead of one waiting on the last
    __m512 part[R][4];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) part[r][i] = _mm512_setzero_ps();
    // --8<-- [start:inner]
    for (int64_t o = 0; o < octets; ++o) {
      const int32_t* at = w + (g * octets + o) * 16;
      _mm_prefetch(reinterpret_cast<const char*>(at) + AHEAD, _MM_HINT_T1);
      const __m512i word = _mm512_loadu_si512(at);
      const int64_t k = (g * octets + o) * 8;
      for (int i = 0; i < 4; ++i) {
        // 0xEA: (a & b) | c
        const __m512i pair = _mm512_ternarylogic_epi32(_mm512_srli_epi32(word, 4 * i), low_nibbles, bf16_128, 0xEA);
        for (int r = 0; r < R; ++r) {
          int32_t xx;  // x[k + 2i] and x[k + 2i + 1], the pair each lane multiplies by
          std::memcpy(&xx, x + r * K + k + 2 * i, 4);
          part[r][i] = _mm512_dpbf16_ps(part[r][i], (__m512bh)pair, (__m512bh)_mm512_set1_epi32(xx));
        }
      }
    }
    // a group's scales are an eighth of its words' bytes: an eighth of the distance is as far ahead in time
    _mm_prefetch(reinterpret_cast<const char*>(s + g * 16) + AHEAD / 8, _MM_HINT_T0);
    const __m512 scale = widened16<F16>(s + g * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(part[r][0], part[r][1]), _mm512_add_ps(part[r][2], part[r][3]));
      acc[r] = _mm512_fmadd_ps(scale, _mm512_sub_ps(sum, _mm512_set1_ps(corr[r * groups + g])), acc[r]);
    }
    // --8<-- [end:inner]
  }
  rounded16(acc, R, y, N);
}

template <bool F16>
void multiply(const uint16_t* x, const int32_t* w, const uint16_t* s, uint16_t* y, int64_t M, int64_t N, int64_t K,
              int64_t group, int gelu_lanes, const uint16_t* up) {
  const int64_t groups = K / group;
  const std::vector<float> corr = corrections(x, M, K, group);
  // rows m..m+rows of block b's outputs into out, rows `stride` apart (blocks.h shares the blocks out)
  auto outputs = [&](int64_t b, int64_t m, int64_t rows, uint16_t* out, int64_t stride) {
    const int32_t* wb = w + b * (K / 8) * 16;
    const uint16_t* sb = s + b * groups * 16;
    const uint16_t* xm = x + m * K;
    const float* cm = corr.data() + m * groups;
    switch (rows) {
      case 1: block<1, F16>(xm, K, cm, groups, wb, sb, group, out, stride); break;
      case 2: block<2, F16>(xm, K, cm, groups, wb, sb, group, out, stride); break;
      case 3: block<3, F16>(xm, K, cm, groups, wb, sb, group, out, stride); break;
      default: block<4, F16>(xm, K, cm, groups, wb, sb, group, out, stride); break;
    }
  };
  write_blocks<4>(M, N, gelu_lanes, up, y, outputs);
}

}  // namespace

extern "C" bool torchtpu_dot4_supported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
}

// y [M, N] = x [M, K] · Wᵀ, x and y bf16, the scales s bf16 or (f16_scales) f16; shapes checked by dot4.rs (N % 16,
// K % group, group % 8). With gelu_lanes 16 or 8, y = gelu_tanh(x · gateᵀ) · up, the gelu in 16- or 8-lane registers as
// ATen's AVX-512 or AVX2 build computes it: W is [gate; up] in pairs of blocks and up = x · upᵀ, y [M, N / 2]; or,
// with `up` given (bf16 [M, N]), W is gate, y [M, N].
extern "C" void torchtpu_dot4_mm(const uint16_t* x, const int32_t* w, const uint16_t* s, bool f16_scales,
                                 uint16_t* y, int64_t M, int64_t N, int64_t K, int64_t group, int gelu_lanes,
                                 const uint16_t* up) {
  (f16_scales ? multiply<true> : multiply<false>)(x, w, s, y, M, N, K, group, gelu_lanes, up);
}
