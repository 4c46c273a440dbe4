"""The compile harness around the baseline: the shapes a compiler sees, dynamo's recompile limit, and what dynamo
counted. Dynamo is imported only inside these functions: importing it takes seconds, and eager runs skip it."""
from .baseline import full_slots_for


# --8<-- [start:chunk_shapes]
def chunk_shapes(n: int, chunk: int, ctx: int) -> list[tuple[int, int]]:
    """(tokens, full_slots) of each forward pass that reads an n-token prompt: the shapes a compiler sees."""
    return [(min(chunk, n - start), full_slots_for(min(start + chunk, n), chunk, ctx)) for start in range(0, n, chunk)]
# --8<-- [end:chunk_shapes]


# --8<-- [start:recompile_limit]
def allow_recompiles(ctx: int, chunk: int) -> None:
    """Raise dynamo's recompile limit (a global) so that one compiled step covers any prompt that fits `ctx`: a
    prompt's read compiles a graph for each bucket of full_slots its whole chunks fall in and one for its last
    chunk, and decoding one more; the limit allows two per bucket, plus one. Past the limit (8 graphs per function
    by default) dynamo would quietly run the step eager."""
    import torch._dynamo

    buckets = len({slots for _, slots in chunk_shapes(ctx, chunk, ctx)})
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * buckets + 1)
# --8<-- [end:recompile_limit]


# --8<-- [start:dynamo_counts]
def dynamo_counts() -> tuple[int, int]:
    """(graphs, graph breaks) dynamo has produced in this process so far: each graph is a program the backend
    compiles; each break splits a function into two graphs with Python running between them."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))
# --8<-- [end:dynamo_counts]
