// This step's int4 matmul for CPUs with AVX2, FMA and F16C but no AVX512-BF16 (AMD Zen 2 and 3, Intel desktops and
// laptops before Sapphire Rapids, and any CPU kept to AVX2): the same W4A16 arithmetic as dot4.cpp, on the same
// layout (dot4.cpp draws it), in 8-lane float32 registers. And the same in AVX-512's 16 lanes (block16 below), which
// takes a short prompt's rows from dot4 on an Intel CPU without AMX. dot4.rs says when each runs and what it computes.
//
// --8<-- [start:idea]
// A nibble is never shifted into place: `word & (0xF << 4p)` is u · 16^p, an integer that `vcvtdq2ps` turns into
// float32 exactly (4 significant bits), so one AND, one convert and one FMA take 8 weights. The 16^p is undone on
// the activations' side: each column's activation is stored once, before the product, times 16^-p for the
// position p its nibble sits at (the top nibble is shifted down instead, so the smallest factor is 2^-24) — powers
// of two, so every product u · x is exactly the one the arithmetic names. Per group of columns the sum over the
// stored u = q + 8 becomes the sum over q by taking off 8 · Σx, then the group's scale (bf16 or f16, widened to
// float32 exactly) multiplies it:
//   y[n] = Σ_g scale[n, g] · (Σ_k u[n, k] · x[k] − 8 · Σ_k x[k]),   rounded once to bf16.
// --8<-- [end:idea]
// A row's activations are first scaled by a power of two that brings its largest to [2^30, 2^31) (undone on the
// output), so the 2^-24 never takes a small activation below float32's normal range: every product is exact for
// activations within 2^133 of their row's largest.
//
// --8<-- [start:subnormal]
// On AMD's cores even the convert is one instruction too many: a decode step's row spends an AND, a convert and an
// FMA on 8 weights, and the convert runs on fewer of the core's vector pipes than the other two, so the arithmetic,
// not memory, set the pace. So there (cpu.rs decides) the masked word is not converted at all: with its nibble at
// bit 4p below bit 23 and nothing else, its bits are a float32 subnormal, u · 2^(4p - 149), which an FMA multiplies
// exactly like any float. The three nibbles at bit 20 and above are shifted down to bit 0 instead of masked in
// place. Each column's activation is stored times 2^(149 - b) for the bit b its nibble is read at, instead of 16^-p;
// for that to stay below float32's largest, a row is scaled to [2^-22, 2^-21) rather than [2^30, 2^31). The products
// and sums are then the same ones scaled by another power of two, so y has the same bits either way, for
// activations within 2^104 of their row's largest. Subnormal inputs would read as zero with the CPU's
// denormals-are-zero flag set (torch.set_flush_denormal(True) sets it), so each block clears it while it runs.
// --8<-- [end:subnormal]
#include "bf16.h"
#include "blocks.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <variant>
#include <vector>

