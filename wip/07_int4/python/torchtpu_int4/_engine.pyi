"""Type stub for the Rust extension torchtpu_int4._engine (src/lib.rs)."""
from collections.abc import Callable
from os import PathLike

import torch

TCH_VERSION: str
RUSTC_VERSION: str
BUILT_WITH_TORCH: str
INT4_KERNEL: str  # "aten::_weight_int4pack_mm_for_cpu"

Layout = tuple[int, int, int, int]  # (full_rings, sliding_rings, shared_layers, sliding_ring_len)

class Engine:
    """Gemma 4 (E-series) text model in Rust, on the device of `like`, its linears kept 4-bit where the int4
    kernel runs. Belongs to the creating thread."""

    def __init__(
        self,
        model_dir: str | PathLike[str],
        emb4_dir: str | PathLike[str] | None,
        like: torch.Tensor,
        ctx: int,
        dtype: str = "bfloat16",
        progress: Callable[[int, int], object] | None = None,
        weights: str = "auto",
    ) -> None: ...
    @property
    def weights(self) -> str:
        """"int4" or "bf16": how the linears are held."""
    @property
    def weights_reason(self) -> str:
        """Why: what weights="auto" found on this device, or what was asked for."""
    def layout(self) -> Layout: ...
    def generate(
        self,
        ids: list[int],
        max_new: int,
        read_every: int = 1,
        stop: list[int] | tuple[int, ...] | set[int] | frozenset[int] | None = None,
    ) -> tuple[list[int], float, float]:
        """Greedy tokens; (tokens, read_s, decode_s), as step 03's."""
    def logits(self, ids: list[int], positions: list[int] | None = None) -> torch.Tensor:
        """float32 [len(positions), vocab], through the chunked read, from a fresh cache."""
    def hidden_states(self, ids: list[int]) -> list[torch.Tensor]:
        """L + 1 tensors [len(ids), hidden]: each layer's input, then the final-norm output."""
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads, as held (int4: nibbles, scales and zero points)."""

def layout_for(config_json: str | PathLike[str], ctx: int) -> Layout: ...
def int4_kernel(like: torch.Tensor) -> tuple[bool, str]:
    """Whether aten::_weight_int4pack_mm_for_cpu runs on like's device, and why not."""
def repack(weight_packed: torch.Tensor, weight_scale: torch.Tensor, cols: int,
           dtype: str = "bfloat16") -> tuple[torch.Tensor, torch.Tensor]:
    """A checkpoint's packed matrix in the int4 kernel's layout, as the Engine makes it: uint8 [rows, cols / 2]
    and [cols / group, rows, 2] (scale, 0) in `dtype`."""
def int4_linear(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                cols: int) -> torch.Tensor:
    """x · Wᵀ through the Engine's int4 path (repack, then the int4 kernel), in x's dtype."""
