// Gemma 4's RMSNorm in one call, with what follows it — the residual add, or q's and k's rotary embedding — the
// bits of ATen's ops (gemma.rs' `RmsNorm::forward_in_ops`, `Rotation::rotate`), each of which costs a decode step
// more to dispatch than to compute: 240 norms a step at E2B. norm.rs says when it runs.
//
// Every op but one is elementwise and rounds as IEEE does whatever the loop: the square, `+ eps`, the multiplies, the
// conversions to bf16 (to nearest even; a bf16 op computes in float32 and rounds once), and `1 / sqrt` — ATen's scalar loop divides in double, its vector loop in
// float, which round alike (double's 53 bits are more than 2 · 24 + 2: Figueroa's bound). The one that is not is
// the mean: a float32 sum, whose bits depend on its order. So the sum here is ATen's, order and all
// (aten/src/ATen/native/cpu/SumKernel.cpp, `vectorized_inner_sum`): vectors of 8 lanes, taken four at a time into
// four partial sums, cascaded in levels of 16, then the partials added, the scalar tail summed, and the lanes added
// in order; then divided by n. Eight lanes whatever ATen's capability: SumKernel registers its kernel with
// REGISTER_DISPATCH, which gives AVX-512 no build of its own (only ALSO_REGISTER_AVX512_DISPATCH does), so an
// AVX-512 process sums with the AVX2 build — measured: 16-lane sums differ from torch's on an AVX-512 EPYC, 8-lane
// ones do not.
#include "bf16.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int LANES = 8;  // ATen's Vectorized<float> in its AVX2 (and default) build

// ATen's utils::CeilLog2
int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  return 64 - __builtin_clzll(uint64_t(x) - 1);
}

// A vector of float lanes, added lane by lane (ATen's Vectorized<float> +).
struct Lanes {
  float v[LANES] = {};
  void add(const Lanes& o) {
    for (int l = 0; l < LANES; ++l) v[l] += o.v[l];
  }
  void load(const float* p) {
    for (int l = 0; l < LANES; ++l) v[l] = p[l];
  }
};