namespace {

// As dot4.cpp: one 4 KB page ahead of the loads (a block's weights are one stream), into L2. (The same probe under
// the AVX2 limit: 15.2 GB/s into L1, 18.1-18.2 into L2.)
constexpr int AHEAD = 4096;

// Where column k + c of an octet has its nibble in a dot4 word: columns k + 2i at bit 4i, k + 2i + 1 at 16 + 4i.
constexpr int position(int c) { return c % 2 == 0 ? c / 2 : 4 + c / 2; }

// What a column's activation is multiplied by so that (u · 16^p) · that = u · x: 16^-p, and 1 for the top nibble
// (p = 7), which is shifted down rather than masked.
float undo(int c) {
  const int p = position(c);
  return p == 7 ? 1.0f : std::ldexp(1.0f, -4 * p);
}

// In the subnormal form (SUB below) a nibble below bit 20 is read where it lies; the three above (p = 5, 6, 7) are
// shifted down to bit 0 first, each by its own shift (one shifted word held for all three took two more registers
// than the sums leave). The bit column c's nibble is read at:
constexpr int subnormal_bit(int c) { return position(c) <= 4 ? 4 * position(c) : 0; }

// What a column's activation is multiplied by in the subnormal form: 2^(149 - bit), in two factors, since 2^149 is
// beyond float32: 2^64 (LIFT) and 2^(85 - bit).
constexpr float LIFT = 18446744073709551616.0f;  // 2^64
float undo_subnormal(int c) { return std::ldexp(1.0f, 85 - subnormal_bit(c)); }

// The masks that leave column c's nibble where it lies (the top one is shifted down instead: unused), read from
// memory by the AND itself: seven constants held in registers crowded out the sums, which then went through the
// stack at every octet (the first version of this kernel, 0.58 of the copy warm on an AMD EPYC).
alignas(32) const int32_t MASKS[8][8] = {
#define M(p) {0xF << (4 * p), 0xF << (4 * p), 0xF << (4 * p), 0xF << (4 * p), \
              0xF << (4 * p), 0xF << (4 * p), 0xF << (4 * p), 0xF << (4 * p)}
    M(0), M(4), M(1), M(5), M(2), M(6), M(3), {0, 0, 0, 0, 0, 0, 0, 0}};
// and those of the subnormal form, for column c's nibble at subnormal_bit(c) (the top one unused)
alignas(32) const int32_t SUBNORMAL_MASKS[8][8] = {M(0), M(4), M(1), M(0), M(2), M(0), M(3), M(0)};
#undef M

// While a block is computed, the CPU's denormals-are-zero flag (MXCSR's bit 6) cleared where it was set, so the
// subnormal form's nibbles read as what they are; the thread's flags restored after.
class SubnormalsRead {
 public:
  SubnormalsRead() : saved_(_mm_getcsr()) {
    if (saved_ & DAZ) _mm_setcsr(saved_ & ~DAZ);
  }
  ~SubnormalsRead() {
    if (saved_ & DAZ) _mm_setcsr(saved_);
  }
  SubnormalsRead(const SubnormalsRead&) = delete;
  SubnormalsRead& operator=(const SubnormalsRead&) = delete;

 private:
  static constexpr unsigned DAZ = 1u << 6;
  unsigned saved_;
};

