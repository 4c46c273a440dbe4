"""The Python baseline: Gemma 4 (E-series) in plain PyTorch, with the Rust engine's design, so the race is fair.

Same files, same stored weights (linears dequantized once to the compute dtype, norms in float32, the emb4 twin's
tables kept packed and only gathered rows unpacked), same fixed-size caches (a ring of `2 * window` slots per
cache-owning sliding layer, `ctx` slots per full layer, each slot's position kept beside it, -1 = empty), same
chunked prompt read and on-device greedy choice. What differs is who runs the ops: here PyTorch eager, or
`torch.compile` turning `decode_step` into one graph (steps/03_model/src/gemma.rs is the Rust twin of this file).

    model = Baseline(model_dir, emb4_dir, "cpu", ctx=2048, dtype="bfloat16", compile=True)
    tokens, read_s, decode_s = model.generate(ids, max_new=64)
"""
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .checkpoint import Checkpoint, TextConfig

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


# --8<-- [start:ops]
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Gemma 4's RMSNorm, in float32: `x * (mean(x²) + eps)^-0.5 * w` (no `1 + w`; `pow`, not `rsqrt`)."""
    xf = x.float()
    y = xf * (xf.pow(2).mean(-1, keepdim=True) + eps).pow(-0.5)
    return (y if weight is None else y * weight).to(x.dtype)


