"""torchtpu_ways: step 05 of the Gemma 4 in Rust walkthrough.

`baseline.Baseline`: Gemma 4 in plain PyTorch with the Rust engine's design (same files, stored weights, ring
caches), eager or `torch.compile`d. `ways.run_way`: one way (rust-fused, rust-eager, python-compile,
python-eager) in a fresh process, and what it measured. TorchTPU-specific code lives in `tpu`.
"""
from .baseline import Baseline
from .compiling import dynamo_counts
from .ways import WAYS, run_way

__all__ = ["Baseline", "dynamo_counts", "WAYS", "run_way"]
