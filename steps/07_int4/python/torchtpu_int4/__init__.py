"""torchtpu_int4: step 03's Gemma 4 engine with its linears kept 4-bit, multiplied by ATen's int4 kernel
(aten::_weight_int4pack_mm_for_cpu) on the CPU; elsewhere, or with float32 activations, weights="auto" holds them
bf16 as step 03 does.

    import torch, torchtpu_int4
    engine = torchtpu_int4.Engine(model_dir, emb4_dir, like, ctx, dtype="bfloat16", weights="auto")
    engine.weights, engine.weights_reason      # "int4" or "bf16", and why
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
    TokenStream,
    filtered_probs,
    int4_kernel,
    layout_for,
    repack,
    sample,
)

__all__ = ["Engine", "TokenStream", "layout_for", "filtered_probs", "sample", "int4_kernel", "repack", "TCH_VERSION",
           "RUSTC_VERSION", "BUILT_WITH_TORCH"]
