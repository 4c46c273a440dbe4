// A decode step's attention over one layer's cache, for CPUs with AVX2 and FMA (every CPU either int4 kernel runs
// on): one query token's heads against the slots it attends over, in one call instead of ATen's seven (two batched
// matmuls, a transpose, a masked fill, a softmax, the reshapes). attend.rs says when it runs and what it computes.
//
// What ATen spends a decode step's attention on is not the cache's bytes: two bf16 matmuls of one query row
// cost 30-50 µs each on an AMD EPYC whatever the slot count (oneDNN's set-up for a tiny problem), so 35 layers of
// attention took 9 ms of a 57 ms step for 37 MB, a tenth of what memory delivers (docs/runs/cpu-e2b/07_budget.txt).
// Here each slot's key is read once, against every query head that shares it, and each value row once.
//
// The arithmetic is ATen's, in other orders of sums (as the int4 kernels): scores s = k · q summed in float32, in
// bf16 attention rounded to bf16 as the matmul's output is; masked slots are left out (probability exactly 0); the
// softmax in float32 (max, exp, sum, one multiply by the sum's reciprocal), in bf16 attention its probabilities
// rounded to bf16; out = Σ p · v in float32, rounded once to bf16. Scaling is 1.0 (Gemma 4's q and k are normed).
// The caches may be bf16 in float32 attention too: their keys and values are bf16 values, widened exactly as they are
// loaded, so half the bytes give the same bits as a float32 cache.
#include "bf16.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

// 8 cache values from slot row `row` at column `c` as float32: bf16 widened exactly, or float32 as stored.
template <bool BF16>
__attribute__((target("avx2,fma"))) inline __m256 load8(const void* row, int64_t c) {
  if constexpr (BF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(row) + c);
  }
}

__attribute__((target("avx2,fma"))) inline float sum8(__m256 v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)));
}

constexpr int64_t MAX_GROUP = 8;  // query heads whose sums the kernels keep in registers at once
constexpr int64_t SLOT_TILE = 32;  // value rows a column block's sums pass over before the next block's
// Keys are fetched AHEAD slots before they are scored and a tile's value rows while the tile before it is summed:
// without, both passes waited on memory most of their time (probes on an AMX Xeon, 2026-12-05: a 32k cache's layer
// streamed from memory took 11 ms without, 6.9 with them).
constexpr int64_t AHEAD = 4;

// f(std::integral_constant<int, n>) for n = 1..MAX_GROUP: the kernels below keep their n heads' sums in
// registers, which takes n known when they are compiled.
template <typename F>
void with_heads(int64_t n, F f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

// --8<-- [start:score]
// Scores of N query rows qf [N, d] (float32) against the keys of the seen slots in [begin, end): scores[h * S + s].
template <bool BF16, int N>
__attribute__((target("avx2,fma"))) void score(const float* qf, const char* k, int64_t slot_bytes, int64_t d,
                                               const bool* masked, int64_t S, int64_t begin, int64_t end,
                                               float* scores) {
  constexpr int64_t SIZE = BF16 ? 2 : 4, LINE = 64 / SIZE;
  for (int64_t s = begin; s < end; ++s) {
    if (masked[s]) continue;
    const void* key = k + s * slot_bytes;
    const bool fetch = s + AHEAD < end && !masked[s + AHEAD];  // never a slot the pass will not read
    __m256 acc[N];
    for (int h = 0; h < N; ++h) acc[h] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; c += 8) {
      if (fetch && c % LINE == 0)
        _mm_prefetch(static_cast<const char*>(key) + AHEAD * slot_bytes + c * SIZE, _MM_HINT_T0);
      const __m256 kc = load8<BF16>(key, c);
      for (int h = 0; h < N; ++h) acc[h] = _mm256_fmadd_ps(kc, _mm256_loadu_ps(qf + h * d + c), acc[h]);
    }
    for (int h = 0; h < N; ++h) scores[h * S + s] = sum8(acc[h]);
  }
}
// --8<-- [end:score]

// 8 lanes of v rounded to bf16 (to nearest even, NaN a quiet NaN: bf16.h's float_to_bf16) and widened again.
__attribute__((target("avx2,fma"))) inline __m256 through_bf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i up = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd);
  const __m256 rounded = _mm256_castsi256_ps(_mm256_and_si256(up, _mm256_set1_epi32(int(0xFFFF0000))));
  return _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), rounded, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
}

