"""The decode step compiles as one graph (fullgraph=True raises on any break) for each prompt chunk shape and for
each decode shape — one with decode_slots="all", one per bucket crossed with "bucket" — and computes what the eager
step computes."""
import pytest
import torch
from torch._dynamo.utils import counters
from torchtpu_ways import prompt
from torchtpu_ways.baseline import Baseline
from torchtpu_ways.compiling import chunk_shapes, decode_shapes, dynamo_counts


@pytest.mark.parametrize("decode_slots, max_new", [("all", 8), ("bucket", 12)])
def test_the_decode_step_compiles_as_one_graph_per_shape(tiny, ctx, short_prompt, decode_slots, max_new):
    # the checkpoint, dtype, ctx and prompt of test_run's python-compile way: inductor's cache then has its graphs
    ids = prompt.encode(tiny / "text", short_prompt)
    eager = Baseline(tiny / "text", tiny / "emb4", "cpu", ctx, "float32").generate(ids, max_new)[0]
    model = Baseline(tiny / "text", tiny / "emb4", "cpu", ctx, "float32", compile=True, decode_slots=decode_slots)
    # --8<-- [start:fullgraph]
    model.step = torch.compile(model.decode_step, fullgraph=True, dynamic=False)
    # --8<-- [end:fullgraph]
    torch._dynamo.reset()  # a graph compiled earlier in this process for another Baseline would be reused
    counters.clear()
    tokens = model.generate(ids, max_new)[0]
    window = model.cfg.sliding_window
    decodes = decode_shapes(len(ids), max_new, window, ctx, decode_slots)
    assert len(decodes) == (1 if decode_slots == "all" else 2), decodes  # "bucket": 12 tokens cross one boundary
    graphs = len(set(chunk_shapes(len(ids), window, ctx))) + len(decodes)  # each chunk shape, each decode shape
    assert dynamo_counts() == (graphs, 0)
    assert tokens == eager
    assert model.generate(ids, max_new)[0] == tokens and dynamo_counts() == (graphs, 0)  # no recompiling


def test_programs_at_e2b_shapes():
    """What the step-05 page says: at E2B (512-token chunks, ctx 33,024) a decode over "all" is one program at
    every position, over "bucket" at most eight (512, 1,024, …, 32,768 and 33,024 slots)."""
    ctx, chunk = 33024, 512
    assert decode_shapes(19, ctx - 19, chunk, ctx, "all") == {ctx}
    assert decode_shapes(19, ctx - 19, chunk, ctx, "bucket") == {512 * 2**k for k in range(7)} | {ctx}
    assert len(decode_shapes(19, 64, chunk, ctx, "bucket")) == 1
