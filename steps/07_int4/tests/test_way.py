"""Step 05's runner takes step 07's engine as the optional way "rust-int4-aten" (when step 05 is installed too)."""
import pytest
import torch
from torchtpu_rs import checkpoints

ways = pytest.importorskip("torchtpu_ways.ways", reason="step 05 (torchtpu_ways) is not installed beside step 07")


def test_the_rust_int4_aten_way_runs_and_says_where_it_cannot():
    if "rust-int4-aten" not in getattr(ways, "OPTIONAL", []):
        pytest.skip("this torchtpu_ways has no rust-int4-aten way")
    tiny = checkpoints.tiny("causal")
    row = ways.run_way("rust-int4-aten", tiny / "text", tiny / "emb4", "cpu", "bfloat16", 2048, [2, 40, 41, 42], 8)
    assert row["available"] and len(row["tokens"]) == 8 and row["bytes_per_token"] > 0
    eager = ways.run_way("rust-eager", tiny / "text", tiny / "emb4", "cpu", "bfloat16", 2048, [2, 40, 41, 42], 8)
    assert row["bytes_per_token"] < 0.35 * eager["bytes_per_token"]
    meta = ways.run_way("rust-int4-aten", tiny / "text", None, "meta", "bfloat16", 2048, [2, 40, 41, 42], 8)
    assert not meta["available"] and "aten::_weight_int4pack_mm_for_cpu does not run" in meta["why"]
    assert torch.backends.cpu.get_cpu_capability()  # the table names it beside the figures