// Rows m..m+R of y for one block of 16 outputs. xs [R, K] float32: the activations scaled as above; corr [R,
// groups]: 8 · Σx of each group, scaled alike; unscale [R]: the power of two that undoes the row's scaling; s the
// block's scales (f16 if F16, else bf16). SUB: the nibbles read as subnormals, not converted.
template <int R, bool F16, bool SUB>
__attribute__((target("avx2,fma,f16c"))) void block(const float* xs, int64_t K, const float* corr, int64_t groups,
                                                    const float* unscale, const int32_t* w, const uint16_t* s,
                                                    int64_t group, uint16_t* y, int64_t N) {
  // P sums per row and half, so that enough FMAs are in flight (an FMA waits 4 cycles for its sum), and no more:
  // every register a sum takes is one the compiler cannot give a word or a product
  constexpr int P = R == 1 ? 3 : R == 2 ? 2 : 1;
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int64_t octets = group / 8;
  const int32_t* at = w;
  const float* xk = xs;
  for (int64_t g = 0; g < groups; ++g) {
    __m256 part[R][2][P];
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < P; ++i) part[r][h][i] = _mm256_setzero_ps();
    // --8<-- [start:inner]
    for (int64_t o = 0; o < octets; ++o, at += 16, xk += 8) {
      _mm_prefetch(reinterpret_cast<const char*>(at) + AHEAD, _MM_HINT_T1);
      const __m256i word[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 8))};
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {  // column k + c, its nibble at bit 4p of every lane
        const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(SUB ? SUBNORMAL_MASKS[c] : MASKS[c]));
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          // u · 16^p (u for the top nibble), or SUB: the bits of u · 2^(subnormal_bit - 149)
          const __m256i shifted = SUB && position(c) > 4 ? _mm256_srli_epi32(word[h], 4 * position(c)) : word[h];
          const __m256i nibble = c == 7 ? _mm256_srli_epi32(word[h], 28) : _mm256_and_si256(shifted, mask);
          const __m256 u = SUB ? _mm256_castsi256_ps(nibble) : _mm256_cvtepi32_ps(nibble);  // exact
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r)
            part[r][h][c % P] = _mm256_fmadd_ps(u, _mm256_broadcast_ss(xk + r * K + c), part[r][h][c % P]);
        }
      }
    }
    // --8<-- [end:inner]
    // as dot4: a group's scales are an eighth of its words' bytes, so an eighth of the distance ahead
    _mm_prefetch(reinterpret_cast<const char*>(s + g * 16) + AHEAD / 8, _MM_HINT_T0);
    for (int h = 0; h < 2; ++h) {
      const __m256 scale = widened8<F16>(s + g * 16 + h * 8);
      for (int r = 0; r < R; ++r) {
        __m256 sum = part[r][h][0];
        for (int i = 1; i < P; ++i) sum = _mm256_add_ps(sum, part[r][h][i]);
        acc[r][h] = _mm256_fmadd_ps(scale, _mm256_sub_ps(sum, _mm256_set1_ps(corr[r * groups + g])), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    __m256i out[2];
    for (int h = 0; h < 2; ++h) {
      // float32 to bf16, rounded to nearest even (AVX2 has no instruction for it); NaN stays a quiet NaN
      const __m256 v = _mm256_mul_ps(acc[r][h], _mm256_set1_ps(unscale[r]));
      const __m256i bits = _mm256_castps_si256(v);
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
      const __m256i rounded =
          _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
      const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      out[h] = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
    }
    // packus interleaves the two halves by 128-bit lane; the permute puts the 16 outputs back in order
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(out[0], out[1]), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * N), packed);
  }
}

// Rows of x a 16-lane pass takes (blocks.h's ROWS for block16): 8 rows' two sums each and the block's accumulators
// leave registers for the word, its nibble and the masks.
constexpr int64_t PASS = 8;

// --8<-- [start:wide]
// The same arithmetic in AVX-512's 16-lane registers, for a prompt's rows on an Intel CPU with AVX-512 and no AMX
// (dot4.rs says when; AVX-512 F and BW are all it takes). Beside dot4: a 512-bit FMA issues twice a cycle and
// `vdpbf16ps`, which does twice an FMA's multiply-adds, once every two cycles (a probe on an AMX Xeon, 2026-12-06: 7.5
// G FMAs/s on one core, 1.8 G vdpbf16ps/s), so once a prompt's rows share each unpacked weight, float32 FMAs do twice
// the work per cycle. Beside fma4 (a CPU with AVX-512 and no AVX512-BF16): twice the lanes. A block's 16 rows of W
// are one register, so a word's 8 nibbles take 8 masks (or the shift), 8 converts and 8 FMAs per row of x; with 8
// rows of x a pass, 4 in 5 of the vector instructions are the product's own.
// Each row's sums are the same two per group whatever the pass's count of rows, so a row of y has the same bits in
// any pass; the embedded broadcast ({1to16}) reads an activation straight into its FMA.
// Rows m..m+R of y for one block of 16 outputs, as block's, but xs is the pass's [K, PASS]: column k's activations of
// its rows side by side at one address (with x's rows K apart, eight row pointers crowded out the sums and were
// reloaded from the stack before every FMA).
template <int R, bool F16>
__attribute__((target("avx512f,avx512bw"))) void block16(const float* xs, const float* corr, int64_t groups,
                                                                     const float* unscale, const int32_t* w,
                                                                     const uint16_t* s, int64_t group, uint16_t* y,
                                                                     int64_t N) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t octets = group / 8;
  const int32_t* at = w;
  const float* xk = xs;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 part[R][2];  // columns k + c for even c, and odd: two sums in flight per row
    for (int r = 0; r < R; ++r) part[r][0] = part[r][1] = _mm512_setzero_ps();
    for (int64_t o = 0; o < octets; ++o, at += 16, xk += 8 * PASS) {
      _mm_prefetch(reinterpret_cast<const char*>(at) + AHEAD, _MM_HINT_T1);
      const __m512i word = _mm512_loadu_si512(at);
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i nibble =
            c == 7 ? _mm512_srli_epi32(word, 28) : _mm512_and_si512(word, _mm512_set1_epi32(0xF << (4 * position(c))));
        const __m512 u = _mm512_cvtepi32_ps(nibble);  // u · 16^p (u for the top nibble), exact
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          part[r][c % 2] = _mm512_fmadd_ps(u, _mm512_set1_ps(xk[c * PASS + r]), part[r][c % 2]);
      }
    }
    _mm_prefetch(reinterpret_cast<const char*>(s + g * 16) + AHEAD / 8, _MM_HINT_T0);
    const __m512 scale = widened16<F16>(s + g * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 sum = _mm512_add_ps(part[r][0], part[r][1]);
      acc[r] = _mm512_fmadd_ps(scale, _mm512_sub_ps(sum, _mm512_set1_ps(corr[r * groups + g])), acc[r]);
    }
  }
  // rounded once to bf16 by integer instructions (gelu.h's, ATen's own), not AVX512-BF16's convert: AVX-512 F suffices
  for (int r = 0; r < R; ++r) {
    const __m512 out = _mm512_mul_ps(acc[r], _mm512_set1_ps(unscale[r]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * N), gelu::rounded(out));
  }
}
// --8<-- [end:wide]

