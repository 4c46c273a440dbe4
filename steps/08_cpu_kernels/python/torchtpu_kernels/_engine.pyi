"""Type stub for the Rust extension torchtpu_kernels._engine (src/lib.rs)."""
from collections.abc import Callable, Iterator
from os import PathLike
from typing import Literal

import torch

TCH_VERSION: str
RUSTC_VERSION: str
BUILT_WITH_TORCH: str

Layout = tuple[int, int, int, int]  # (full_rings, sliding_rings, shared_layers, sliding_ring_len)
Stop = list[int] | tuple[int, ...] | set[int] | frozenset[int] | None
DecodeBudget = dict  # {"tokens": list[int], "parts": list[tuple[str, float, float]], "step_s": float,
#                       "multiply_adds": dict[str, int]}
ReadBudget = dict  # {"token": int, "parts": list[tuple[str, float, int]], "read_s": float,
#                     "multiply_adds": dict[str, int]}

class TokenStream(Iterator[int]):
    """What Engine.stream / Engine.tokens return: each next() makes one decode step and yields its token; ends after
    max_new tokens or after the first stop id (which it yields). Another call on the engine ends it (RuntimeError)."""

    def __iter__(self) -> TokenStream: ...
    def __next__(self) -> int: ...
    def last_logits(self) -> torch.Tensor | None:
        """float32 [vocab]: the logits the last yielded token was picked from (before sampling filters)."""

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
        decode_slots: Literal["bucket", "all"] | None = None,
        attention_dtype: Literal["bfloat16", "float32"] | None = None,
        weights: Literal["auto", "int4", "bf16"] = "auto",
        int4_matmul: Literal["auto", "dot4", "fma4", "aten"] = "auto",
        matvec: Literal["aten", "onednn"] | None = None,
        decode_attention: Literal["auto", "own", "aten"] = "auto",
        kv_dtype: Literal["bfloat16", "float32"] | None = None,
    ) -> None:
        """decode_slots: what a decode step's full layers attend over — "bucket" (the slots up to its position,
        rounded up to 64 × 2^k, or chunk × 2^k for a chunk under 64: a few shapes, no work on empty slots), "all"
        (every ctx slot: one compiled program at every position); None: "all" on a TPU, "bucket" elsewhere. Same
        tokens and logits either way.
        attention_dtype: what attention computes in; None: the compute dtype, except
        float32 for bfloat16 on a CPU whose bf16 matmul has no fast path (torch.ops.mkldnn._is_mkldnn_bf16_supported()
        is False: AVX2-only CPUs). "bfloat16" keeps Transformers' bf16 bits.
        weights: "int4" (linears and a packed head 4-bit; NotImplementedError where aten::_weight_int4pack_mm_for_cpu
        does not run), "bf16" (dequantized at load: step 03's engine), "auto" (int4 where the kernel runs and
        dtype="bfloat16", else bf16; a matrix the kernel cannot take is held bf16 and named).
        int4_matmul: the int4 kernel — "dot4" (this step's torchtpu_dot4_mm: a CPU with AVX512-BF16, bfloat16;
        NotImplementedError elsewhere), "fma4" (torchtpu_fma4_mm: AVX2, FMA and F16C, bfloat16), "aten"
        (aten::_weight_int4pack_mm_for_cpu), "auto" (dot4 where it runs, else fma4, else aten).
        matvec: the kernel for a decode step's one-row dense linears on a CPU — "aten" (oneDNN off for the call) or
        "onednn" (Transformers' decode kernel, bit for bit); None: "onednn" on an Intel CPU whose bf16 matmul has a
        fast path, "aten" elsewhere (as step 03). It does not touch the int4 kernels.
        decode_attention: what runs the attention of a one-token pass (a decode step) over the cache — "own" (this
        step's torchtpu_attend_one, one call per layer: a CPU with AVX2 and FMA, bfloat16; NotImplementedError
        elsewhere), "aten" (ATen's ops, as step 03), "auto" (own where the linears run on dot4 or fma4, else aten).
        Own rounds as ATen does, its float32 sums in other orders.
        kv_dtype: what the caches hold keys and values in; None: bfloat16 where dtype is and decode_attention is own
        (which widens them as it reads them), else the attention dtype. A bfloat16 model's keys and values are bf16
        values: either holds them exactly, with the same bits; bfloat16 in half the bytes. ValueError for bfloat16
        caches with dtype="float32", whose keys and values they would round."""
    @property
    def weights(self) -> Literal["int4", "bf16"]:
        """How the linears are held."""
    @property
    def weights_reason(self) -> str:
        """Why: what weights="auto" found on this device, or what was asked for."""
    @property
    def int4_matmul(self) -> Literal["dot4", "fma4", "aten"] | None:
        """The kernel multiplying the matrices kept 4-bit; None with weights "bf16"."""
    @property
    def decode_slots(self) -> Literal["bucket", "all"]: ...
    @property
    def attention_dtype(self) -> Literal["bfloat16", "float32"]: ...
    @property
    def kv_dtype(self) -> Literal["bfloat16", "float32"]: ...
    @property
    def matvec(self) -> Literal["aten", "onednn"]: ...
    @property
    def decode_attention(self) -> Literal["own", "aten"]: ...
    @property
    def sliding_slots(self) -> Literal["bucket"]:
        """A sliding layer attends over as many of its ring's slots as the full caches' rule gives (step 03: the
        whole ring)."""
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
    def decode_budget(self, ids: list[int], steps: int) -> DecodeBudget:
        """Where a decode step's time goes: reads `ids`, makes `steps` greedy decode steps as generate does, each
        part of them timed on its own; per step on average: (name, seconds, bytes read as stored) for every part
        (they cover the whole step) and their sum step_s; the tokens (the read's first, then one per step)."""
    def read_budget(self, ids: list[int]) -> ReadBudget:
        """Where a prompt read's time goes: reads `ids` into a fresh cache as generate does (its chunks, the head on
        the last row, the first greedy token), each part timed on its own: (name, seconds, bytes read as stored) for
        every part, their sum read_s, and the first token."""
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
        """Bytes of weights one decode step reads, as held on the device (int4: nibbles and scales, and ATen's zero
        points where its kernel runs)."""
    def memory(self) -> dict[str, int]:
        """Bytes held, by part: linears, head, embed_tokens, embed_tokens_per_layer (0 when left in the file, as
        with int4 linears), norms and scalars, kv caches. The rest of the process is the runtime."""

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
    """Whether aten::_weight_int4pack_mm_for_cpu runs on like's device, and why not."""
