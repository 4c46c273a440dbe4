// How this step's matrix kernels (dot4.cpp, fma4.cpp, amx4.cpp) share a product's blocks between threads and write
// them: each thread takes whole blocks of 16 rows of W, and every ROWS rows of x for a block (4 for the vector kernels,
// 8 for fma16, 32 for AMX's tiles) before the next block, so a prompt chunk reads each weight from memory once; the
// outputs go to y as they are, or through the gelu on their way out (gelu.h: tanh.cpp's bits). Each output is computed
// by one thread in one order, so the split changes no bit.
#pragma once

#include "gelu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

// y from W's N / 16 blocks of outputs for x's M rows; block(b, m, rows, out, stride) writes rows m..m+rows of block
// b's 16 outputs (rounded to bf16) to out, rows `stride` apart, at most ROWS rows. gelu_lanes 0: y [M, N] the
// outputs; 16 or 8: the gelu as ATen's AVX-512 or AVX2 build computes it (see below).
template <int ROWS, class Block>
void write_blocks(int64_t M, int64_t N, int gelu_lanes, const uint16_t* up, uint16_t* y, const Block& block) {
  const int64_t blocks = N / 16, passes = (M + ROWS - 1) / ROWS;
  if (gelu_lanes == 0) {
    at::parallel_for(0, blocks * passes, 0, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = i / passes, m = (i % passes) * ROWS;
        block(b, m, std::min<int64_t>(ROWS, M - m), y + m * N + b * 16, N);
      }
    });
    return;
  }
  // --8<-- [start:gelu]
  // gelu_tanh(gate) · up on the products' way out, so y is all that is written. Either W is [gate; up] held in pairs
  // (dot4.rs' Stacking::Pairs: blocks 2b and 2b + 1 are gate's and up's rows 16b..16b+15), both products rounded to
  // bf16 as any product's outputs, y [M, N / 2]; or W is gate alone and `up` is given, [M, N] (the per-layer
  // input's), y [M, N].
  const int64_t outs = up ? blocks : blocks / 2, width = outs * 16;
  at::parallel_for(0, outs * passes, 0, [&](int64_t begin, int64_t end) {
    uint16_t gates[ROWS * 16], ups[ROWS * 16];
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / passes, m = (i % passes) * ROWS, rows = std::min<int64_t>(ROWS, M - m);
      block(up ? b : 2 * b, m, rows, gates, 16);
      if (!up) block(2 * b + 1, m, rows, ups, 16);
      for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* u = up ? up + (m + r) * width + b * 16 : ups + r * 16;
        uint16_t* yr = y + (m + r) * width + b * 16;
        if (gelu_lanes == 16)
          gelu::gelu_wide(gates + r * 16, u, yr, 0, 16);
        else
          gelu::gelu_narrow(gates + r * 16, u, yr, 0, 16);
      }
    }
  });
  // --8<-- [end:gelu]
}
