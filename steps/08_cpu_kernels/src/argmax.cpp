// The greedy token of a decode step: the index of the largest of a row of logits (262,144 at E2B), as torch.argmax
// picks it — the first of equal largest values, and the first NaN if there is one — in one pass on one thread: ATen's
// argmax took about a millisecond on that row on an AMD EPYC (torch's profiler, a decode step), where reading its
// 512 KB takes a few dozen microseconds. sampling.rs says
// when it runs.
#include "bf16.h"

#include <cmath>
#include <cstdint>

namespace {

template <typename T>
int64_t first_largest(const T* row, int64_t n) {
  auto value = [&](int64_t i) {
    if constexpr (sizeof(T) == 2) return bf16_to_float(row[i]);
    else return row[i];
  };
  int64_t best = 0;
  float top = value(0);
  if (std::isnan(top)) return 0;
  for (int64_t i = 1; i < n; ++i) {
    const float v = value(i);
    if (std::isnan(v)) return i;
    if (v > top) {
      top = v;
      best = i;
    }
  }
  return best;
}

}  // namespace

// The index of the first largest of n > 0 values (bf16 = true: bf16, else float32), NaN counted largest.
extern "C" int64_t torchtpu_argmax(const void* row, int64_t n, bool bf16) {
  return bf16 ? first_largest(static_cast<const uint16_t*>(row), n) : first_largest(static_cast<const float*>(row), n);
}
