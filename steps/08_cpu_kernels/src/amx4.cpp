// dot4's products of a short prompt's rows on a CPU with AMX: the same words, the same arithmetic, multiplied by
// AMX's tiles instead of `vdpbf16ps`. dot4.rs says when it runs.
//
// --8<-- [start:idea]
// dot4's `(word >> 4i) & 0x000F000F | 0x43004300` is, lane by lane, the pair (128 + q(k + 2i), 128 + q(k + 2i + 1))
// of one output row: 16 lanes, 16 output rows. That is one 64-byte row of the B tile `tdpbf16ps` takes (VNNI order:
// B row p holds column pair p of every output). So per group of 32 columns, 16 shifts-and-masks of 4 words write B
// (1 KB, in L1) and one `tdpbf16ps` multiplies 16 rows of activations by it: 16 × 16 × 32 products where dot4's
// `vdpbf16ps` does 16 × 2 each. The group's float32 sums come out of the C tile and are turned into the output as
// dot4 turns them: scale · (sum over 128 + nibble − 136 · Σx), accumulated in float32 across groups.
// --8<-- [end:idea]
//
// What it computes: dot4's W4A16 arithmetic — each product (128 + nibble) · x exact (bf16 × bf16 in float32), float32
// sums (the tile's, in its own order), scales applied per group in float32, rounded once to bf16. With no panel of
// unpacked weights in memory (panels.cpp), a 19-row product costs about what 5 rows cost dot4.
#include "bf16.h"
#include "blocks.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// As dot4.cpp: one 4 KB page ahead of the loads, into L2.
constexpr int AHEAD = 4096;

// The tiles, all 16 rows of 64 bytes: the float32 sums [16 rows × 16 outputs] of an even group of columns in 0 (x's
// rows 0..15 of a tile of rows) and 1 (rows 16..31), of an odd group in 2 and 3; the activations (32 bf16 columns of
// 16 rows) in 4 and 5; the weights (16 column pairs × 16 outputs × 2) of an even group in 6, of an odd one in 7. Two
// groups in flight, one's products running while the other's sums are stored and rescaled: a group at a time, each
// waiting on the one before, E2B's [12288 × 1536] took 0.95 ms at 16 rows and 1.45 at 19, two at a time 0.74 and
// 1.0-1.24 (the AMX Xeon, 2026-12-06, 2 threads). multiply() pads x to whole tiles of 16 rows, so one configuration
// serves every call.
struct Config {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// The tile configuration is each thread's own (and oneDNN's kernels load theirs on torch's same threads): loaded at
// the start of every block, released at its end.
__attribute__((target("amx-tile"))) void configure() {
  Config config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

// --8<-- [start:inner]
// Group g's sums into the tiles of its parity P (TWO: x's rows 16..31 too), 32 columns at a time: B made from the
// columns' 4 words in the buffer b (1 KB, in L1), loaded, and multiplied by each 16 rows of x. (GCC pastes a tile's
// number into the assembly as written, so each parity's tiles are spelled out.)
template <int P, bool TWO>
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw"))) inline void products(const uint16_t* x, int64_t K,
                                                                                   const int32_t* w, int64_t g,
                                                                                   int64_t group, int32_t* b) {
  const __m512i low_nibbles = _mm512_set1_epi32(0x000F000F);
  const __m512i bf16_128 = _mm512_set1_epi32(0x43004300);
  const uint16_t* high = x + 16 * K;  // rows 16..31
  if constexpr (P == 0) {
    _tile_zero(0);
    if constexpr (TWO) _tile_zero(1);
  } else {
    _tile_zero(2);
    if constexpr (TWO) _tile_zero(3);
  }
  for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
    const int32_t* at = w + k / 8 * 16;  // the 4 words of columns k..k+31
    for (int o = 0; o < 4; ++o) {
      _mm_prefetch(reinterpret_cast<const char*>(at + o * 16) + AHEAD, _MM_HINT_T1);
      const __m512i word = _mm512_loadu_si512(at + o * 16);
      for (int i = 0; i < 4; ++i)  // 0xEA: (a & b) | c
        _mm512_store_si512(b + (4 * o + i) * 16,
                           _mm512_ternarylogic_epi32(_mm512_srli_epi32(word, 4 * i), low_nibbles, bf16_128, 0xEA));
    }
    // 16 rows of x, 2K bytes apart, in 4 (and 16..31 in 5; alone, an odd group's in 5)
    if constexpr (P == 0) {
      _tile_loadd(6, b, 64);
      _tile_loadd(4, x + k, K * 2);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (TWO) {
        _tile_loadd(5, high + k, K * 2);
        _tile_dpbf16ps(1, 5, 6);
      }
    } else if constexpr (TWO) {
      _tile_loadd(7, b, 64);
      _tile_loadd(4, x + k, K * 2);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, high + k, K * 2);
      _tile_dpbf16ps(3, 5, 7);
    } else {
      _tile_loadd(7, b, 64);
      _tile_loadd(5, x + k, K * 2);
      _tile_dpbf16ps(2, 5, 7);
    }
  }
}

