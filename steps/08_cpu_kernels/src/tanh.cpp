// Gemma 4's two uses of tanh, each in one call, the bits of ATen's ops on bf16 tensors: the feed-forward block's
// `gelu_tanh(gate) · up` (and the per-layer input's `gelu_tanh(gate) · input`; gemma.rs' `gelu_times`), and the
// logits' softcap `tanh(x / cap) · cap` (gemma.rs' `head`). ATen spends more of a decode step dispatching the
// first's two ops, 70 of each at E2B, than computing them, and runs the second's three over 262,144 logits one
// after the other. tanh.rs says when these run.
//
// ATen's bf16 gelu widens 16 (AVX-512) or 8 (AVX2) values at a time to float32 and runs Gelu.h's
// `vectorized_gelu_approximated_with_tanh` in the build its dispatch picks, then rounds to bf16; its compiled code
// (disassembled from torch 2.13's libtorch_cpu, both builds) is, lane by lane:
//   x³ = (x · x) · x,  inner = fma(x³, κ, x) · β,  g = (0.5 · x) · (1 + tanh(inner)),  rounded to bf16
// with tanh Sleef's `Sleef_tanhf16_u10` or `Sleef_tanhf8_u10`, which libtorch_cpu exports: called here too, so the
// tanh is the same function, not a copy of it. `mul` then widens g and up, multiplies, rounds; the softcap's `div`,
// `tanh` and `mul` each widen, compute (the same Sleef tanh) and round. All round as vec512/vec256_bfloat16.h's
// `cvtfp32_bf16` does: to nearest even, and every NaN to 0xFFFF (c10::BFloat16's scalar rounding, bf16.h, makes it
// 0x7FC0: only ATen's scalar tail loops use that, and tanh.rs gives these kernels no tail, n being a multiple of
// 64, ATen's AVX-512 loop step).
#include "gelu.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace {

using namespace gelu;

__attribute__((target("avx512f"))) void softcap_wide(const uint16_t* x, uint16_t* y, float cap, int64_t begin,
                                                     int64_t end) {
  const __m512 c = _mm512_set1_ps(cap);
  for (int64_t i = begin; i < end; i += 16) {
    const __m512 t = through_bf16(Sleef_tanhf16_u10(through_bf16(_mm512_div_ps(widened(x + i), c))));
    _mm256_storeu_si256((__m256i*)(y + i), rounded(_mm512_mul_ps(t, c)));
  }
}

__attribute__((target("avx2,fma"))) void softcap_narrow(const uint16_t* x, uint16_t* y, float cap, int64_t begin,
                                                        int64_t end) {
  const __m256 c = _mm256_set1_ps(cap);
  for (int64_t i = begin; i < end; i += 8) {
    const __m256 t = through_bf16_8(Sleef_tanhf8_u10(through_bf16_8(_mm256_div_ps(widened8(x + i), c))));
    stored8(y + i, rounded8(_mm256_mul_ps(t, c)));
  }
}

}  // namespace

extern "C" bool torchtpu_tanh_supported() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// y[i] = bf16(bf16(gelu_tanh(gate[i])) · up[i]) for i < n, n a multiple of 64; `avx512`: as ATen's AVX-512 build
// (16 lanes, Sleef_tanhf16_u10), else as its AVX2 build (8 lanes, Sleef_tanhf8_u10).
extern "C" void torchtpu_gelu_times(const uint16_t* gate, const uint16_t* up, uint16_t* y, int64_t n, bool avx512) {
  // a prompt chunk's rows split between threads, in whole 64s (each lane is computed alone: the split changes no
  // bit); a decode step's one row, a few µs of work, stays on this thread
  at::parallel_for(0, n / 64, 256, [&](int64_t begin, int64_t end) {
    if (avx512)
      gelu::gelu_wide(gate, up, y, begin * 64, end * 64);
    else
      gelu::gelu_narrow(gate, up, y, begin * 64, end * 64);
  });
}

// y[i] = bf16(bf16(tanh(bf16(x[i] / cap))) · cap) for i < n, n a multiple of 64, split between threads as ATen's
// ops split theirs; `avx512` as above. y may be x (each lane is read before it is written).
extern "C" void torchtpu_softcap(const uint16_t* x, uint16_t* y, float cap, int64_t n, bool avx512) {
  at::parallel_for(0, n / 64, 256, [&](int64_t begin, int64_t end) {
    if (avx512)
      softcap_wide(x, y, cap, begin * 64, end * 64);
    else
      softcap_narrow(x, y, cap, begin * 64, end * 64);
  });
}
