"""`make bench`'s arithmetic — the weights a token multiplies by, the FLOPs of a read, the targets — and the whole
benchmark run on the tiny checkpoint (at E2B size its longest prompt alone takes about ten minutes per way)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from torchtpu_rs import checkpoints

BENCH = Path(__file__).resolve().parents[1] / "bench.py"
spec = importlib.util.spec_from_file_location("bench", BENCH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.fixture(scope="module")
def tiny_text():
    folder = checkpoints.tiny() / "text"
    return folder, json.loads((folder / "config.json").read_text())


def test_linear_weights_match_the_config(tiny_text):
    """Counted from the checkpoint's tensors, checked against the architecture written out from the config."""
    folder, c = tiny_text
    layers, shared, hidden, ple = (c["num_hidden_layers"], c["num_kv_shared_layers"], c["hidden_size"],
                                   c["hidden_size_per_layer_input"])
    expected = hidden * layers * ple  # the per-layer-input projection
    for i, kind in enumerate(c["layer_types"]):
        dim = c["global_head_dim"] if kind == "full_attention" else c["head_dim"]
        expected += 2 * c["num_attention_heads"] * dim * hidden  # q and o
        if i < layers - shared:  # layers that own their keys and values
            expected += 2 * c["num_key_value_heads"] * dim * hidden
        wide = 2 if c["use_double_wide_mlp"] and i >= layers - shared else 1
        expected += 3 * hidden * wide * c["intermediate_size"] + 2 * hidden * ple
    assert bench.linear_weights(folder) == expected


def test_read_flops(tiny_text):
    _, c = tiny_text
    heads, window, ctx, n_full = c["num_attention_heads"], c["sliding_window"], 2048, c["layer_types"].count(
        "full_attention")
    per_key = {"full": 4 * heads * c["global_head_dim"], "sliding": 4 * heads * c["head_dim"]}
    n_sliding = len(c["layer_types"]) - n_full
    head = 2 * c["vocab_size"] * c["hidden_size"]
    model, done = bench.read_gflop_per_token(c, 1000, 1, ctx)  # one token sees one key everywhere
    assert model * 1e9 == pytest.approx(2 * 1000 + n_full * per_key["full"] + n_sliding * per_key["sliding"] + head)
    n = 4 * window  # past the window: a sliding layer sees at most `window` keys, a full one every earlier token
    model, done = bench.read_gflop_per_token(c, 0, n, ctx)
    sliding_keys = window * (window + 1) // 2 + (n - window) * window
    assert model * 1e9 * n == pytest.approx(n_full * per_key["full"] * n * (n + 1) // 2
                                            + n_sliding * per_key["sliding"] * sliding_keys + head)
    full_slots_scored = window * (1 + 2 + 4 + 4) * window  # chunks ending at w, 2w, 3w, 4w: buckets w, 2w, 4w, 4w
    assert done * 1e9 * n == pytest.approx(n_full * per_key["full"] * full_slots_scored
                                           + n * n_sliding * per_key["sliding"] * 2 * window + head)


def row(way, length, read, decode, decode_fraction=0.4):
    return {"way": way, "length": length, "available": True, "prompt_tokens": length, "read_tok_s": read,
            "decode_tok_s": decode, "decode_fraction": decode_fraction}


def test_targets_are_met_or_missed():
    rows = [row("rust-eager", 60, 10, 2.0, 0.6), row("python-compile", 60, 10, 2.0),
            row("rust-eager", 4000, 8, 1.5, 0.3), row("python-compile", 4000, 10, 2.0)]
    checks = {name: value >= bound for name, value, _, bound in bench.targets(rows, [60, 4000])}
    assert checks == {"Rust eager read / Python compile read, 60-token prompt": True,
                      "Rust eager read / Python compile read, 4000-token prompt": False,
                      "Rust eager decode, longest prompt / shortest": False,
                      "Python compile decode, longest prompt / shortest": True,
                      "Rust eager decode / bandwidth limit, 60-token prompt": True,
                      "Rust eager decode / bandwidth limit, 4000-token prompt": False}


def test_targets_judge_only_the_ways_asked_for():
    rows = [row("rust-eager", 60, 10, 2.0), row("rust-int4", 60, 5, 6.0),
            row("rust-eager", 4000, 8, 1.9), row("rust-int4", 4000, 4, 3.0)]
    checks = {name: round(value, 2) for name, value, *_ in bench.targets(rows, [60, 4000])}
    assert checks == {"Rust eager decode, longest prompt / shortest": 0.95,
                      "Rust int4 decode, longest prompt / shortest": 0.5,
                      "Rust eager decode / bandwidth limit, 60-token prompt": 0.4,
                      "Rust eager decode / bandwidth limit, 4000-token prompt": 0.4}
    gone = [dict(r, available=False) if r["way"] == "rust-int4" else r for r in rows]  # asked, could not run
    assert dict((name, value) for name, value, *_ in bench.targets(gone, [60, 4000])) == {
        "Rust eager decode, longest prompt / shortest": pytest.approx(0.95),
        "Rust int4 decode, longest prompt / shortest": None,
        "Rust eager decode / bandwidth limit, 60-token prompt": 0.4,
        "Rust eager decode / bandwidth limit, 4000-token prompt": 0.4}


