"""What a decode step reads: with how fast this machine reads (torchtpu_rs.bandwidth), the bandwidth limit both
benchmarks (step 05's and step 06's) measure every way's decode against.

    gb_s = torchtpu_rs.bandwidth.memory_bandwidth_gb_s()   # a 2 GiB copy, best of 5
    kv = kv_bytes_per_token(cfg, ctx, prompt_len, steps, decode_slots, kv_dtype, sliding_slots, kv_read)
    fraction = tok_s * (row["bytes_per_token"] + kv) / (gb_s * 1e9)
"""
from .checkpoint import TextConfig
from .slots import decode_slots_for


# --8<-- [start:kv_read]
def kv_bytes_per_token(cfg: TextConfig, ctx: int, prompt_len: int, steps: int, decode_slots: str,
                       kv_dtype: str, sliding_slots: str = "ring", kv_read: str = "slots") -> float:
    """The cached keys and values one of `steps` decode steps after a prompt of `prompt_len` tokens reads, on
    average: every layer (a KV-shared one reads its source's cache) attends over the full cache's slots its
    `decode_slots` rule gives at that position, or over its sliding ring — the whole ring (`sliding_slots="ring"`:
    steps 03 and 05), or as many of its slots as the full cache's rule gives ("bucket": step 08, which covers all a
    ring holds until it wraps) — in the dtype the caches hold (`kv_dtype`). `kv_read="seen"`: only the slots the
    query sees, the positions up to its own (the last `sliding_window` of them on a sliding layer) — what step 08's
    own attention call reads of those slots (its `decode_attention="own"`); "slots": all of them, as ATen's ops read
    them."""
    size = 4 if kv_dtype == "float32" else 2
    positions = range(prompt_len, prompt_len + steps)
    ring = 2 * cfg.sliding_window
    total = 0
    for pos in positions:
        if kv_read == "seen":
            full, sliding = min(pos + 1, ctx), min(pos + 1, cfg.sliding_window)
        else:
            full = decode_slots_for(pos, cfg.sliding_window, ctx, decode_slots)
            sliding = min(full, ring) if sliding_slots == "bucket" else ring
        total += sum(2 * cfg.kv_heads_of(i) * (full if cfg.is_full(i) else sliding)
                     * cfg.head_dim_of(i) * size for i in range(cfg.num_hidden_layers))
    return total / max(len(positions), 1)
# --8<-- [end:kv_read]
