"""torchtpu_rs: Gemma 4 (E-series, W4A16 checkpoints) written in Rust with tch-rs, driven from Python.

    import torch, torchtpu_rs
    engine = torchtpu_rs.Engine(model_dir, emb4_dir, like, ctx, dtype="bfloat16")
    tokens, read_s, decode_s = engine.generate(ids, max_new)             # exactly max_new tokens
    tokens, read_s, decode_s = engine.generate(ids, max_new, stop=[1])   # or up to the first <eos> (id 1)
    for token in engine.stream(ids, max_new, stop=[1]):                  # tokens as they are made (greedy)
        ...
    engine.stream(ids, max_new, temperature=0.8, top_k=40, top_p=0.95, seed=0)  # sampled; same seed, same tokens

The Python helpers beside the engine: `checkpoints` (make and cache checkpoints in the real formats),
`devices` (pick a device), `records` (what a recorded run ran on).
"""
import torch  # noqa: F401  (first: the Rust extension reuses the libtorch that torch loads)

from ._engine import (
    BUILT_WITH_TORCH,
    RUSTC_VERSION,
    TCH_VERSION,
    Engine,
    TokenStream,
    filtered_probs,
    layout_for,
    sample,
)

__all__ = ["Engine", "TokenStream", "layout_for", "filtered_probs", "sample", "TCH_VERSION", "RUSTC_VERSION",
           "BUILT_WITH_TORCH"]
