"""The full caches' slot rules: how many slots a prompt chunk or a decode step attends over, and so the shapes a
read has. They belong to the cache, not to one way: the baseline attends by them, the compile harness counts the
graphs they make, the bench counts the bytes they read. No torch here.
"""


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
# --8<-- [end:full_slots]


# --8<-- [start:decode_slots]
DECODE_SLOTS = ("bucket", "all")


def decode_slots_for(pos: int, chunk: int, ctx: int, decode_slots: str) -> int:
    """How many slots of a full cache a decode step at position `pos` attends over: a full cache holds position p in
    slot p and decoding never passes ctx, so the step sees slots 0..pos — rounded up as a prompt chunk's ("bucket"),
    or all ctx ("all"). Both give the same bits: the extra slots are masked."""
    return full_slots_for(pos + 1, chunk, ctx) if decode_slots == "bucket" else ctx
# --8<-- [end:decode_slots]