template <bool F16, bool WIDE, bool SUB = false>
void multiply(const uint16_t* x, const int32_t* w, const uint16_t* s, uint16_t* y, int64_t M, int64_t N, int64_t K,
              int64_t group, int gelu_lanes, const uint16_t* up) {
  const int64_t groups = K / group;
  // the scaled activations: [M, K], or for the 16-lane blocks [M / PASS, K, PASS] (rows padded with zeros)
  std::vector<float> xs(WIDE ? (M + PASS - 1) / PASS * PASS * K : M * K), corr(M * groups), unscale(M);
  float factor[8];
  for (int c = 0; c < 8; ++c) factor[c] = SUB ? undo_subnormal(c) : undo(c);
  const float lift = SUB ? LIFT : 1.0f;
  const int top = SUB ? -21 : 31;  // the row's largest brought to [2^(top - 1), 2^top)
  for (int64_t m = 0; m < M; ++m) {
    // the largest finite activation (an infinite one or a NaN makes every output of its row infinite or NaN anyway)
    float largest = 0;
    for (int64_t k = 0; k < K; ++k) {
      const float a = std::fabs(bf16_to_float(x[m * K + k]));
      if (std::isfinite(a)) largest = std::max(largest, a);
    }
    int e = 0;
    if (largest > 0) std::frexp(largest, &e);  // largest in [2^(e-1), 2^e)
    const int shift = largest > 0 ? top - e : 0;
    unscale[m] = std::ldexp(1.0f, -shift);
    // x · 2^shift as std::ldexp rounds it: one multiply where 2^shift is a normal float32, not a libm call per value
    const bool normal = shift >= -126 && shift <= 127;
    const float power = normal ? std::ldexp(1.0f, shift) : 0.0f;
    float* xsm = WIDE ? xs.data() + m / PASS * PASS * K + m % PASS : xs.data() + m * K;
    const int64_t step = WIDE ? PASS : 1;
    group_sums(x + m * K, groups, group, 8.0f, corr.data() + m * groups, [&](int64_t k, float value) {
      const float v = normal ? value * power : std::ldexp(value, shift);
      xsm[k * step] = v * lift * factor[k % 8];
      return v;
    });
  }
  // rows m..m+rows of block b's outputs into out, rows `stride` apart (blocks.h shares the blocks out)
  auto outputs = [&](int64_t b, int64_t m, int64_t rows, uint16_t* out, int64_t stride) {
    const int32_t* wb = w + b * (K / 8) * 16;
    const uint16_t* sb = s + b * groups * 16;
    const float* xm = xs.data() + m * K;  // for the 16-lane blocks, m is a multiple of PASS: pass m / PASS
    const float* cm = corr.data() + m * groups;
    const float* um = unscale.data() + m;
    // SUB: kept out of `block` itself, where it cost the sums their registers
    [[maybe_unused]] const std::conditional_t<SUB, SubnormalsRead, std::monostate> flags;
    if constexpr (WIDE) {
      switch (rows) {
        case 1: block16<1, F16>(xm, cm, groups, um, wb, sb, group, out, stride); break;
        case 2: block16<2, F16>(xm, cm, groups, um, wb, sb, group, out, stride); break;
        case 3: block16<3, F16>(xm, cm, groups, um, wb, sb, group, out, stride); break;
        case 4: block16<4, F16>(xm, cm, groups, um, wb, sb, group, out, stride); break;
        case 5: block16<5, F16>(xm, cm, groups, um, wb, sb, group, out, stride); break;
        case 6: block16<6, F16>(xm, cm, groups, um, wb, sb, group, out, stride); break;
        case 7: block16<7, F16>(xm, cm, groups, um, wb, sb, group, out, stride); break;
        default: block16<8, F16>(xm, cm, groups, um, wb, sb, group, out, stride); break;
      }
    } else {
      switch (rows) {
        case 1: block<1, F16, SUB>(xm, K, cm, groups, um, wb, sb, group, out, stride); break;
        case 2: block<2, F16, SUB>(xm, K, cm, groups, um, wb, sb, group, out, stride); break;
        case 3: block<3, F16, SUB>(xm, K, cm, groups, um, wb, sb, group, out, stride); break;
        default: block<4, F16, SUB>(xm, K, cm, groups, um, wb, sb, group, out, stride); break;
      }
    }
  };
  write_blocks<WIDE ? PASS : 4>(M, N, gelu_lanes, up, y, outputs);
}

}  // namespace