// The slots a query sees: `lanes[s]` all ones where slot s is seen, zeros where it is masked and for 8 slots past
// the last, and the span [lo, hi) that holds them. A decode step sees a run of its bucket's slots (the bucket is
// 64 slots for a short context), so every loop runs over the span alone, and nothing is fetched for a slot that
// is not seen.
struct Seen {
  std::vector<int32_t> lanes;
  int64_t lo, hi;
};

Seen seen_slots(const bool* masked, int64_t S) {
  Seen seen{std::vector<int32_t>(S + 8, 0), S, 0};
  for (int64_t s = 0; s < S; ++s)
    if (!masked[s]) {
      seen.lanes[s] = -1;
      seen.lo = std::min(seen.lo, s);
      seen.hi = s + 1;
    }
  return seen;
}

__attribute__((target("avx2,fma"))) inline float max8(__m256 v) {
  const __m128 half = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 quarter = _mm_max_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_max_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)));
}

extern "C" __m256 Sleef_expf8_u10(__m256);  // ATen's vectorized exp, exported by libtorch_cpu (as tanh.cpp's tanh)

// One head's scores row [S] into its probabilities, in place, for the slots seen (the others are not read again):
// in bf16 attention (ROUND) each score first rounded to bf16 (the matmul's output); the max, exp(x - max) (Sleef's,
// as ATen's softmax), their sum, one multiply by its reciprocal, in bf16 attention rounded to bf16 (the softmax's
// output). Eight slots at a time from the span's start, so the sum's order depends on the mask alone.
template <bool ROUND>
__attribute__((target("avx2,fma"))) void softmax(float* row, const Seen& seen) {
  const __m256 none = _mm256_set1_ps(-INFINITY);
  const int32_t* lanes = seen.lanes.data();
  __m256 tops = none;
  for (int64_t s = seen.lo; s < seen.hi; s += 8) {
    const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + s));
    __m256 x = _mm256_maskload_ps(row + s, mask);
    if (ROUND) x = through_bf16(x);
    tops = _mm256_max_ps(tops, _mm256_blendv_ps(none, x, _mm256_castsi256_ps(mask)));
  }
  const __m256 top = _mm256_set1_ps(max8(tops));
  __m256 sums = _mm256_setzero_ps();
  for (int64_t s = seen.lo; s < seen.hi; s += 8) {
    const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + s));
    __m256 x = _mm256_maskload_ps(row + s, mask);
    if (ROUND) x = through_bf16(x);
    const __m256 e = _mm256_and_ps(Sleef_expf8_u10(_mm256_sub_ps(x, top)), _mm256_castsi256_ps(mask));
    _mm256_maskstore_ps(row + s, mask, e);
    sums = _mm256_add_ps(sums, e);
  }
  const __m256 inverse = _mm256_set1_ps(1.0f / sum8(sums));
  for (int64_t s = seen.lo; s < seen.hi; s += 8) {
    const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + s));
    const __m256 p = _mm256_mul_ps(_mm256_maskload_ps(row + s, mask), inverse);
    _mm256_maskstore_ps(row + s, mask, ROUND ? through_bf16(p) : p);
  }
}

// out[h, c0:c1] = Σ_s p[h, s] · v[s, c0:c1] for N heads sharing these values (p [N, S]), over the slots not masked,
// in slot order: each value row is read once for all of them. The slots go in tiles, every column block over one
// tile before the next tile, so a tile's rows come from memory once and stay in the core's cache while the blocks
// pass over them (one block at a time over all the slots read a 32k cache from memory 16 times, a cache line holding
// four blocks); each sum carries on in `out` from one tile to the next, its terms still in slot order.
template <bool BF16, int N>
__attribute__((target("avx2,fma"))) void weigh(const float* p, const char* v, int64_t slot_bytes, int64_t d,
                                               const bool* masked, int64_t S, int64_t lo, int64_t hi, int64_t c0,
                                               int64_t c1, float* out) {
  constexpr int64_t SIZE = BF16 ? 2 : 4, LINE = 64 / SIZE;
  for (int64_t t0 = lo; t0 < hi; t0 += SLOT_TILE) {
    const int64_t t1 = std::min(hi, t0 + SLOT_TILE);
    for (int64_t c = c0; c < c1; c += 8) {
      __m256 acc[N];
      for (int h = 0; h < N; ++h) acc[h] = t0 == lo ? _mm256_setzero_ps() : _mm256_loadu_ps(out + h * d + c);
      for (int64_t s = t0; s < t1; ++s) {
        const int64_t next = s + SLOT_TILE;  // the same slot of the next tile
        if (c % LINE == 0 && next < hi && !masked[next])
          _mm_prefetch(v + next * slot_bytes + c * SIZE, _MM_HINT_T1);
        if (masked[s]) continue;
        const __m256 vc = load8<BF16>(v + s * slot_bytes, c);
        for (int h = 0; h < N; ++h) acc[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + h * S + s), vc, acc[h]);
      }
      for (int h = 0; h < N; ++h) _mm256_storeu_ps(out + h * d + c, acc[h]);
    }
  }
}