def inv_freq(cfg: TextConfig, full: bool) -> torch.Tensor:
    """RoPE inverse frequencies (float32). "proportional" (full layers) rotates only the first
    `partial_rotary_factor * d / 2` pairs; the rest get frequency 0."""
    rope = cfg.rope_parameters["full_attention" if full else "sliding_attention"]
    d = cfg.global_head_dim if full else cfg.head_dim
    pairs = int(rope.get("partial_rotary_factor", 1.0) * d) // 2 if rope["rope_type"] == "proportional" else d // 2
    freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, 2 * pairs, 2).float() / d)
    return torch.cat([freq, torch.zeros(d // 2 - pairs)])


def cos_sin(freq: torch.Tensor, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [tokens, 1, d] at positions `pos`, in float32, then cast to the compute dtype."""
    angles = pos.float().unsqueeze(1) * freq.unsqueeze(0)
    angles = torch.cat([angles, angles], -1).unsqueeze(1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`x * cos + rotate_half(x) * sin` on [tokens, heads, d]: dim i pairs with i + d/2."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Attention of q [tokens, heads, d] over a whole cache k, v [kv_heads, slots, d], `hidden` [tokens, slots]
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
    scores = scores.unflatten(1, (group, tokens)).masked_fill_(hidden, torch.finfo(q.dtype).min)
    # Transformers' softmax(dtype=float32).to(bf16), in one kernel: a bf16 softmax computes in float32, rounds once
    probs = scores.softmax(-1)
    out = probs.reshape(kv_heads, group * tokens, -1) @ v
    return out.view(heads, tokens, d).permute(1, 0, 2).reshape(tokens, heads * d)


# --8<-- [start:full_slots]
def full_slots_for(end: int, chunk: int, ctx: int) -> int:
    """How many slots of a full cache a prompt chunk ending at position `end` (exclusive) attends over: all it can
    see lies in slots 0..end (a prompt fills a full cache from slot 0, never wrapping it), rounded up to `chunk`
    times a power of two and capped at `ctx` — few shapes to compile, and no scores for slots that are certainly
    empty. The extra slots are masked: their probabilities are exactly 0 and change nothing."""
    slots = chunk
    while slots < end:
        slots *= 2
    return min(slots, ctx)


def chunk_shapes(n: int, chunk: int, ctx: int) -> list[tuple[int, int]]:
    """(tokens, full_slots) of each forward pass that reads an n-token prompt: the shapes a compiler sees."""
    return [(min(chunk, n - start), full_slots_for(min(start + chunk, n), chunk, ctx)) for start in range(0, n, chunk)]
# --8<-- [end:full_slots]


def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def in_dtype(value: float, dtype: torch.dtype) -> float:
    """A Python constant rounded to the compute dtype first, as Transformers' `tensor(s).to(dtype)` does."""
    return torch.tensor(value, dtype=torch.float32).to(dtype).item()
# --8<-- [end:ops]


class Layer:
    """One decoder layer's weights, stored as the Rust engine stores them."""

    def __init__(self, ckpt: Checkpoint, cfg: TextConfig, i: int, dtype: torch.dtype, device):
        def linear(name):
            return ckpt.linear(f"layers.{i}.{name}", dtype, device)

        def norm(name):  # norm weights stay float32: the norm runs in float32
            return ckpt.dense(f"layers.{i}.{name}.weight", torch.float32, device)

        self.full = cfg.is_full(i)
        self.head_dim = cfg.head_dim_of(i)
        self.kv_source = cfg.kv_source(i)  # its own cache, or the one it shares (KV-shared layers)
        self.input_norm = norm("input_layernorm")
        self.q_proj, self.q_norm = linear("self_attn.q_proj"), norm("self_attn.q_norm")
        # only cache owners compute keys and values (stray k/v tensors of shared layers are ignored)
        self.kv = (linear("self_attn.k_proj"), linear("self_attn.v_proj"), norm("self_attn.k_norm")) \
            if self.kv_source == i else None
        self.o_proj = linear("self_attn.o_proj")
        self.post_attention_norm = norm("post_attention_layernorm")
        self.pre_feedforward_norm = norm("pre_feedforward_layernorm")
        self.gate_proj, self.up_proj = linear("mlp.gate_proj"), linear("mlp.up_proj")
        self.down_proj = linear("mlp.down_proj")
        self.post_feedforward_norm = norm("post_feedforward_layernorm")
        self.per_layer_input_gate = linear("per_layer_input_gate")
        self.per_layer_projection = linear("per_layer_projection")
        self.post_per_layer_input_norm = norm("post_per_layer_input_norm")
        self.layer_scalar = ckpt.dense(f"layers.{i}.layer_scalar", dtype, device)


# --8<-- [start:cache]
class Cache:
    """Keys and values of every cache-owning layer, and which position each slot holds (-1 = empty).
    Sliding layers: a ring of `2 * window` slots (a prompt chunk of `window` tokens still sees the window
    before it); full layers: `ctx` slots. Shapes never change, so every decode step is the same program."""

    def __init__(self, cfg: TextConfig, layers: list[Layer], ctx: int, dtype: torch.dtype, device, static: bool):
        ring = 2 * cfg.sliding_window
        self.kv = []
        for i, layer in enumerate(layers):
            shape = (cfg.kv_heads_of(i), ctx if layer.full else ring, layer.head_dim)
            # zeros, never NaN: masked slots are still multiplied by 0
            self.kv.append((torch.zeros(shape, dtype=dtype, device=device),
                            torch.zeros(shape, dtype=dtype, device=device)) if layer.kv_source == i else None)
        self.slot_pos = {False: torch.full((ring,), -1, device=device), True: torch.full((ctx,), -1, device=device)}
        if static:  # for torch.compile (importing dynamo takes seconds: eager runs skip it)
            # Updated in place by the compiled step: tell dynamo these tensors keep their address from call to
            # call, so the compiled program writes into them rather than treating them as new inputs each time.
            for t in [*self.slot_pos.values(), *(t for kv in self.kv if kv for t in kv)]:
                torch._dynamo.mark_static_address(t)

    def clear(self) -> None:
        """A fresh cache: every slot empty (the stale keys and values are masked)."""
        for slot_pos in self.slot_pos.values():
            slot_pos.fill_(-1)
# --8<-- [end:cache]


class Baseline:
    """Gemma 4 text model in plain PyTorch, with the Rust Engine's interface.

    model_dir: a -text checkpoint (config.json + safetensors, one file or sharded; CausalLM or multimodal layout).
    emb4_dir: None, or the -text-emb4 twin: every table it holds packed comes from it and stays packed.
    device: where to run (a torch.device or its name: "cpu", "cuda:0", "tpu:0").
    ctx: context length, the length of the full-attention caches. dtype: "bfloat16" or "float32".
    compile: run the prompt read and every decode step through `torch.compile(decode_step)` (to compile
        `decode_step` yourself, pass compile=True too: it marks the caches for dynamo).
    """

    # --8<-- [start:load]
    def __init__(self, model_dir, emb4_dir, device, ctx: int, dtype: str = "bfloat16", compile: bool = False):
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: use \"bfloat16\" or \"float32\"")
        self.cfg = cfg = TextConfig.from_file(Path(model_dir) / "config.json")
        if not 1 <= ctx <= cfg.max_position_embeddings:
            raise ValueError(f"ctx={ctx}: must be between 1 and max_position_embeddings={cfg.max_position_embeddings}")
        self.dtype, self.device, self.ctx = DTYPES[dtype], torch.device(device), ctx
        model = Checkpoint(model_dir)
        twin = Checkpoint(emb4_dir) if emb4_dir else None

        def packed_in_twin(name):
            return twin is not None and twin.has(f"{name}.weight_packed")

        self.embed_tokens = (twin if packed_in_twin("embed_tokens") else model).table("embed_tokens", self.device)
        ple = "embed_tokens_per_layer"
        self.embed_tokens_per_layer = (twin if packed_in_twin(ple) else model).table(ple, self.device)
        # The head reads every row every token: dequantized once, in the compute dtype. Untied only when a
        # checkpoint ships it; tied, it is the embedding table (no copy when the dtypes agree).
        if packed_in_twin("lm_head"):
            self.lm_head = twin.linear("lm_head", self.dtype, self.device)
        elif model.has("lm_head.weight_packed") or model.has("lm_head.weight"):
            self.lm_head = model.linear("lm_head", self.dtype, self.device)
        else:
            self.lm_head = self.embed_tokens.dequantize().to(self.dtype)
        self.per_layer_model_projection = model.linear("per_layer_model_projection", self.dtype, self.device)
        self.per_layer_projection_norm = model.dense("per_layer_projection_norm.weight", torch.float32, self.device)
        self.layers = [Layer(model, cfg, i, self.dtype, self.device) for i in range(cfg.num_hidden_layers)]
        self.norm = model.dense("norm.weight", torch.float32, self.device)
        self.inv_freq = {full: inv_freq(cfg, full).to(self.device) for full in (False, True)}
        self.embed_scale = in_dtype(cfg.hidden_size ** 0.5, self.dtype)  # sqrt(1536) = 39.19 -> 39.25 in bf16
        self.per_layer_scale = in_dtype(cfg.hidden_size_per_layer_input ** 0.5, self.dtype)
        self.cache = Cache(cfg, self.layers, ctx, self.dtype, self.device, static=compile)
        # --8<-- [end:load]
        # --8<-- [start:compile]
        # dynamic=False: one static-shape graph per input shape (a prompt chunk, a decode step), never a
        # symbolic one. fullgraph=False, so that dynamo reports breaks (see `dynamo_counts`) instead of raising.
        self.step = torch.compile(self.decode_step, dynamic=False) if compile else self.decode_step
        if compile:
            # A prompt's read compiles a graph per bucket of full_slots for whole chunks, one for the last chunk,
            # and decoding one more. Past dynamo's limit (8 graphs per function) it would quietly run eager.
            buckets = len({slots for _, slots in chunk_shapes(ctx, cfg.sliding_window, ctx)})
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * buckets + 1)
        # --8<-- [end:compile]

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads, as held (as the Rust engine counts them): every layer's
        matrices, norms and scalar, the per-layer projection, the final norm and head, one row of each table."""
        tensors = [self.per_layer_model_projection, self.per_layer_projection_norm, self.norm, self.lm_head]
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if isinstance(t, torch.Tensor)] + list(layer.kv or ())
        return (sum(t.numel() * t.element_size() for t in tensors)
                + self.embed_tokens.row_bytes() + self.embed_tokens_per_layer.row_bytes())

    def layout(self) -> tuple[int, int, int, int]:
        """(full_rings, sliding_rings, shared_layers, sliding_ring_len), as the Rust engine's layout()."""
        return self.cfg.layout()

    # --8<-- [start:forward]
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, full_slots: int) -> torch.Tensor:
        """One pass over `ids` at positions `pos` (int64 device tensors [tokens]), writing their keys and values
        into the cache; full layers attend over its first `full_slots` slots (all `ctx` for a decode step).
        Returns the final-norm hidden states [tokens, hidden]."""
        cfg, dtype, eps = self.cfg, self.dtype, self.cfg.rms_norm_eps
        tokens, n_layers, p = ids.shape[0], cfg.num_hidden_layers, cfg.hidden_size_per_layer_input

        h = self.embed_tokens.rows(ids).to(dtype) * self.embed_scale
        # Per-layer inputs: a second embedding (token identity) plus a projection of the embeddings (context)
        identity = self.embed_tokens_per_layer.rows(ids).to(dtype) * self.per_layer_scale
        context = F.linear(h, self.per_layer_model_projection) * cfg.hidden_size ** -0.5
        context = rms_norm(context.view(tokens, n_layers, p), self.per_layer_projection_norm, eps)
        per_layer_input = (context + identity.view(tokens, n_layers, p)) * 2 ** -0.5

        # Where the new tokens go in each kind of cache, and which slots each query may see
        masks, rope = {}, {}
        for full, slot_pos in self.cache.slot_pos.items():
            slots = pos % slot_pos.shape[0]
            slot_pos.index_copy_(0, slots, pos)
            query = pos.unsqueeze(1)
            if full:
                slot_pos = slot_pos[:full_slots]
            visible = (slot_pos >= 0) & (slot_pos <= query)
            if not full:  # key k is visible to query q iff q - window < k <= q
                visible = visible & (slot_pos > query - cfg.sliding_window)
            masks[full] = (slots, ~visible)
            rope[full] = cos_sin(self.inv_freq[full], pos, dtype)

        for i, layer in enumerate(self.layers):
            (slots, masked), (cos, sin), d = masks[layer.full], rope[layer.full], layer.head_dim
            # Attention: q/k/v projections, q and k RMS-normed (v without a weight), RoPE after the norms
            x = rms_norm(h, layer.input_norm, eps)
            q = rotate(rms_norm(F.linear(x, layer.q_proj).view(tokens, -1, d), layer.q_norm, eps), cos, sin)
            if layer.kv is not None:
                k_proj, v_proj, k_norm = layer.kv
                k = rotate(rms_norm(F.linear(x, k_proj).view(tokens, -1, d), k_norm, eps), cos, sin)
                v = rms_norm(F.linear(x, v_proj).view(tokens, -1, d), None, eps)
                k_cache, v_cache = self.cache.kv[i]
                k_cache.index_copy_(1, slots, k.transpose(0, 1))
                v_cache.index_copy_(1, slots, v.transpose(0, 1))
            # KV-shared layers read the cache their source layer (earlier in this pass) just wrote
            k_cache, v_cache = self.cache.kv[layer.kv_source]
            if layer.full:
                k_cache, v_cache = k_cache[:, :full_slots], v_cache[:, :full_slots]
            attn = F.linear(attend(q, k_cache, v_cache, masked), layer.o_proj)
            h = h + rms_norm(attn, layer.post_attention_norm, eps)
            # Feed-forward: down(gelu_tanh(gate(x)) * up(x)); double-wide on KV-shared layers
            x = rms_norm(h, layer.pre_feedforward_norm, eps)
            ff = F.linear(gelu(F.linear(x, layer.gate_proj)) * F.linear(x, layer.up_proj), layer.down_proj)
            h = h + rms_norm(ff, layer.post_feedforward_norm, eps)
            # Per-layer input: gate the residual stream, mix in this layer's slice, project back
            gated = gelu(F.linear(h, layer.per_layer_input_gate)) * per_layer_input[:, i]
            h = h + rms_norm(F.linear(gated, layer.per_layer_projection), layer.post_per_layer_input_norm, eps)
            h = h * layer.layer_scalar  # scales the whole residual stream
        return rms_norm(h, self.norm, eps)
    # --8<-- [end:forward]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [tokens, vocab]: the output head, then `tanh(x / cap) * cap` when the config sets a cap."""
        logits = F.linear(h, self.lm_head)
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    # --8<-- [start:decode_step]
    def decode_step(self, ids: torch.Tensor, pos: torch.Tensor, full_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Read `ids` at `pos` into the cache and pick the next token on the device: returns it ([1], int64) and
        its position. Tokens and positions stay device tensors and a decode step's `full_slots` is always `ctx` —
        no Python number changes from step to step, so a compiled step is one program, whatever the position.
        (A prompt chunk's `full_slots` is a bucket size: one program per bucket.)"""
        h = self.forward(ids, pos, full_slots)
        token = self.head(h[-1:]).argmax(-1)
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

    def check_ids(self, ids: list[int]) -> None:
        """Prompt ids must be in both embedding tables' vocabulary and fit the context (as the engine checks)."""
        if not ids:
            raise ValueError("ids: the prompt is empty; it needs at least one token (e.g. <bos> = 2)")
        if len(ids) > self.ctx:
            raise ValueError(f"ids: {len(ids)} tokens do not fit ctx={self.ctx}")
        vocab = min(self.cfg.vocab_size, self.cfg.vocab_size_per_layer_input)
        bad = next(((i, t) for i, t in enumerate(ids) if not 0 <= t < vocab), None)
        if bad:
            raise ValueError(f"ids[{bad[0]}] = {bad[1]} is outside the vocabulary [0, {vocab})")

    # --8<-- [start:generate]
    def generate(self, ids: list[int], max_new: int, read_every: int = 1) -> tuple[list[int], float, float]:
        """Exactly `max_new` greedy tokens after `ids`, and the seconds for the prompt read (which yields the
        first token) and for the other max_new - 1 steps. Tokens reach the host every `read_every` steps."""
        self.check_ids(ids)
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
        pending = []
        for step in range(1, max_new):
            token, pos = self.step(token, pos, self.ctx)
            pending.append(token)
            if len(pending) == read_every or step == max_new - 1:
                tokens += torch.cat(pending).tolist()
                pending = []
        return tokens, read_s, time.perf_counter() - start
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
            h = self.forward(chunk, chunk_pos, slots)
            start = n * self.cfg.sliding_window
            for p in positions:
                if start <= p < start + len(chunk):
                    rows[p] = self.head(h[p - start:p - start + 1]).float()
        if not positions:
            return torch.empty(0, self.cfg.vocab_size, device=self.device)
        return torch.cat([rows[p] for p in positions])


# --8<-- [start:dynamo_counts]
def dynamo_counts() -> tuple[int, int]:
    """(graphs, graph breaks) dynamo has produced in this process so far: each graph is a program the backend
    compiles; each break splits a function into two graphs with Python running between them."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))
# --8<-- [end:dynamo_counts]