// Group g's sums out of the tiles of its parity (sums [rows, 16]) into each row's float32 outputs: acc[r] += scale ·
// (sum − 136 · Σx), dot4's turn of the sum over 128 + nibble into the sum over q.
template <int P, bool TWO, bool F16>
__attribute__((target("amx-tile,avx512f,avx512bw"))) inline void rescaled(__m512* acc, int64_t rows, float* sums,
                                                                          const float* corr, int64_t groups, int64_t g,
                                                                          const uint16_t* s) {
  if constexpr (P == 0) {
    _tile_stored(0, sums, 64);
    if constexpr (TWO) _tile_stored(1, sums + 16 * 16, 64);
  } else {
    _tile_stored(2, sums, 64);
    if constexpr (TWO) _tile_stored(3, sums + 16 * 16, 64);
  }
  _mm_prefetch(reinterpret_cast<const char*>(s + g * 16) + AHEAD / 8, _MM_HINT_T0);
  const __m512 scale = widened16<F16>(s + g * 16);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 sum = _mm512_load_ps(sums + r * 16);
    acc[r] = _mm512_fmadd_ps(scale, _mm512_sub_ps(sum, _mm512_set1_ps(corr[r * groups + g])), acc[r]);
  }
}
// --8<-- [end:inner]

// Rows m..m+rows of y (rows ≤ 32; TWO: more than 16) for one block of 16 outputs: x the padded activations from row
// m (whole tiles of 16 rows, K columns), corr [rows, groups] the 136 · Σx of each group, s the block's scales. Two
// groups at a time, so that one group's products run while the other's sums are stored and rescaled.
template <bool F16, bool TWO>
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16"))) void block(
    const uint16_t* x, int64_t K, const float* corr, int64_t groups, const int32_t* w, const uint16_t* s,
    int64_t group, uint16_t* y, int64_t N, int64_t rows) {
  alignas(64) int32_t b[2][16 * 16];  // B of an even and an odd group
  alignas(64) float sums[2][32 * 16];  // their C tiles, stored
  __m512 acc[32];
  for (int64_t r = 0; r < rows; ++r) acc[r] = _mm512_setzero_ps();
  configure();
  for (int64_t g = 0; g < groups; g += 2) {
    const bool odd = g + 1 < groups;  // an odd group after this even one
    products<0, TWO>(x, K, w, g, group, b[0]);
    if (odd) products<1, TWO>(x, K, w, g + 1, group, b[1]);
    rescaled<0, TWO, F16>(acc, rows, sums[0], corr, groups, g, s);
    if (odd) rescaled<1, TWO, F16>(acc, rows, sums[1], corr, groups, g + 1, s);
  }
  _tile_release();
  rounded16(acc, rows, y, N);
}

template <bool F16>
void multiply(const uint16_t* x, const int32_t* w, const uint16_t* s, uint16_t* y, int64_t M, int64_t N, int64_t K,
              int64_t group, int gelu_lanes, const uint16_t* up) {
  const int64_t groups = K / group;
  const std::vector<float> corr = corrections(x, M, K, group);
  // x in whole tiles of 16 rows, zeros after its last: a tile load reads 16 rows, and the zeros' sums are not written
  const int64_t padded = (M + 15) / 16 * 16;
  std::vector<uint16_t> copy;
  if (padded != M) {
    copy.assign(padded * K, 0);
    std::memcpy(copy.data(), x, M * K * sizeof(uint16_t));
    x = copy.data();
  }
  // rows m..m+rows (at most 32) of block b's outputs into out, rows `stride` apart, from the padded x
  auto outputs = [&](int64_t b, int64_t m, int64_t rows, uint16_t* out, int64_t stride) {
    const int32_t* wb = w + b * (K / 8) * 16;
    const uint16_t* sb = s + b * groups * 16;
    const uint16_t* xm = x + m * K;
    const float* cm = corr.data() + m * groups;
    if (rows > 16)
      block<F16, true>(xm, K, cm, groups, wb, sb, group, out, stride, rows);
    else
      block<F16, false>(xm, K, cm, groups, wb, sb, group, out, stride, rows);
  };
  write_blocks<32>(M, N, gelu_lanes, up, y, outputs);
}

}  // namespace

// AMX's tiles and bf16 product, the AVX-512 of dot4's words, and Linux's leave to use the tiles' 8 KB of state (asked
// once for the process; a kernel that refuses it, or predates it, refuses the kernel).
extern "C" bool torchtpu_amx4_supported() {
  static const bool supported = [] {
    const bool flags = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
                       __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return flags && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return supported;
}

// As torchtpu_dot4_mm, on dot4's layout, for groups of a multiple of 32 columns (all the kernels take).
extern "C" void torchtpu_amx4_mm(const uint16_t* x, const int32_t* w, const uint16_t* s, bool f16_scales,
                                 uint16_t* y, int64_t M, int64_t N, int64_t K, int64_t group, int gelu_lanes,
                                 const uint16_t* up) {
  (f16_scales ? multiply<true> : multiply<false>)(x, w, s, y, M, N, K, group, gelu_lanes, up);
}
