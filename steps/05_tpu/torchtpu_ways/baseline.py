"""The Python baseline: Gemma 4 (E-series) in plain PyTorch, with the Rust engine's design, so the race is fair.

Same files, same stored weights (linears dequantized once to the compute dtype, norms in float32, the emb4 twin's
tables kept packed and only gathered rows unpacked), same fixed-size caches (a ring of `2 * window` slots per
cache-owning sliding layer, `ctx` slots per full layer, each slot's position kept beside it, -1 = empty), same
chunked prompt read and on-device greedy choice, and the same parts under the same names (`RmsNorm`, `Rotary`,
`Attention`, `Mlp`, `PerLayerInput`, `DecoderLayer`, `PerLayerInputs`, `Cache`): steps/03_model/src/gemma.rs is
the Rust twin of this file, where a part's `__call__` here is its `forward`. What differs is who runs the ops:
here PyTorch eager, or `torch.compile` turning `decode_step` into one graph (the compile harness is in
`compiling`).

    model = Baseline(model_dir, emb4_dir, "cpu", ctx=2048, dtype="bfloat16", compile=True)
    tokens, read_s, decode_s = model.generate(ids, max_new=64)
"""
import operator
import time
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from .checkpoint import Checkpoint, DenseTable, PackedTable, TextConfig, nbytes
from .inductor_cache import key_on_this_cpu
from .slots import DECODE_SLOTS, decode_slots_for, full_slots_for  # the cache's rules (re-exported here too)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


# --8<-- [start:ops]
def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# --8<-- [start:matvec]
MATVECS = ("aten", "onednn")
_one_row_in_aten = False  # set for an eager decode step by `one_row_in_aten`; read by `linear`


