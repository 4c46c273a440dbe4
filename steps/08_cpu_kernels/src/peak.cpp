// The arithmetic limit of a prompt read on fma4's CPUs (budget.py --read): float32 multiply-adds a second in AVX2's
// 8 lanes on all of torch's threads — the instruction fma4 and MKL's AVX2 product both do their multiply-adds with,
// so no product of theirs can go faster. A prompt chunk multiplies every weight by hundreds of rows: it waits on
// this, as a decode step waits on the read limit.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace {

// --8<-- [start:chains]
// Sums in flight: an FMA's result is ready 4 or 5 cycles after it issues and two issue a cycle, so 10 chains keep
// both FMA pipes busy; 12 leave room.
constexpr int CHAINS = 12;

// Where the chains' sums end: a volatile the compiler must write, so none of the work can be left out.
volatile float sink;

// `rounds` rounds of an FMA on each chain; returns their sum.
__attribute__((target("avx2,fma"))) float chains(int64_t rounds) {
  __m256 acc[CHAINS];
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 times = _mm256_set1_ps(0.999f), plus = _mm256_set1_ps(0.001f);  // stays near 1: no subnormals
  for (int64_t r = 0; r < rounds; ++r)
#pragma GCC unroll 12
    for (int i = 0; i < CHAINS; ++i) acc[i] = _mm256_fmadd_ps(acc[i], times, plus);
  __m256 sum = acc[0];
  for (int i = 1; i < CHAINS; ++i) sum = _mm256_add_ps(sum, acc[i]);
  return _mm256_cvtss_f32(sum);
}
// --8<-- [end:chains]

}  // namespace

// Float32 GFLOP/s (two a multiply-add) of `rounds` rounds on each of torch's threads at once, best of `tries`.
extern "C" double torchtpu_fma_limit(int64_t rounds, int tries) {
  const int64_t threads = at::get_num_threads();
  std::vector<float> sums(threads);
  double best = 0;
  for (int t = 0; t < tries; ++t) {
    const auto start = std::chrono::steady_clock::now();
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sums[i] = chains(rounds);
    });
    for (const float sum : sums) sink = sum;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * 8 * CHAINS * rounds * threads / seconds / 1e9);
  }
  return best;
}
