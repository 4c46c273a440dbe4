"""torchtpu_kernels: step 03's Gemma 4 engine with its linears kept 4-bit, multiplied by an int4 kernel on the CPU:
this step's own where one runs (torchtpu_dot4_mm with AVX512-BF16, else torchtpu_fma4_mm with AVX2, FMA, F16C), else
ATen's (aten::_weight_int4pack_mm_for_cpu). With AMX, dot4's products of a short prompt's rows go by AMX's tiles
(torchtpu_amx4_mm, amx4_runs()) and its longer prompt chunks by panels: unpacked to bf16 a panel of rows at a time
and multiplied by torch's bf16 matmul (panels_run()). On an Intel CPU with AVX-512 and no AMX, dot4's or fma4's short
prompts go by fma4's arithmetic in AVX-512's 16 lanes (torchtpu_fma16_mm, fma16_runs()); their longer chunks, and
fma4's everywhere, by float32 panels and torch's float32 matmul.

    import torch, torchtpu_kernels
    engine = torchtpu_kernels.Engine(model_dir, emb4_dir, like, ctx, dtype="bfloat16", weights="auto")
    engine.weights, engine.weights_reason      # "int4" or "bf16", and why
    engine.int4_matmul                         # "dot4", "fma4" or "aten" (None with bf16 weights)
    tokens, read_s, decode_s = engine.generate(ids, max_new)
    for token in engine.stream(ids, max_new, stop=[1]):   # step 03's streaming and sampling, unchanged
        ...

Everything else is step 03's contract. The Python helpers (checkpoints, devices, records, prompting, the
Transformers reference) are step 03's, in `torchtpu_rs`.
"""
import torch  # noqa: F401  (first: the Rust extension reuses the libtorch that torch loads)

from ._engine import (
    BUILT_WITH_TORCH,
    RUSTC_VERSION,
    TCH_VERSION,
    Engine,
    Int4Linear,
    TokenStream,
    amx4_runs,
    dot4_float_panels_run,
    dot4_runs,
    filtered_probs,
    fma4_runs,
    fma4_subnormals,
    fma16_runs,
    fma_limit,
    int4_kernel,
    layout_for,
    panels_run,
    repack,
    sample,
)

__all__ = ["Engine", "TokenStream", "Int4Linear", "layout_for", "filtered_probs", "sample", "int4_kernel", "dot4_runs",
           "fma4_runs", "fma4_subnormals", "amx4_runs", "fma16_runs", "panels_run", "dot4_float_panels_run",
           "fma_limit", "repack", "TCH_VERSION", "RUSTC_VERSION", "BUILT_WITH_TORCH"]