def matvec_default(device) -> str:
    """The kernel an eager decode step's one-row linears run on unless told: oneDNN's on an Intel CPU whose bf16
    matmul has a fast path (there its one-row product streams a matrix from memory faster than ATen's), ATen's
    elsewhere (twice oneDNN's rate on an AMD EPYC; without the fast path oneDNN takes no bf16 product). As the Rust
    Engine; bench.py times both kernels."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    if kind != "cpu" or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "aten"
    with open("/proc/cpuinfo") as f:
        intel = any(line.startswith("vendor_id") and line.rstrip().endswith("GenuineIntel") for line in f)
    return "onednn" if intel else "aten"


@contextmanager
def one_row_in_aten(aten: bool):
    """Within: one-row linears (a decode step's) on ATen's mat-vec when `aten`, else on oneDNN's (a prompt chunk's
    rows stay on oneDNN's either way, much the faster for them). ATen's kernel sums in another order, so an output
    now and then differs in its last bf16 bit (bench.py times both kernels and counts the bits)."""
    global _one_row_in_aten
    before, _one_row_in_aten = _one_row_in_aten, aten
    try:
        yield
    finally:
        _one_row_in_aten = before


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`x @ w.T`; one row inside `one_row_in_aten(True)` with oneDNN switched off for the call."""
    if not (_one_row_in_aten and x.shape[0] == 1):
        return F.linear(x, w)
    before, torch.backends.mkldnn.enabled = torch.backends.mkldnn.enabled, False
    try:
        return F.linear(x, w)
    finally:
        torch.backends.mkldnn.enabled = before
# --8<-- [end:matvec]


def in_dtype(value: float, dtype: torch.dtype) -> float:
    """A Python constant rounded to the compute dtype first, as Transformers' `tensor(s).to(dtype)` does."""
    return torch.tensor(value, dtype=torch.float32).to(dtype).item()


class RmsNorm:
    """Gemma 4's RMSNorm, in float32: `x * (mean(x²) + eps)^-0.5 * w` (no `1 + w`; `pow`, not `rsqrt`). The weight
    stays float32; values are normed without one."""

    def __init__(self, weight: torch.Tensor | None, eps: float):
        self.weight, self.eps = weight, eps

    @classmethod
    def load(cls, ckpt: Checkpoint, name: str, eps: float, device) -> "RmsNorm":
        return cls(ckpt.dense(f"{name}.weight", torch.float32, device), eps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * (xf.pow(2).mean(-1, keepdim=True) + self.eps).pow(-0.5)
        return (y if self.weight is None else y * self.weight).to(x.dtype)


class Rotary:
    """RoPE inverse frequencies (float32) of one attention kind. "proportional" (full layers) rotates only the first
    `partial_rotary_factor * d / 2` pairs; the rest get frequency 0."""

    def __init__(self, cfg: TextConfig, full: bool, device):
        rope = cfg.rope_parameters["full_attention" if full else "sliding_attention"]
        d = cfg.global_head_dim if full else cfg.head_dim
        pairs = int(rope.get("partial_rotary_factor", 1.0) * d) // 2 if rope["rope_type"] == "proportional" else d // 2
        freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, 2 * pairs, 2).float() / d)
        if rope["rope_type"] == "proportional":
            freq = freq / rope.get("factor", 1.0)  # Transformers' `inv_freq /= factor` (default 1)
        self.inv_freq = torch.cat([freq, torch.zeros(d // 2 - pairs)]).to(device)

    def at(self, pos: torch.Tensor, dtype: torch.dtype) -> "Rotation":
        """The rotation at positions `pos`: angles in float32, cos and sin cast to the compute dtype."""
        angles = pos.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)
        angles = torch.cat([angles, angles], -1).unsqueeze(1)
        return Rotation(angles.cos().to(dtype), angles.sin().to(dtype))


class Rotation:
    """cos and sin [tokens, 1, d] of one pass's positions."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):
        self.cos, self.sin = cos, sin

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """`x * cos + rotate_half(x) * sin` on [tokens, heads, d]: dim i pairs with i + d/2."""
        half = x.shape[-1] // 2
        return x * self.cos + torch.cat([-x[..., half:], x[..., :half]], -1) * self.sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Attention of q [tokens, heads, d] over cache slots k, v [kv_heads, slots, d], `masked` [tokens, slots]
    marking the slots a query must not see. Query heads that share a KV head are stacked along the token axis
    (no copies of K and V); scaling 1.0; softmax in float32 over scores masked with the dtype's lowest value."""
    tokens, heads, d = q.shape
    kv_heads = k.shape[0]
    group = heads // kv_heads
    q = q.permute(1, 0, 2).reshape(kv_heads, group * tokens, d)
    # A decode step: (k @ q^T)^T, so the cache is the left operand and is read where it lies (as k^T on the right,
    # the CPU's batched matmul first copies all of it, every layer, every step). A prompt chunk: q @ k^T, whose
    # copy the chunk's tokens share, and whose scores come out in the layout the mask and softmax read fast.
    if tokens == 1:
        scores = (k @ q.transpose(1, 2)).transpose(1, 2)
    else:
        scores = q @ k.transpose(1, 2)
    scores = scores.unflatten(1, (group, tokens)).masked_fill_(masked, torch.finfo(q.dtype).min)
    # Transformers' softmax(dtype=float32).to(bf16), in one kernel: a bf16 softmax computes in float32, rounds once
    probs = scores.softmax(-1)
    out = probs.reshape(kv_heads, group * tokens, -1) @ v
    return out.view(heads, tokens, d).permute(1, 0, 2).reshape(tokens, heads * d)
# --8<-- [end:ops]


class KeyValueProjections:
    """The key and value projections of a layer that owns a cache."""

    def __init__(self, k_proj: torch.Tensor, k_norm: RmsNorm, v_proj: torch.Tensor):
        self.k_proj, self.k_norm, self.v_proj = k_proj, k_norm, v_proj


class Attention:
    """Self-attention: q/k/v projections, q and k RMS-normed (v without a weight), RoPE after the norms."""

    def __init__(self, ckpt: Checkpoint, cfg: TextConfig, i: int, dtype: torch.dtype, device):
        def matrix(name):
            return ckpt.linear(f"layers.{i}.self_attn.{name}", dtype, device)

        def norm(name):
            return RmsNorm.load(ckpt, f"layers.{i}.self_attn.{name}", cfg.rms_norm_eps, device)

        self.layer = i  # where it writes its keys and values
        self.kv_source = cfg.kv_source(i)  # whose cache it attends over: its own, or the one it shares
        self.head_dim = cfg.head_dim_of(i)
        self.q_proj, self.q_norm = matrix("q_proj"), norm("q_norm")
        # None on KV-shared layers: stray k/v projections in a file are ignored
        self.kv = KeyValueProjections(matrix("k_proj"), norm("k_norm"), matrix("v_proj")) \
            if self.kv_source == i else None
        self.v_norm = RmsNorm(None, cfg.rms_norm_eps)
        self.o_proj = matrix("o_proj")

    def __call__(self, x: torch.Tensor, rotation: Rotation, slots: "Slots", cache: "Cache") -> torch.Tensor:
        def heads(w):
            return linear(x, w).view(x.shape[0], -1, self.head_dim)

        q = rotation.rotate(self.q_norm(heads(self.q_proj)))
        if self.kv is not None:
            k = rotation.rotate(self.kv.k_norm(heads(self.kv.k_proj)))
            v = self.v_norm(heads(self.kv.v_proj))
            cache.write(self.layer, slots, k, v)
        # A KV-shared layer reads the cache its source layer wrote earlier in this same pass
        keys, values = cache.seen(self.kv_source, slots)
        # attention runs in the cache's dtype: the compute dtype, or float32 where bf16 matmul is slow
        out = attend(q.to(keys.dtype), keys, values, slots.masked).to(x.dtype)
        return linear(out, self.o_proj)


class Mlp:
    """The feed-forward block: down(gelu_tanh(gate(x)) * up(x)); double-wide on KV-shared layers."""

    def __init__(self, ckpt: Checkpoint, i: int, dtype: torch.dtype, device):
        self.gate_proj, self.up_proj, self.down_proj = (
            ckpt.linear(f"layers.{i}.mlp.{name}", dtype, device) for name in ("gate_proj", "up_proj", "down_proj"))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(gelu(linear(x, self.gate_proj)) * linear(x, self.up_proj), self.down_proj)


class PerLayerInput:
    """How a layer takes in its per-layer input (see `PerLayerInputs`): a gate computed from the residual stream,
    times the layer's slice of the per-layer inputs, projected back to the hidden size."""

    def __init__(self, ckpt: Checkpoint, i: int, dtype: torch.dtype, device):
        self.gate = ckpt.linear(f"layers.{i}.per_layer_input_gate", dtype, device)
        self.projection = ckpt.linear(f"layers.{i}.per_layer_projection", dtype, device)

    def __call__(self, x: torch.Tensor, per_layer_input: torch.Tensor) -> torch.Tensor:
        return linear(gelu(linear(x, self.gate)) * per_layer_input, self.projection)


class DecoderLayer:
    """One decoder layer: three residual branches (attention, feed-forward, per-layer input), each normed before it
    is added, then the layer scalar."""

    def __init__(self, ckpt: Checkpoint, cfg: TextConfig, i: int, dtype: torch.dtype, device):
        def norm(name):
            return RmsNorm.load(ckpt, f"layers.{i}.{name}", cfg.rms_norm_eps, device)

        self.full = cfg.is_full(i)
        self.input_norm = norm("input_layernorm")
        self.attention = Attention(ckpt, cfg, i, dtype, device)
        self.post_attention_norm = norm("post_attention_layernorm")
        self.pre_feedforward_norm = norm("pre_feedforward_layernorm")
        self.mlp = Mlp(ckpt, i, dtype, device)
        self.post_feedforward_norm = norm("post_feedforward_layernorm")
        self.per_layer_input = PerLayerInput(ckpt, i, dtype, device)
        self.post_per_layer_input_norm = norm("post_per_layer_input_norm")
        self.layer_scalar = ckpt.dense(f"layers.{i}.layer_scalar", dtype, device)

    # --8<-- [start:layer]
    def __call__(self, x: torch.Tensor, per_layer_input: torch.Tensor, rotation: Rotation, slots: "Slots",
                 cache: "Cache") -> torch.Tensor:
        x = x + self.post_attention_norm(self.attention(self.input_norm(x), rotation, slots, cache))
        x = x + self.post_feedforward_norm(self.mlp(self.pre_feedforward_norm(x)))
        x = x + self.post_per_layer_input_norm(self.per_layer_input(x, per_layer_input))
        return x * self.layer_scalar  # the scalar scales the whole residual stream
    # --8<-- [end:layer]


class PerLayerInputs:
    """Gemma's E-series signature: each token brings every layer an input of its own, a token-identity part (a
    second, huge embedding table) plus a context part (a projection of the embeddings), made once per pass."""

    def __init__(self, table: DenseTable | PackedTable, model: Checkpoint, cfg: TextConfig, dtype: torch.dtype,
                 device):
        self.table = table
        self.table_scale = in_dtype(cfg.hidden_size_per_layer_input ** 0.5, dtype)
        self.model_projection = model.linear("per_layer_model_projection", dtype, device)
        self.projection_norm = RmsNorm.load(model, "per_layer_projection_norm", cfg.rms_norm_eps, device)
        self.hidden_size = cfg.hidden_size
        self.shape = (cfg.num_hidden_layers, cfg.hidden_size_per_layer_input)

    def __call__(self, ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[tokens, layers, size] for the tokens `ids`, whose scaled embeddings are `embeds`."""
        shape = (ids.shape[0], *self.shape)
        identity = self.table.rows(ids).to(embeds.dtype) * self.table_scale
        context = linear(embeds, self.model_projection) * self.hidden_size ** -0.5
        context = self.projection_norm(context.view(shape))
        return (context + identity.view(shape)) * 2 ** -0.5


# --8<-- [start:decode_slots]
def decode_slots_default(device) -> str:
    """What a decode step attends over unless told: on a TPU all `ctx` slots (one shape, so one compiled program at
    every position: the article's point); elsewhere the visible bucket (a few shapes, no work on empty slots)."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    return "all" if kind == "tpu" else "bucket"
# --8<-- [end:decode_slots]


# --8<-- [start:attention_dtype]
def attention_dtype_default(dtype: torch.dtype, device) -> torch.dtype:
    """The dtype attention computes in unless told (the caches are held in it): the compute dtype, except
    bfloat16 on a CPU where torch's bf16 matmul has no fast path (oneDNN finds no AVX-512 or AMX there), where
    float32 attention over a long cache is several times faster. As the Rust Engine."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    slow_bf16 = kind == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return torch.float32 if dtype == torch.float32 or slow_bf16 else torch.bfloat16
# --8<-- [end:attention_dtype]


class Slots:
    """Where one pass's tokens go in the caches of one attention kind, and what its queries may see: `written`
    (int64 [tokens], each token's slot), `seen_slots` (the queries attend over a cache's first `seen_slots`
    slots) and `masked` (bool [tokens, seen_slots], true where a query must not see a slot)."""

    def __init__(self, written: torch.Tensor, seen_slots: int, masked: torch.Tensor):
        self.written, self.seen_slots, self.masked = written, seen_slots, masked


# --8<-- [start:cache]
class Cache:
    """Keys and values of every cache-owning layer, and the bookkeeping: which position each slot holds (-1 =
    empty). Sliding layers: a ring of `2 * window` slots (a prompt chunk of `window` tokens still sees the window
    before it); full layers: `ctx` slots. Shapes never change, so every decode step is the same program."""

    def __init__(self, cfg: TextConfig, ctx: int, dtype: torch.dtype, device, static: bool):
        ring = 2 * cfg.sliding_window
        self.window = cfg.sliding_window
        self.layers = []  # per layer: (keys, values) [kv_heads, slots, head_dim], or None for a KV-shared layer
        for i in range(cfg.num_hidden_layers):
            shape = (cfg.kv_heads_of(i), ctx if cfg.is_full(i) else ring, cfg.head_dim_of(i))
            # zeros, never NaN: masked slots are still multiplied by 0
            self.layers.append((torch.zeros(shape, dtype=dtype, device=device),
                                torch.zeros(shape, dtype=dtype, device=device)) if cfg.kv_source(i) == i else None)
        self.positions = {False: torch.full((ring,), -1, device=device), True: torch.full((ctx,), -1, device=device)}
        if static:  # for torch.compile (importing dynamo takes seconds: eager runs skip it)
            # Updated in place by the compiled step: tell dynamo these tensors keep their address from call to
            # call, so the compiled program writes into them rather than treating them as new inputs each time.
            for t in [*self.positions.values(), *(t for kv in self.layers if kv for t in kv)]:
                torch._dynamo.mark_static_address(t)

    def bytes(self) -> int:
        """Bytes the caches hold: keys, values and the slot positions."""
        return nbytes(*(t for kv in self.layers if kv for t in kv), *self.positions.values())

    def clear(self) -> None:
        """Every slot empty; the stale keys and values stay, masked."""
        for positions in self.positions.values():
            positions.fill_(-1)

    def place(self, pos: torch.Tensor, full_slots: int) -> dict[bool, Slots]:
        """Records that the tokens at positions `pos` (int64 [tokens]) now occupy their slots (position p in slot
        p mod the cache's length) and returns, per attention kind (`full`), those slots and what each token may
        see. Full layers attend over the first `full_slots` slots, sliding layers over their whole ring."""
        query = pos.unsqueeze(1)
        placed = {}
        for full, positions in self.positions.items():
            written = pos % positions.shape[0]
            positions.index_copy_(0, written, pos)
            seen_slots = full_slots if full else positions.shape[0]
            key = positions[:seen_slots]
            visible = (key >= 0) & (key <= query)
            if not full:  # key k is visible to query q iff q - window < k <= q
                visible = visible & (key > query - self.window)
            placed[full] = Slots(written, seen_slots, ~visible)
        return placed

    def write(self, layer: int, slots: Slots, k: torch.Tensor, v: torch.Tensor) -> None:
        """A cache owner's keys and values [tokens, kv_heads, head_dim] into their slots."""
        keys, values = self.layers[layer]
        keys.index_copy_(1, slots.written, k.transpose(0, 1).to(keys.dtype))
        values.index_copy_(1, slots.written, v.transpose(0, 1).to(values.dtype))

    def seen(self, layer: int, slots: Slots) -> tuple[torch.Tensor, torch.Tensor]:
        """The slots of `layer`'s cache its queries attend over: (keys, values)."""
        keys, values = self.layers[layer]
        return keys[:, :slots.seen_slots], values[:, :slots.seen_slots]
# --8<-- [end:cache]


def stop_ids(stop: Iterable[int] | None, vocab: int) -> frozenset[int]:
    """`generate`'s stop ids, checked as the Rust engine checks them: a list, tuple or set of ints in [0, vocab)."""
    if stop is None:
        return frozenset()
    if not isinstance(stop, (list, tuple, set, frozenset)):
        raise TypeError(f"stop: expected a list, tuple or set of ints, got {type(stop).__name__} {stop!r}")
    ids = []
    for t in stop:
        try:
            ids.append(operator.index(t))  # what the engine takes for an int: anything with __index__
        except TypeError:
            raise TypeError(f"stop: expected ints, got {type(t).__name__} {t!r}") from None
        if not 0 <= ids[-1] < vocab:
            raise ValueError(f"stop: {ids[-1]} is outside the vocabulary [0, {vocab})")
    return frozenset(ids)


class Baseline:
    """Gemma 4 text model in plain PyTorch, with the Rust Engine's interface.

    model_dir: a -text checkpoint (config.json + safetensors, one file or sharded; CausalLM or multimodal layout).
    emb4_dir: None, or the -text-emb4 twin: every table it holds packed comes from it and stays packed.
    device: where to run (a torch.device or its name: "cpu", "cuda:0", "tpu:0").
    ctx: context length, the length of the full-attention caches. dtype: "bfloat16" or "float32".
    compile: run the prompt read and every decode step through `torch.compile(decode_step)` (to compile
        `decode_step` yourself, pass compile=True too: it marks the caches for dynamo).
    decode_slots: what a decode step's full layers attend over: "bucket" (the slots up to its position rounded up
        to chunk × 2^k, as a prompt chunk's: one compiled program per bucket), "all" (all ctx slots: one program
        at every position), or None: "all" on a TPU, else "bucket" (as the Rust Engine). Same bits either way
        (without AVX-512 the logits a float32 rounding apart: MKL sums a row of more slots in another order).
    attention_dtype: "bfloat16", "float32", or None: the compute dtype, except float32 for bfloat16 on a CPU
        whose bf16 matmul has no fast path (`attention_dtype_default`). The caches are held in it.
    matvec: the kernel for an eager decode step's one-row linears on a CPU: "aten" (ATen's mat-vec, oneDNN off
        for the call), "onednn" (Transformers' kernel, bit for bit), or None: the faster on this kind of CPU
        (`matvec_default`, as the Rust Engine). A compiled step runs the kernels inductor picks.
    """

    # --8<-- [start:load]
    def __init__(self, model_dir, emb4_dir, device, ctx: int, dtype: str = "bfloat16", compile: bool = False,
                 decode_slots: str | None = None, attention_dtype: str | None = None, matvec: str | None = None):
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: use \"bfloat16\" or \"float32\"")
        if decode_slots not in (None, *DECODE_SLOTS):
            raise ValueError(f"decode_slots={decode_slots!r}: use \"bucket\", \"all\" or None")
        if attention_dtype not in (None, *DTYPES):
            raise ValueError(f"attention_dtype={attention_dtype!r}: use \"bfloat16\", \"float32\" or None")
        if matvec not in (None, *MATVECS):
            raise ValueError(f"matvec={matvec!r}: use \"aten\", \"onednn\" or None")
        self.decode_slots = decode_slots or decode_slots_default(device)
        self.matvec, self.compiled = matvec or matvec_default(device), compile
        self.cfg = cfg = TextConfig.from_file(Path(model_dir) / "config.json")
        if not 1 <= ctx <= cfg.max_position_embeddings:
            raise ValueError(f"ctx={ctx}: must be between 1 and max_position_embeddings={cfg.max_position_embeddings}")
        self.dtype, self.device, self.ctx = DTYPES[dtype], torch.device(device), ctx
        model = Checkpoint(model_dir)
        twin = Checkpoint(emb4_dir) if emb4_dir else None

        def packed_in_twin(name):
            return twin is not None and twin.has(f"{name}.weight_packed")

        def table(name):
            return (twin if packed_in_twin(name) else model).table(name, self.device)

        self.embed_tokens = table("embed_tokens")
        self.embed_scale = in_dtype(cfg.hidden_size ** 0.5, self.dtype)  # sqrt(1536) = 39.19 -> 39.25 in bf16
        self.per_layer_inputs = PerLayerInputs(table("embed_tokens_per_layer"), model, cfg, self.dtype, self.device)
        # The head reads every row every token: dequantized once, in the compute dtype. As Transformers: tied,
        # it is the embedding table whatever else the checkpoint ships (no copy when the dtypes agree); untied,
        # the checkpoint's `lm_head`. With the twin, its config says (the emb4 repack unties the head to pack it).
        tied = TextConfig.from_file(Path(emb4_dir) / "config.json").tie_word_embeddings if twin else \
            cfg.tie_word_embeddings
        head = twin if packed_in_twin("lm_head") else model
        if tied:
            self.lm_head = self.embed_tokens.dequantize().to(self.dtype)
        elif head.has("lm_head.weight_packed") or head.has("lm_head.weight"):
            self.lm_head = head.linear("lm_head", self.dtype, self.device)
        else:
            raise ValueError(f"{model_dir}: tie_word_embeddings is false but no lm_head tensor is in the checkpoint"
                             + (" or its twin" if twin else ""))
        self.rotary = {full: Rotary(cfg, full, self.device) for full in (False, True)}
        self.layers = [DecoderLayer(model, cfg, i, self.dtype, self.device) for i in range(cfg.num_hidden_layers)]
        self.norm = RmsNorm.load(model, "norm", cfg.rms_norm_eps, self.device)
        self.attention_dtype = DTYPES[attention_dtype] if attention_dtype else \
            attention_dtype_default(self.dtype, self.device)
        self.cache = Cache(cfg, ctx, self.attention_dtype, self.device, static=compile)
        # --8<-- [end:load]
        # --8<-- [start:compile]
        # dynamic=False: one static-shape graph per input shape (a prompt chunk, a decode step), never a
        # symbolic one. fullgraph=False, so that dynamo reports breaks (see `compiling.dynamo_counts`) instead of
        # raising.
        if compile:  # before torch.compile, which opens inductor's cache folder (and so fixes its name)
            key_on_this_cpu()  # graphs compiled under the AVX2 limit and without it must not meet (inductor_cache)
        self.step = torch.compile(self.decode_step, dynamic=False) if compile else self.decode_step
        if compile:
            from .compiling import allow_recompiles  # here, not at the top: importing dynamo takes seconds

            allow_recompiles(ctx, cfg.sliding_window, self.decode_slots)
        # --8<-- [end:compile]

    def read_whole(self) -> dict[str, list[torch.Tensor]]:
        """The tensors a decode step reads whole (not a row of a table), by part, as the Rust engine counts them:
        linears (every layer's matrices and the per-layer projection), head, norms and scalars."""
        inputs = self.per_layer_inputs
        linears, norms = [inputs.model_projection], [inputs.projection_norm.weight, self.norm.weight]
        for layer in self.layers:
            attention, mlp, per_layer_input = layer.attention, layer.mlp, layer.per_layer_input
            linears += [attention.q_proj, attention.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj,
                        per_layer_input.gate, per_layer_input.projection]
            norms += [layer.input_norm.weight, attention.q_norm.weight, layer.post_attention_norm.weight,
                      layer.pre_feedforward_norm.weight, layer.post_feedforward_norm.weight,
                      layer.post_per_layer_input_norm.weight, layer.layer_scalar]
            if attention.kv is not None:
                linears += [attention.kv.k_proj, attention.kv.v_proj]
                norms.append(attention.kv.k_norm.weight)
        return {"linears": linears, "head": [self.lm_head], "norms and scalars": norms}

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads, as held (as the Rust engine counts them): every layer's
        matrices, norms and scalar, the per-layer projection, the final norm and head, one row of each table."""
        whole = sum(nbytes(*tensors) for tensors in self.read_whole().values())
        return whole + self.embed_tokens.row_bytes() + self.per_layer_inputs.table.row_bytes()

    def memory(self) -> dict[str, int]:
        """Bytes held, by part, as the Rust engine's `memory()`: linears, head (0 when it is the embedding table
        itself), embed_tokens, embed_tokens_per_layer, norms and scalars, kv caches."""
        whole = {part: nbytes(*tensors) for part, tensors in self.read_whole().items()}
        table = self.embed_tokens
        tied = isinstance(table, DenseTable) and self.lm_head.data_ptr() == table.weight.data_ptr()
        return {"linears": whole["linears"], "head": 0 if tied else whole["head"], "embed_tokens": table.bytes(),
                "embed_tokens_per_layer": self.per_layer_inputs.table.bytes(),
                "norms and scalars": whole["norms and scalars"], "kv caches": self.cache.bytes()}

    def layout(self) -> tuple[int, int, int, int]:
        """(full_rings, sliding_rings, shared_layers, sliding_ring_len), as the Rust engine's layout()."""
        return self.cfg.layout()

    # --8<-- [start:forward]
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, full_slots: int) -> torch.Tensor:
        """One pass over `ids` at positions `pos` (int64 device tensors [tokens]), writing their keys and values
        into the cache; full layers attend over its first `full_slots` slots (all `ctx` for a decode step).
        Returns the final-norm hidden states [tokens, hidden]."""
        x = self.embed_tokens.rows(ids).to(self.dtype) * self.embed_scale
        per_layer_inputs = self.per_layer_inputs(ids, x)
        slots = self.cache.place(pos, full_slots)
        rotations = {full: rotary.at(pos, self.dtype) for full, rotary in self.rotary.items()}
        for i, layer in enumerate(self.layers):
            x = layer(x, per_layer_inputs[:, i], rotations[layer.full], slots[layer.full], self.cache)
        return self.norm(x)
    # --8<-- [end:forward]

    def head(self, out: torch.Tensor) -> torch.Tensor:
        """Logits [tokens, vocab]: the output head, then `tanh(x / cap) * cap` when the config sets a cap."""
        logits = linear(out, self.lm_head)
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    # --8<-- [start:decode_step]
    def decode_step(self, ids: torch.Tensor, pos: torch.Tensor, full_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Read `ids` at `pos` into the cache and pick the next token on the device: returns it ([1], int64) and
        its position. Tokens and positions stay device tensors; the only Python number is `full_slots`: always
        `ctx` with decode_slots="all", so a compiled step is one program whatever the position; a bucket size with
        "bucket" (and for a prompt chunk): one program per bucket."""
        out = self.forward(ids, pos, full_slots)
        token = self.head(out[-1:]).argmax(-1)
        return token, pos[-1:] + 1
    # --8<-- [end:decode_step]

    def chunks(self, ids: list[int]):
        """The prompt in chunks of `window` tokens: (ids, positions) device tensors and the chunk's full_slots."""
        w = self.cfg.sliding_window
        for start in range(0, len(ids), w):
            chunk = ids[start:start + w]
            yield (torch.tensor(chunk, dtype=torch.int64, device=self.device),
                   torch.arange(start, start + len(chunk), device=self.device),
                   full_slots_for(start + len(chunk), w, self.ctx))

    def vocabulary(self) -> int:
        """The ids both embedding tables hold: what a prompt may contain."""
        return min(self.cfg.vocab_size, self.cfg.vocab_size_per_layer_input)

    def check_ids(self, ids: list[int]) -> None:
        """Prompt ids must be in the vocabulary and fit the context (as the engine checks)."""
        if not ids:
            raise ValueError("ids: the prompt is empty; it needs at least one token (e.g. <bos> = 2)")
        if len(ids) > self.ctx:
            raise ValueError(f"ids: {len(ids)} tokens do not fit ctx={self.ctx}")
        vocab = self.vocabulary()
        bad = next(((i, t) for i, t in enumerate(ids) if not 0 <= t < vocab), None)
        if bad:
            raise ValueError(f"ids[{bad[0]}] = {bad[1]} is outside the vocabulary [0, {vocab})")

    # --8<-- [start:generate]
    def generate(self, ids: list[int], max_new: int, read_every: int = 1,
                 stop: Iterable[int] | None = None) -> tuple[list[int], float, float]:
        """Greedy tokens after `ids`: exactly `max_new`, or with `stop` (a list, tuple or set of ids) up to and
        including the first one in `stop`; and the seconds for the prompt read (which yields the first token) and
        for the decode steps made after it, so decode tok/s = (len(tokens) - 1) / decode_s. Tokens reach the host
        every `read_every` steps, and a stop is seen only then: with read_every > 1, up to read_every - 1 steps
        past it are made, dropped, and counted in decode_s (as in the Rust engine)."""
        self.check_ids(ids)
        stop = stop_ids(stop, self.vocabulary())
        if max_new < 0 or len(ids) + max_new > self.ctx:
            raise ValueError(f"max_new={max_new}: need 0 <= max_new and len(ids) + max_new <= ctx ({self.ctx})")
        if read_every < 1:
            raise ValueError(f"read_every={read_every}: must be >= 1")
        start = time.perf_counter()
        self.cache.clear()
        for chunk, positions, slots in self.chunks(ids):
            token, pos = self.step(chunk, positions, slots)
        if max_new == 0:
            return [], time.perf_counter() - start, 0.0
        tokens = [token.item()]  # the copy to the host also waits for the device
        read_s = time.perf_counter() - start

        start = time.perf_counter()
        stopped, pending, made = tokens[0] in stop, [], 1
        while made < max_new and not stopped:
            # the step's position is len(ids) + made - 1, known on the host: only its bucket reaches the step
            slots = decode_slots_for(len(ids) + made - 1, self.cfg.sliding_window, self.ctx, self.decode_slots)
            with one_row_in_aten(self.matvec == "aten" and not self.compiled):
                token, pos = self.step(token, pos, slots)
            pending.append(token)
            made += 1
            if len(pending) == read_every or made == max_new:
                read = torch.cat(pending).tolist()
                stopped = any(t in stop for t in read)
                tokens += read
                pending = []
        decode_s = time.perf_counter() - start
        end = next((n for n, t in enumerate(tokens) if t in stop), None)
        return (tokens if end is None else tokens[:end + 1]), read_s, decode_s
    # --8<-- [end:generate]

    def logits(self, ids: list[int], positions: list[int] | None = None) -> torch.Tensor:
        """float32 [n, vocab] logits at `positions` (indices into ids; default all), through the same chunked
        read and caches as generate, from a fresh cache (always eager: shapes vary with the positions)."""
        self.check_ids(ids)
        positions = list(range(len(ids))) if positions is None else list(positions)
        if any(not 0 <= p < len(ids) for p in positions):
            raise ValueError(f"positions: each must index ids (len {len(ids)})")
        self.cache.clear()
        rows = {}
        for n, (chunk, chunk_pos, slots) in enumerate(self.chunks(ids)):
            out = self.forward(chunk, chunk_pos, slots)
            start = n * self.cfg.sliding_window
            for p in positions:
                if start <= p < start + len(chunk):
                    rows[p] = self.head(out[p - start:p - start + 1]).float()
        if not positions:
            return torch.empty(0, self.cfg.vocab_size, device=self.device)
        return torch.cat([rows[p] for p in positions])
