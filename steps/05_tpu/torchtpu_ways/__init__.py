"""torchtpu_ways: step 05 of the Gemma 4 in Rust walkthrough.

`baseline.Baseline`: Gemma 4 in plain PyTorch with the Rust engine's design (same files, stored weights, ring
caches), eager or `torch.compile`d. `ways.run_way`: one way (rust-fused, rust-eager, python-compile,
python-eager; step 07's rust-int4-aten and step 08's rust-int4 when installed; llama.cpp's through `peer_run`) in
a fresh process, and what it measured. TorchTPU-specific code lives in `tpu`. The names below are imported when
first used: the llama.cpp way's process (`peer_worker`) imports this package but not torch.
"""
import importlib

_WHERE = {"Baseline": "baseline", "dynamo_counts": "compiling", "WAYS": "way_names", "run_way": "ways"}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'torchtpu_ways' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # kept: the next use finds it without coming here
    return value
