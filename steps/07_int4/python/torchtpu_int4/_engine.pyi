"""Type stub for the Rust extension torchtpu_int4._engine (src/lib.rs)."""
from collections.abc import Callable, Iterator
from os import PathLike
from typing import Literal

import torch

TCH_VERSION: str
RUSTC_VERSION: str
BUILT_WITH_TORCH: str

Layout = tuple[int, int, int, int]  # (full_rings, sliding_rings, shared_layers, sliding_ring_len)
Stop = list[int] | tuple[int, ...] | set[int] | frozenset[int] | None

class TokenStream(Iterator[int]):
    """What Engine.stream / Engine.tokens return: each next() makes one decode step and yields its token; ends after
    max_new tokens or after the first stop id (which it yields). Another call on the engine ends it (RuntimeError)."""

    def __iter__(self) -> TokenStream: ...
    def __next__(self) -> int: ...
    def last_logits(self) -> torch.Tensor | None:
        """float32 [vocab]: the logits the last yielded token was picked from (before sampling filters)."""

class Engine:
    """Gemma 4 (E-series) text model in Rust, on the device of `like`, its 4-bit linears kept 4-bit. Belongs to the
    creating thread."""

    def __init__(
        self,
        model_dir: str | PathLike[str],
        emb4_dir: str | PathLike[str] | None,
        like: torch.Tensor,
        ctx: int,
        dtype: str = "bfloat16",
        progress: Callable[[int, int], object] | None = None,
        decode_slots: Literal["bucket", "all"] | None = None,
        attention_dtype: Literal["bfloat16", "float32"] | None = None,
        matvec: Literal["aten", "onednn"] | None = None,
        weights: Literal["int4", "bf16", "auto"] = "auto",
    ) -> None:
        """decode_slots: what a decode step's full layers attend over — "bucket" (the slots up to its position,
        rounded up to chunk × 2^k: a few shapes, no work on empty slots), "all" (every ctx slot: one compiled
        program at every position); None: "all" on a TPU, "bucket" elsewhere. Same tokens and logits either way.
        attention_dtype: what attention computes in (the caches are held in it); None: the compute dtype, except
        float32 for bfloat16 on a CPU whose bf16 matmul has no fast path (torch.ops.mkldnn._is_mkldnn_bf16_supported()
        is False: AVX2-only CPUs). "bfloat16" keeps Transformers' bf16 bits.
        matvec: the kernel for a decode step's one-row linears on a CPU — "aten" (oneDNN off for the call) or
        "onednn" (Transformers' decode kernel, bit for bit); None: "onednn" on an Intel CPU whose bf16 matmul has a
        fast path, "aten" elsewhere (from memory, ATen's ran at twice oneDNN's rate on an AVX-512 EPYC, oneDNN's at
        1.1-1.8 times ATen's on the Intel Xeons measured). It does not touch the int4 kernel.
        weights: "int4" (linears and a packed head kept 4-bit, multiplied by aten::_weight_int4pack_mm_for_cpu;
        NotImplementedError where it does not run), "bf16" (dequantized at load, as step 03), or "auto" (int4 where
        the kernel runs and dtype is bfloat16, else bf16)."""
    @property
    def weights(self) -> Literal["int4", "bf16"]: ...
    @property
    def weights_reason(self) -> str:
        """Why the linears are held so: what "auto" found, or what was asked for, and any matrix kept bf16."""
    @property
    def decode_slots(self) -> Literal["bucket", "all"]: ...
    @property
    def attention_dtype(self) -> Literal["bfloat16", "float32"]: ...
    @property
    def matvec(self) -> Literal["aten", "onednn"]: ...
    def layout(self) -> Layout: ...
    def generate(
        self,
        ids: list[int],
        max_new: int,
        read_every: int = 1,
        stop: Stop = None,
    ) -> tuple[list[int], float, float]:
        """Greedy tokens; (tokens, read_s, decode_s). Exactly max_new tokens, or with `stop` up to and including
        the first one in it; decode_s covers the decode steps made, so decode tok/s = (len(tokens) - 1) / decode_s
        (with read_every > 1, up to read_every - 1 steps past a stop are made, dropped, and counted)."""
    def stream(
        self,
        ids: list[int],
        max_new: int,
        stop: Stop = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> TokenStream:
        """prefill(ids), then tokens(max_new, ...): tokens yielded as they are made. Greedy unless temperature,
        top_k or top_p is set (temperature then defaults to 1.0); filtered as Transformers' temperature, top-k and
        top-p processors; the same seed, the same tokens (seed None: from the clock). Ctrl-C stops it."""
    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Read the prompt into a fresh cache; float32 [vocab] logits after its last token. Then: tokens(...)."""
    def tokens(
        self,
        max_new: int,
        stop: Stop = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> TokenStream:
        """The tokens after the last prefill (each prefill serves one stream), as stream() yields them."""
    def logits(self, ids: list[int], positions: list[int] | None = None) -> torch.Tensor:
        """float32 [len(positions), vocab], through the chunked read, from a fresh cache."""
    def hidden_states(self, ids: list[int]) -> list[torch.Tensor]:
        """L + 1 tensors [len(ids), hidden]: each layer's input, then the final-norm output."""

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads, as held on the device."""
    def memory(self) -> dict[str, int]:
        """Bytes held, by part: linears, head (0 when tied to embed_tokens as held), embed_tokens,
        embed_tokens_per_layer (0 when left in the file), norms and scalars, kv caches. The rest of the process is
        the runtime."""

def layout_for(config_json: str | PathLike[str], ctx: int) -> Layout: ...
def filtered_probs(
    logits: torch.Tensor, temperature: float | None = None, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """float32 probabilities after temperature, top-k, top-p (Transformers' processors): what tokens() samples."""
def sample(
    logits: torch.Tensor,
    n: int,
    seed: int,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
) -> list[int]:
    """n draws from one row of logits, exactly as tokens() samples."""
def int4_kernel(like: torch.Tensor) -> tuple[bool, str]:
    """Whether aten::_weight_int4pack_mm_for_cpu runs on like's device (tried on a small matrix), and why not."""
def repack(
    weight_packed: torch.Tensor, weight_scale: torch.Tensor, cols: int, dtype: str = "bfloat16"
) -> tuple[torch.Tensor, torch.Tensor]:
    """A checkpoint's packed matrix in the int4 kernel's layout, as the Engine makes it: uint8 [rows, cols / 2] and
    [cols / group, rows, 2] (scale, 0) in `dtype`. NotImplementedError for a shape the kernel does not take."""