def repack(
    weight_packed: torch.Tensor, weight_scale: torch.Tensor, cols: int, dtype: str = "bfloat16"
) -> tuple[torch.Tensor, torch.Tensor]:
    """A checkpoint's packed matrix in the int4 kernel's layout, as the Engine makes it: uint8 [rows, cols / 2]
    and [cols / group, rows, 2] (scale, 0) in `dtype`."""
def dot4_runs() -> bool:
    """Whether torchtpu_dot4_mm runs in this process: the CPU has AVX-512 F and BW and AVX512-BF16, ATen may use
    AVX-512 and oneDNN AVX512-BF16 (not under ONEDNN_MAX_CPU_ISA=AVX512_CORE, the stand-in for Skylake to Ice Lake)."""
def fma4_runs() -> bool:
    """Whether torchtpu_fma4_mm runs in this process: AVX2, FMA and F16C, and ATen allowed AVX2 at least."""
def fma4_subnormals() -> bool:
    """Whether fma4 reads its nibbles as float32 subnormals here (torchtpu_fma4_subnormal_mm) rather than converting
    them: on an AMD CPU, where the convert instruction set a decode step's pace. Both forms give the same bits."""
def amx4_runs() -> bool:
    """Whether dot4's products of 4 to 127 rows (a short prompt's) go by AMX's tiles here (torchtpu_amx4_mm, dot4's
    arithmetic): the CPU has AMX and AVX512-BF16, Linux lets the process use the tiles, ATen may use AVX-512 and
    oneDNN AMX."""
def fma16_runs() -> bool:
    """Whether this step's products of 4 to 127 rows (a short prompt's) go by fma4's arithmetic in AVX-512's 16 lanes
    here (torchtpu_fma16_mm) where AMX's tiles do not take dot4's (amx4_runs() goes first): AVX-512 F and BW, ATen
    allowed AVX-512, and an Intel CPU, where a 512-bit FMA issues twice a cycle and vdpbf16ps once every two, and where
    a Xeon without AVX512-BF16 (Skylake to Ice Lake) runs fma4 in 8 lanes."""
def panels_run() -> bool:
    """Whether dot4's prompt chunks (128 rows or more) go by panels here: unpacked to bf16 and multiplied by torch's
    bf16 matmul on AMX (the CPU has AMX and AVX512-BF16, ATen may use AVX-512 and oneDNN AMX). Where they do not
    run, an Intel CPU's dot4 takes chunks of 128 rows or more by float32 panels (torch's float32 matmul), as fma4
    always does; Engine.weights_reason names the way."""
def dot4_float_panels_run() -> bool:
    """Whether dot4's prompt chunks (128 rows or more) go by float32 panels here, as fma4's: dot4 runs, its bf16
    panels do not (panels_run()), and the CPU is an Intel one (MKL's float32 product is the faster there)."""
def fma_limit(rounds: int = 20_000_000, tries: int = 3) -> float:
    """The arithmetic limit of a prompt read on fma4's CPUs, float32 GFLOP/s (two a multiply-add): AVX2's 8-lane FMAs
    on all of torch's threads at once, best of `tries`. fma4 and MKL's AVX2 product multiply with this instruction, so
    no product of theirs goes faster. RuntimeError where fma4 does not run."""

class Int4Linear:
    """A checkpoint's packed matrix kept 4-bit as the Engine keeps its linears, for one kernel ("aten", "dot4",
    "fma4", or "auto" as the Engine's int4_matmul);
    called on x [tokens, cols] in `dtype`, gives x · Wᵀ in that dtype."""

    def __init__(
        self,
        weight_packed: torch.Tensor,
        weight_scale: torch.Tensor,
        cols: int,
        dtype: Literal["bfloat16", "float32"] = "bfloat16",
        matmul: Literal["aten", "dot4", "fma4", "auto"] = "aten",
    ) -> None: ...
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...
    @property
    def nbytes(self) -> int:
        """Bytes one product reads: nibbles and scales (and ATen's zero points) as held."""
    @property
    def matmul(self) -> Literal["aten", "dot4", "fma4"]:
        """The kernel it was made for."""
