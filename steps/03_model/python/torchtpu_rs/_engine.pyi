"""Type stub for the Rust extension torchtpu_rs._engine (src/lib.rs)."""
from collections.abc import Callable
from os import PathLike

import torch

TCH_VERSION: str
RUSTC_VERSION: str
BUILT_WITH_TORCH: str

Layout = tuple[int, int, int, int]  # (full_rings, sliding_rings, shared_layers, sliding_ring_len)

class Engine:
    """Gemma 4 (E-series) text model in Rust, on the device of `like`. Belongs to the creating thread."""

    def __init__(
        self,
        model_dir: str | PathLike[str],
        emb4_dir: str | PathLike[str] | None,
        like: torch.Tensor,
        ctx: int,
        dtype: str = "bfloat16",
        progress: Callable[[int, int], object] | None = None,
    ) -> None: ...
    def layout(self) -> Layout: ...
    def generate(
        self,
        ids: list[int],
        max_new: int,
        read_every: int = 1,
        stop: list[int] | tuple[int, ...] | set[int] | frozenset[int] | None = None,
    ) -> tuple[list[int], float, float]:
        """Greedy tokens; (tokens, read_s, decode_s). Exactly max_new tokens, or with `stop` up to and including
        the first one in it; decode_s covers the decode steps made, so decode tok/s = (len(tokens) - 1) / decode_s
        (with read_every > 1, up to read_every - 1 steps past a stop are made, dropped, and counted)."""
    def logits(self, ids: list[int], positions: list[int] | None = None) -> torch.Tensor:
        """float32 [len(positions), vocab], through the chunked read, from a fresh cache."""
    def hidden_states(self, ids: list[int]) -> list[torch.Tensor]:
        """L + 1 tensors [len(ids), hidden]: each layer's input, then the final-norm output."""

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads, as held on the device."""

def layout_for(config_json: str | PathLike[str], ctx: int) -> Layout: ...
