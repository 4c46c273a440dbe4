// A decode step's attention over one layer's cache, for CPUs with AVX2 and FMA (every CPU either int4 kernel runs
// on): one query token's heads against the slots it attends over, in one call instead of ATen's seven (two batched
// matmuls, a transpose, a masked fill, a softmax, the reshapes). attend.rs says when it runs and what it computes.
//
// What ATen spends a decode step's attention on is not the cache's bytes: two bf16 matmuls of one query row
// cost 30-50 µs each on an AMD EPYC whatever the slot count (oneDNN's set-up for a tiny problem), so 35 layers of
// attention took 9 ms of a 57 ms step for 37 MB, a tenth of what memory delivers (docs/runs/cpu-e2b/07_budget.txt).
// Here each slot's key is read once, against every query head that shares it, and each value row once.
//
// The arithmetic is ATen's, in other orders of sums (as the int4 kernels): scores s = k · q summed in float32, with
// bf16 caches rounded to bf16 as the matmul's output is; masked slots get probability exactly 0; the softmax in
// float32 (max, exp, sum, one multiply by the sum's reciprocal), with bf16 caches its probabilities rounded to
// bf16; out = Σ p · v in float32, rounded once to bf16. Scaling is 1.0 (Gemma 4's q and k are normed).
#include "bf16.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

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

constexpr int64_t MAX_GROUP = 8;  // query heads scored against one key at once (E2B: 8 heads share a KV head)

// --8<-- [start:score]
// Scores of `heads` query rows qf [heads, d] (float32) against the keys of slots [begin, end): scores[h * S + s].
template <bool BF16>
__attribute__((target("avx2,fma"))) void score(const float* qf, int64_t heads, const char* k, int64_t slot_bytes,
                                               int64_t d, const bool* masked, int64_t S, int64_t begin, int64_t end,
                                               float* scores) {
  for (int64_t s = begin; s < end; ++s) {
    if (masked[s]) continue;
    const void* key = k + s * slot_bytes;
    for (int64_t h0 = 0; h0 < heads; h0 += MAX_GROUP) {
      const int64_t n = std::min(MAX_GROUP, heads - h0);
      __m256 acc[MAX_GROUP];
      for (int64_t h = 0; h < n; ++h) acc[h] = _mm256_setzero_ps();
      for (int64_t c = 0; c < d; c += 8) {
        const __m256 kc = load8<BF16>(key, c);
        for (int64_t h = 0; h < n; ++h) acc[h] = _mm256_fmadd_ps(kc, _mm256_loadu_ps(qf + (h0 + h) * d + c), acc[h]);
      }
      for (int64_t h = 0; h < n; ++h) scores[(h0 + h) * S + s] = sum8(acc[h]);
    }
  }
}
// --8<-- [end:score]

// out[h, c0:c1] = Σ_s p[s, h] · v[s, c0:c1] for the `heads` heads sharing these values, over the slots not masked,
// in slot order: each value row is read once for all of them. p is [S, heads] (transposed for this loop).
template <bool BF16>
__attribute__((target("avx2,fma"))) void weigh(const float* p, int64_t heads, const char* v, int64_t slot_bytes,
                                               int64_t d, const bool* masked, int64_t S, int64_t c0, int64_t c1,
                                               float* out) {
  for (int64_t c = c0; c < c1; c += 8)
    for (int64_t h0 = 0; h0 < heads; h0 += MAX_GROUP) {
      const int64_t n = std::min(MAX_GROUP, heads - h0);
      __m256 acc[MAX_GROUP];
      for (int64_t h = 0; h < n; ++h) acc[h] = _mm256_setzero_ps();
      for (int64_t s = 0; s < S; ++s) {
        if (masked[s]) continue;
        const __m256 vc = load8<BF16>(v + s * slot_bytes, c);
        for (int64_t h = 0; h < n; ++h) acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(p[s * heads + h0 + h]), vc, acc[h]);
      }
      for (int64_t h = 0; h < n; ++h) _mm256_storeu_ps(out + (h0 + h) * d + c, acc[h]);
    }
}

template <bool BF16>
void attend(const uint16_t* q, const char* k, const char* v, int64_t kv_head_bytes, int64_t slot_bytes,
            const bool* masked, uint16_t* out, int64_t heads, int64_t kv_heads, int64_t S, int64_t d) {
  const int64_t group = heads / kv_heads;
  std::vector<float> qf(heads * d), scores(group * S), probs(S * group), acc(heads * d);
  for (int64_t i = 0; i < heads * d; ++i) qf[i] = bf16_to_float(q[i]);
  // slots split between threads in the first pass, columns in the second: every sum is made in the same order
  // whatever the number of threads, so one thread and two give the same bits; short caches stay on one thread
  const int64_t slot_grain = 256, column_grain = S >= 256 ? 1 : d / 8;
  for (int64_t g = 0; g < kv_heads; ++g) {
    const float* qg = qf.data() + g * group * d;
    float* sg = scores.data();
    const char* kg = k + g * kv_head_bytes;
    at::parallel_for(0, S, slot_grain, [&](int64_t begin, int64_t end) {
      score<BF16>(qg, group, kg, slot_bytes, d, masked, S, begin, end, sg);
    });
    for (int64_t h = 0; h < group; ++h) {
      float* row = sg + h * S;
      float top = -INFINITY;
      for (int64_t s = 0; s < S; ++s) {
        if (masked[s]) continue;
        if (BF16) row[s] = round_to_bf16(row[s]);  // the bf16 matmul's output
        top = std::max(top, row[s]);
      }
      float sum = 0.0f;
      for (int64_t s = 0; s < S; ++s) {
        row[s] = masked[s] ? 0.0f : std::exp(row[s] - top);
        sum += row[s];
      }
      const float inverse = 1.0f / sum;
      for (int64_t s = 0; s < S; ++s) {
        const float p = row[s] * inverse;
        probs[s * group + h] = BF16 ? round_to_bf16(p) : p;
      }
    }
    at::parallel_for(0, d / 8, column_grain, [&](int64_t begin, int64_t end) {
      weigh<BF16>(probs.data(), group, v + g * kv_head_bytes, slot_bytes, d, masked, S, begin * 8, end * 8,
                  acc.data() + g * group * d);
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
// [S]: true where the query must not see a slot, false for at least one. Shapes checked by attend.rs (d % 8 == 0,
// heads % kv_heads == 0).
extern "C" void torchtpu_attend_one(const uint16_t* q, const void* k, const void* v, bool kv_bf16,
                                    int64_t kv_head_stride, int64_t slot_stride, const bool* masked, uint16_t* out,
                                    int64_t heads, int64_t kv_heads, int64_t S, int64_t d) {
  const int64_t size = kv_bf16 ? 2 : 4;
  const char* kb = static_cast<const char*>(k);
  const char* vb = static_cast<const char*>(v);
  if (kv_bf16)
    attend<true>(q, kb, vb, kv_head_stride * size, slot_stride * size, masked, out, heads, kv_heads, S, d);
  else
    attend<false>(q, kb, vb, kv_head_stride * size, slot_stride * size, masked, out, heads, kv_heads, S, d);
}
