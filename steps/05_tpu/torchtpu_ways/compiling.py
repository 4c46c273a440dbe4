"""The compile harness around the baseline: the shapes a compiler sees, dynamo's recompile limit, and what dynamo
counted. Dynamo is imported only inside these functions: importing it takes seconds, and eager runs skip it.
The slot rules come from `slots` (the cache's), not from the baseline: the baseline imports this module, never
the other way round."""
from .slots import decode_slots_for, full_slots_for


# --8<-- [start:chunk_shapes]
def chunk_shapes(n: int, chunk: int, ctx: int) -> list[tuple[int, int]]:
    """(tokens, full_slots) of each forward pass that reads an n-token prompt: the shapes a compiler sees."""
    return [(min(chunk, n - start), full_slots_for(min(start + chunk, n), chunk, ctx)) for start in range(0, n, chunk)]
# --8<-- [end:chunk_shapes]


# --8<-- [start:decode_shapes]
def decode_shapes(n: int, max_new: int, chunk: int, ctx: int, decode_slots: str) -> set[int]:
    """The full_slots of the decode steps after an n-token prompt (max_new tokens, the first from the read): one
    compiled program each. "all": {ctx}; "bucket": each bucket the positions n .. n + max_new - 2 fall in."""
    return {decode_slots_for(p, chunk, ctx, decode_slots) for p in range(n, n + max_new - 1)}
# --8<-- [end:decode_shapes]


# --8<-- [start:recompile_limit]
def allow_recompiles(ctx: int, chunk: int, decode_slots: str = "all") -> None:
    """Raise dynamo's recompile limit (a global) so that one compiled step covers any prompt that fits `ctx`: a
    prompt's read compiles a graph for each bucket of full_slots its whole chunks fall in and one for its last
    chunk, and decoding one more with decode_slots="all", one per bucket with "bucket"; the limit allows two per
    bucket plus one, or three per bucket. Past the limit (8 graphs per function by default) dynamo would quietly
    run the step eager."""
    import torch._dynamo

    buckets = len({slots for _, slots in chunk_shapes(ctx, chunk, ctx)})
    graphs = 2 * buckets + (1 if decode_slots == "all" else buckets)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, graphs)
# --8<-- [end:recompile_limit]


# --8<-- [start:dynamo_counts]
def dynamo_counts() -> tuple[int, int]:
    """(graphs, graph breaks) dynamo has produced in this process so far: each graph is a program the backend
    compiles; each break splits a function into two graphs with Python running between them."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))
# --8<-- [end:dynamo_counts]
