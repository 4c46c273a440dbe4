"""`make bench`'s arithmetic for step 05: the keys and values a decode step reads, the memory line, the targets.
(The benchmark itself runs at E2B size only: `make bench`.)"""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from torchtpu_ways import bandwidth
from torchtpu_ways.checkpoint import TextConfig

BENCH = Path(__file__).resolve().parents[1] / "bench.py"
spec = importlib.util.spec_from_file_location("bench", BENCH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def row():
    return {"way": "rust-int4", "torch": "2.13.0"}


def test_decode_reads_every_layer_s_keys_and_values_over_the_slots_it_attends(tiny):
    cfg = TextConfig.from_file(tiny / "text" / "config.json")
    ring, ctx = 2 * cfg.sliding_window, 2048
    # all: every step reads the whole of each cache it attends over, KV-shared layers included
    whole = sum(2 * cfg.kv_heads_of(i) * (ctx if cfg.is_full(i) else ring) * cfg.head_dim_of(i) * 2
                for i in range(cfg.num_hidden_layers))
    assert bandwidth.kv_bytes_per_token(cfg, ctx, 19, 4, "all", "bfloat16") == whole
    # bucket: a short prompt's steps see one chunk of each full cache
    first = sum(2 * cfg.kv_heads_of(i) * (cfg.sliding_window if cfg.is_full(i) else ring) * cfg.head_dim_of(i) * 2
                for i in range(cfg.num_hidden_layers))
    assert bandwidth.kv_bytes_per_token(cfg, ctx, 3, 4, "bucket", "bfloat16") == first
    assert bandwidth.kv_bytes_per_token(cfg, ctx, 3, 4, "bucket", "float32") == 2 * first
    # step 08's rings attend over the full cache's bucket until they wrap: one chunk too, at this depth
    chunk = sum(2 * cfg.kv_heads_of(i) * cfg.sliding_window * cfg.head_dim_of(i) * 2
                for i in range(cfg.num_hidden_layers))
    assert bandwidth.kv_bytes_per_token(cfg, ctx, 3, 4, "bucket", "bfloat16", "bucket") == chunk
    assert bandwidth.kv_bytes_per_token(cfg, ctx, 19, 4, "all", "bfloat16", "bucket") == whole
    # step 08's own attention call reads only the slots each step's query sees: 20..23 of them after 19 tokens
    # (at most the window's on a sliding layer), whatever its shapes
    seen = sum(2 * cfg.kv_heads_of(i) * min(pos + 1, ctx if cfg.is_full(i) else cfg.sliding_window)
               * cfg.head_dim_of(i) * 2 for pos in range(19, 23) for i in range(cfg.num_hidden_layers)) / 4
    for decode_slots in ("all", "bucket"):
        assert bandwidth.kv_bytes_per_token(cfg, ctx, 19, 4, decode_slots, "bfloat16", "bucket", "seen") == seen


def test_the_memory_line_names_each_part_and_the_runtime():
    line = bench.memory_line({**row(), "peak_gb": 3.0, "memory": {"linears": 1.2e9, "kv caches": 0.3e9}})
    assert line == "Rust int4, torch 2.13 holds (GB): linears 1.20, kv caches 0.30; the rest of its 3.00 GB peak " \
                   "(1.50) is the runtime"
    # llama.cpp maps its file: a peak below the file is no negative runtime
    mapped = {"way": "llamacpp-bf16", "peak_gb": 5.28, "memory": {"weights as stored": 9.26e9}, "mapped": True}
    assert "maps its 9.26 GB file" in bench.memory_line(mapped) and "-" not in bench.memory_line(mapped)


def test_int4_targets_appear_only_when_its_way_ran():
    eager = {"streamed_tok_s": 2.0, "peak_gb": 7.0, "bandwidth_fraction": 0.4, "available": True}
    int4 = {"streamed_tok_s": 6.0, "peak_gb": 3.0, "bandwidth_fraction": 0.5, "available": True}
    assert not any("int4" in name for name, *_ in bench.targets({"rust-eager": eager}, {}))
    checks = {name: value for name, value, *_ in bench.targets({"rust-eager": eager, "rust-int4": int4},
                                                               {"rust-eager": eager, "rust-int4": int4})}
    assert checks["Rust int4 decode / Rust eager decode"] == 3.0 and checks["  the same at the short context"] == 3.0
    assert checks["Rust int4 peak memory, GB"] == 3.0


def test_the_read_fraction_sets_each_turn_against_its_own_limit():
    # a turn on slow memory is set against that turn's limit: the median of the turns' fractions (2.0), not the
    # median rate against the median limit (1.0)
    assert bench.read_fraction([10.0, 20.0, 40.0], [40.0, 10.0, 20.0], 1e9) == 2.0
    assert bench.read_fraction([12.5], [25.0], 2e9) == 1.0
    with pytest.raises(ValueError):  # a turn without its limit
        bench.read_fraction([10.0, 20.0], [40.0], 1e9)


@pytest.fixture
def small_bench(tiny, monkeypatch):
    """bench.main on the tiny checkpoint, its machine-wide measurements made small or stubbed (the E2B ones take
    minutes): `run(*flags)` runs it with those flags."""
    matvec = bench.matvec_gb_s
    monkeypatch.setattr(bench.checkpoints, "e2b", lambda: tiny)
    monkeypatch.setattr(bench, "matvec_gb_s", lambda streamed_gb=0.0: matvec(
        n=128, k=64, tries=1, calls=2, streamed_gb=streamed_gb / 1e4))  # a few 16 KB copies, streamed
    monkeypatch.setattr(bench, "memory_bandwidth_gb_s", lambda: 10.0)
    monkeypatch.setattr(bench, "read_bandwidth_gb_s", lambda tries=5: (11.0, "float32 sum"))
    monkeypatch.setattr(bench, "onednn_against_aten_ms", lambda: {"prompt chunk": {"oneDNN": 1.0, "ATen": 2.0}})
    monkeypatch.setattr(bench, "matvec_bits_apart", lambda: 0)

    def run(*flags):
        monkeypatch.setattr(sys, "argv", ["bench.py", *flags])
        bench.main()
    return run


def test_the_record_holds_the_measured_mat_vec_rates_and_the_chart_lies_beside_it(small_bench, tmp_path):
    """Only rust-fused, n/a off a TPU (no process starts): the record's mat-vec figures are the rates measured (once
    they were a table of the kernels' names), and the chart is the record's name with .png, whatever dots its
    folder's name has."""
    out = tmp_path / "runs.v1" / "record"
    out.parent.mkdir()
    small_bench("--ways", "rust-fused", "--max-new", "4", "--repeat", "2", "--json", str(out))
    record = json.loads(out.read_text())
    for rates in (record["matvec_gb_s"], record["matvec_streamed_gb_s"]):
        assert {"bf16 oneDNN", "bf16 ATen", "int4 ATen"} <= set(rates)
        assert all(isinstance(rate, float) and rate > 0 for rate in rates.values()), rates
    assert (record["read_gb_s"], record["read_kernel"]) == (11.0, "float32 sum")
    assert record["turn_read_gb_s"] == [11.0, 11.0]  # the read limit again before each turn
    assert (out.parent / "record.png").stat().st_size > 0


@pytest.mark.parametrize("flags, error", [
    (["--ways", "rust-eager,rust-int5"], "--ways: unknown rust-int5"),
    (["--repeat", "0"], "--repeat 0: at least 1"),
    (["--max-new", "1"], "--max-new 1: at least 2"),
    (["--short-ctx", "-1"], "--short-ctx -1"),
    (["--json", "/no/such/folder/record.json"], "argument --json: /no/such/folder/record.json: the folder"),
    (["--chart", "/no/such/folder/chart.png"], "argument --chart: /no/such/folder/chart.png: the folder"),
])
def test_bad_flags_are_refused_before_the_checkpoint_is_made(monkeypatch, capsys, flags, error):
    def made():
        raise AssertionError("the checkpoint was asked for")
    monkeypatch.setattr(bench.checkpoints, "e2b", made)
    monkeypatch.setattr(sys, "argv", ["bench.py", *flags])
    with pytest.raises(SystemExit) as stop:
        bench.main()
    assert stop.value.code == 2 and error in capsys.readouterr().err
