"""The decode step compiles as one graph (fullgraph=True raises on any break) for each prompt chunk shape and for
a decode step, and computes what the eager step computes."""
import torch
from torch._dynamo.utils import counters

from torchtpu_ways import prompt
from torchtpu_ways.baseline import Baseline
from torchtpu_ways.compiling import chunk_shapes, dynamo_counts


def test_the_decode_step_compiles_as_one_graph_per_shape(tiny, ctx, short_prompt):
    # the checkpoint, dtype, ctx and prompt of test_run's python-compile way: inductor's cache then has its graphs
    ids = prompt.encode(tiny / "text", short_prompt)
    eager = Baseline(tiny / "text", tiny / "emb4", "cpu", ctx, "float32").generate(ids, 8)[0]
    model = Baseline(tiny / "text", tiny / "emb4", "cpu", ctx, "float32", compile=True)
    # --8<-- [start:fullgraph]
    model.step = torch.compile(model.decode_step, fullgraph=True, dynamic=False)
    # --8<-- [end:fullgraph]
    counters.clear()
    tokens = model.generate(ids, 8)[0]
    graphs = len(set(chunk_shapes(len(ids), model.cfg.sliding_window, ctx))) + 1  # each chunk shape, the decode step
    assert dynamo_counts() == (graphs, 0)
    assert tokens == eager
    assert model.generate(ids, 8)[0] == tokens and dynamo_counts() == (graphs, 0)  # no recompiling