template <bool BF16, bool ROUND>
void attend(const uint16_t* q, const char* k, const char* v, int64_t kv_head_bytes, int64_t slot_bytes,
            const bool* masked, uint16_t* out, int64_t heads, int64_t kv_heads, int64_t S, int64_t d) {
  const int64_t group = heads / kv_heads;
  std::vector<float> qf(heads * d), probs(group * S), acc(heads * d);
  for (int64_t i = 0; i < heads * d; ++i) qf[i] = bf16_to_float(q[i]);
  const Seen seen = seen_slots(masked, S);
  // slots split between threads in the first pass, heads in the second, columns in the third: every sum is made in
  // the same order whatever the number of threads, so one thread and two give the same bits; few slots seen stay
  // on one thread
  const int64_t span = seen.hi - seen.lo;
  const int64_t slot_grain = 256, head_grain = span >= 1024 ? 1 : group, column_grain = span >= 256 ? 1 : d / 8;
  for (int64_t g = 0; g < kv_heads; ++g) {
    const float* qg = qf.data() + g * group * d;
    const char *kg = k + g * kv_head_bytes, *vg = v + g * kv_head_bytes;
    at::parallel_for(seen.lo, seen.hi, slot_grain, [&](int64_t begin, int64_t end) {
      for (int64_t h0 = 0; h0 < group; h0 += MAX_GROUP)
        with_heads(std::min(MAX_GROUP, group - h0), [&](auto n) {
          score<BF16, decltype(n)::value>(qg + h0 * d, kg, slot_bytes, d, masked, S, begin, end, &probs[h0 * S]);
        });
    });
    at::parallel_for(0, group, head_grain, [&](int64_t begin, int64_t end) {
      for (int64_t h = begin; h < end; ++h) softmax<ROUND>(&probs[h * S], seen);
    });
    at::parallel_for(0, d / 8, column_grain, [&](int64_t begin, int64_t end) {
      for (int64_t h0 = 0; h0 < group; h0 += MAX_GROUP)
        with_heads(std::min(MAX_GROUP, group - h0), [&](auto n) {
          weigh<BF16, decltype(n)::value>(&probs[h0 * S], vg, slot_bytes, d, masked, S, seen.lo, seen.hi,
                                          begin * 8, end * 8, &acc[(g * group + h0) * d]);
        });
    });
  }
  for (int64_t i = 0; i < heads * d; ++i) out[i] = float_to_bf16(acc[i]);
}

}  // namespace

extern "C" bool torchtpu_attend_supported() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// out [heads, d] bf16 = attention of q [heads, d] bf16 over S slots of k and v, float32 (kv_bf16 = false) or bf16,
// whose kv head g, slot s starts at element g * kv_head_stride + s * slot_stride (d contiguous elements); masked
// [S]: true where the query must not see a slot, false for at least one; in bf16 attention (round_bf16) or float32.
// Shapes checked by attend.rs (d % 8 == 0, heads % kv_heads == 0).
extern "C" void torchtpu_attend_one(const uint16_t* q, const void* k, const void* v, bool kv_bf16, bool round_bf16,
                                    int64_t kv_head_stride, int64_t slot_stride, const bool* masked, uint16_t* out,
                                    int64_t heads, int64_t kv_heads, int64_t S, int64_t d) {
  const int64_t size = kv_bf16 ? 2 : 4;
  const char* kb = static_cast<const char*>(k);
  const char* vb = static_cast<const char*>(v);
  // attend<kv_bf16, round_bf16>
  using Attend = void (*)(const uint16_t*, const char*, const char*, int64_t, int64_t, const bool*, uint16_t*, int64_t,
                          int64_t, int64_t, int64_t);
  constexpr Attend ATTEND[2][2] = {{attend<false, false>, attend<false, true>},
                                   {attend<true, false>, attend<true, true>}};
  ATTEND[kv_bf16][round_bf16](q, kb, vb, kv_head_stride * size, slot_stride * size, masked, out, heads, kv_heads, S, d);
}