extern "C" bool torchtpu_fma4_supported() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

// y [M, N] = x [M, K] · Wᵀ, x and y bf16, the scales s bf16 or (f16_scales) f16; shapes checked by dot4.rs (N % 16,
// K % group, group % 8). gelu_lanes as torchtpu_dot4_mm's.
extern "C" void torchtpu_fma4_mm(const uint16_t* x, const int32_t* w, const uint16_t* s, bool f16_scales,
                                 uint16_t* y, int64_t M, int64_t N, int64_t K, int64_t group, int gelu_lanes,
                                 const uint16_t* up) {
  (f16_scales ? multiply<true, false> : multiply<false, false>)(x, w, s, y, M, N, K, group, gelu_lanes, up);
}

// The same product, its nibbles read as float32 subnormals (the header's second part): the same bits of y.
extern "C" void torchtpu_fma4_subnormal_mm(const uint16_t* x, const int32_t* w, const uint16_t* s, bool f16_scales,
                                           uint16_t* y, int64_t M, int64_t N, int64_t K, int64_t group,
                                           int gelu_lanes, const uint16_t* up) {
  (f16_scales ? multiply<true, false, true> : multiply<false, false, true>)(x, w, s, y, M, N, K, group, gelu_lanes,
                                                                            up);
}

extern "C" bool torchtpu_fma16_supported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

// The same product by AVX-512's 16 lanes (block16), for CPUs with AVX-512 F and BW.
extern "C" void torchtpu_fma16_mm(const uint16_t* x, const int32_t* w, const uint16_t* s, bool f16_scales,
                                  uint16_t* y, int64_t M, int64_t N, int64_t K, int64_t group, int gelu_lanes,
                                  const uint16_t* up) {
  (f16_scales ? multiply<true, true> : multiply<false, true>)(x, w, s, y, M, N, K, group, gelu_lanes, up);
}