// ATen's multi_row_sum<Vectorized<float>, 4>: rows i of four vectors each (vector i * 4 + k at column k).
void multi_row_sum(const float* data, int64_t size, Lanes out[4]) {
  constexpr int64_t levels = 4;
  const int64_t power = std::max<int64_t>(4, ceil_log2(size) / levels);
  const int64_t step = int64_t(1) << power, mask = step - 1;
  Lanes acc[levels][4];
  Lanes loaded;
  auto take = [&](int64_t i) {
    for (int k = 0; k < 4; ++k) {
      loaded.load(data + (i * 4 + k) * LANES);
      acc[0][k].add(loaded);
    }
  };
  int64_t i = 0;
  for (; i + step <= size;) {
    for (int64_t j = 0; j < step; ++j, ++i) take(i);
    for (int64_t j = 1; j < levels; ++j) {
      for (int k = 0; k < 4; ++k) {
        acc[j][k].add(acc[j - 1][k]);
        acc[j - 1][k] = Lanes{};
      }
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < size; ++i) take(i);
  for (int64_t j = 1; j < levels; ++j)
    for (int k = 0; k < 4; ++k) acc[0][k].add(acc[j][k]);
  for (int k = 0; k < 4; ++k) out[k] = acc[0][k];
}

// --8<-- [start:sum]
// ATen's float32 sum of a contiguous row of n (n >= LANES), in its order.
float aten_sum(const float* row, int64_t n) {
  const int64_t vectors = n / LANES, fours = vectors / 4;
  Lanes partial[4];
  multi_row_sum(row, fours, partial);
  Lanes loaded;
  for (int64_t i = fours * 4; i < vectors; ++i) {
    loaded.load(row + i * LANES);
    partial[0].add(loaded);
  }
  for (int k = 1; k < 4; ++k) partial[0].add(partial[k]);
  float sum = 0;
  for (int64_t k = vectors * LANES; k < n; ++k) sum += row[k];
  for (int l = 0; l < LANES; ++l) sum += partial[0].v[l];
  return sum;
}
// --8<-- [end:sum]

// ATen's scalar loop for a row shorter than a vector (basic_loop in SumKernel's scalar_inner_sum: row_sum with an
// ILP of 4 over single floats).
float aten_short_sum(const float* row, int64_t n) {
  const int64_t fours = n / 4;
  float partial[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < fours; ++i)
    for (int k = 0; k < 4; ++k) partial[k] += row[i * 4 + k];
  for (int64_t i = fours * 4; i < n; ++i) partial[0] += row[i];
  for (int k = 1; k < 4; ++k) partial[0] += partial[k];
  return partial[0];
}

template <typename T>
float widen(T v) {
  if constexpr (sizeof(T) == 2) return bf16_to_float(v);
  else return v;
}

template <typename T>
T narrow(float v) {
  if constexpr (sizeof(T) == 2) return float_to_bf16(v);
  else return v;
}

// After the norm: the residual added (residual [rows, n]) and, if scale is not null, the sum times *scale; or the
// rotation `x · cos + rotate_half(x) · sin` of each head (cos, sin [rows / heads, n]: one row per token), pairing
// dim k with k + n/2; or nothing.
template <typename T>
struct After {
  const T* residual;
  const T* scale;
  const T* cos;
  const T* sin;
  int64_t heads;
};

template <typename T>
void norm(const T* x, const float* w, After<T> after, T* y, int64_t y_stride, int64_t rows, int64_t n, float eps) {
  std::vector<float> xf(n), squares(n);
  std::vector<T> normed(n);
  const int64_t half = n / 2;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < n; ++k) {
      xf[k] = widen(x[r * n + k]);
      squares[k] = xf[k] * xf[k];
    }
    const float sum = n >= LANES ? aten_sum(squares.data(), n) : aten_short_sum(squares.data(), n);
    const float inverse_root = float(1.0 / double(std::sqrt(sum / float(n) + eps)));
    for (int64_t k = 0; k < n; ++k) {
      float v = xf[k] * inverse_root;
      if (w) v = v * w[k];
      normed[k] = narrow<T>(v);
    }
    T* out = y + r * y_stride;
    if (after.residual) {
      for (int64_t k = 0; k < n; ++k) out[k] = narrow<T>(widen(after.residual[r * n + k]) + widen(normed[k]));
      if (after.scale)  // rounded after the add, as ATen's mul after its add
        for (int64_t k = 0; k < n; ++k) out[k] = narrow<T>(widen(out[k]) * widen(*after.scale));
    } else if (after.cos) {
      const T* cos = after.cos + (r / after.heads) * n;
      const T* sin = after.sin + (r / after.heads) * n;
      for (int64_t k = 0; k < n; ++k) {
        const float turned = k < half ? -widen(normed[k + half]) : widen(normed[k - half]);  // rotate_half
        const T a = narrow<T>(widen(normed[k]) * widen(cos[k])), b = narrow<T>(turned * widen(sin[k]));
        out[k] = narrow<T>(widen(a) + widen(b));
      }
    } else {
      std::copy(normed.begin(), normed.end(), out);
    }
  }
}

}  // namespace

// y [rows, n] = x · (mean(x²) + eps)^-0.5 · w, then plus residual [rows, n] (then times scale [1], unless null), or
// rotated by cos, sin [rows / heads, n] (one row per token), or neither (null): x, residual, scale, cos, sin and y
// all bf16 (bf16 = true) or all float32, w float32 [n] or null (no weight); y's rows y_stride values apart (n, or a
// cache's slots · n: a token's heads written into their slot of a cache).
extern "C" void torchtpu_rms_norm(const void* x, const float* w, const void* residual, const void* scale,
                                  const void* cos, const void* sin, int64_t heads, void* y, int64_t y_stride,
                                  int64_t rows, int64_t n, float eps, bool bf16) {
  if (bf16) {
    using T = uint16_t;
    const After<T> after{static_cast<const T*>(residual), static_cast<const T*>(scale), static_cast<const T*>(cos),
                         static_cast<const T*>(sin), heads};
    norm(static_cast<const T*>(x), w, after, static_cast<T*>(y), y_stride, rows, n, eps);
  } else {
    using T = float;
    const After<T> after{static_cast<const T*>(residual), static_cast<const T*>(scale), static_cast<const T*>(cos),
                         static_cast<const T*>(sin), heads};
    norm(static_cast<const T*>(x), w, after, static_cast<T*>(y), y_stride, rows, n, eps);
  }
}