def test_one_length_has_no_longest_against_shortest():
    # a run at one length (make bench-peer's 32k line) compared it with itself: 1.00, "met"
    rows = [row("rust-int4", 32000, 90, 4.8, 0.3)]
    assert [name for name, *_ in bench.targets(rows, [32000])] == []


def test_the_benchmark_runs_on_the_tiny_checkpoint(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--size", "tiny", "--lengths", "40,100", "--repeats", "2,1",
                           "--max-new", "4", "--ways", "rust-fused,rust-eager,python-eager", "--json", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "targets (ratios from this run):" in proc.stdout
    r = json.loads(out.read_text())
    assert r["matmul_flop_s"] > 0 and r["linear_weights"] > 0 and r["lengths"] == [40, 100]
    assert r["bandwidth_gb_s"] > 0 and r["read_gb_s"] > 0 and r["read_kernel"]
    ran = [x for x in r["rows"] if x["available"]]
    assert len(ran) == 4 and all(0 < x["read_fraction"] and x["gflop_per_token"] > 0 for x in ran)
    # a decode step reads at least the weights it holds, and more after the longer prompt (more slots attended)
    assert all(x["decode_bytes_per_token"] > x["bytes_per_token"] and x["decode_fraction"] > 0 for x in ran)
    # the same bytes against the read limit: a copy also writes, so the two fractions differ by the two rates' ratio
    ratio = r["bandwidth_gb_s"] / r["read_gb_s"]
    assert all(abs(x["decode_read_fraction"] - x["decode_fraction"] * ratio) < 1e-9 for x in ran)
    eager = {x["length"]: x["decode_bytes_per_token"] for x in ran if x["way"] == "rust-eager"}
    assert eager[100] > eager[40]
    assert [len(x["read_tok_s_runs"]) for x in ran] == [2, 2, 1, 1] and r["repeats"] == [2, 1]
    assert {t["target"] for t in r["targets"]} >= {"Rust eager decode, longest prompt / shortest"}
    assert (tmp_path / "bench.png").stat().st_size > 10_000


def test_a_way_s_runs_become_one_row_of_medians():
    runs = [dict(row("rust-eager", 40, read, decode), read_s=40 / read, answer=str(read))
            for read, decode in ((10.0, 2.0), (30.0, 2.2), (20.0, 1.0))]
    median = bench.median_of(runs)
    assert (median["read_tok_s"], median["decode_tok_s"], median["read_s"]) == (20.0, 2.0, 2.0)
    assert median["runs"] == 3 and median["read_tok_s_runs"] == [10.0, 30.0, 20.0] and median["answer"] == "10.0"


@pytest.mark.parametrize("flags, error", [
    (["--lengths", "40,-1"], "argument --lengths: '-1': not a whole number of at least 1"),
    (["--repeats", "2,1"], "--repeats 2,1: one count, or one per length (3)"),
    (["--lengths", "40", "--repeats", "2,1"], "--repeats 2,1: one count, or one per length (1)"),
    (["--ways", "rust-eager,rust-int5"], "--ways: unknown rust-int5"),
    (["--max-new", "1"], "--max-new 1: at least 2"),
    (["--chart", "/no/such/folder/bench.png"], "argument --chart: /no/such/folder/bench.png: the folder"),
])
def test_bad_flags_are_refused_before_the_checkpoint_is_made(monkeypatch, capsys, flags, error):
    monkeypatch.setattr(bench.checkpoints, "cached", lambda size: pytest.fail("the checkpoint was asked for"))
    monkeypatch.setattr(sys, "argv", ["bench.py", *flags])
    with pytest.raises(SystemExit) as stop:
        bench.main()
    assert stop.value.code == 2 and error in capsys.readouterr().err


def test_the_chart_is_named_after_the_record_whatever_dots_its_folder_has(monkeypatch, tmp_path):
    """The tiny benchmark's run is the test above; here only where main() puts the chart by default."""
    charts = []
    monkeypatch.setattr(bench, "chart", lambda rows, path: charts.append(path))
    monkeypatch.setattr(bench, "memory_bandwidth_gb_s", lambda: 10.0)  # a 2 GiB copy, 5 times: not needed here
    monkeypatch.setattr(bench, "read_bandwidth_gb_s", lambda: (11.0, "float32 sum"))
    monkeypatch.setattr(bench, "measure", lambda way, *a, **k: {"way": way, "label": way, "available": False,
                                                                "why": "stubbed", "prompt_tokens": 40})
    out = tmp_path / "runs.v1" / "record"
    out.parent.mkdir()
    monkeypatch.setattr(sys, "argv", ["bench.py", "--size", "tiny", "--lengths", "40", "--repeats", "1",
                                      "--ways", "rust-eager", "--json", str(out)])
    bench.main()
    assert charts == [str(out.parent / "record.png")]
