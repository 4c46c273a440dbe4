"""Step 05's llama.cpp ways: never faked (a missing peer or a crash is a row that says why), named by build and
setting, compared with the fastest that ran — and, where `make peer` has built them, run like the other ways."""
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
from torchtpu_parity import peer
from torchtpu_rs import checkpoints
from torchtpu_ways import prompt
from torchtpu_ways.peer_run import crash_why
from torchtpu_ways.report import judge
from torchtpu_ways.ways import FIGURES, PEER, label, run_way

BENCH = Path(__file__).resolve().parents[1] / "bench.py"
spec = importlib.util.spec_from_file_location("bench", BENCH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_without_the_peer_its_ways_are_unavailable_and_say_why(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_CACHE", str(tmp_path))  # no builds there
    row = run_way("llamacpp-q4_0", tiny / "text", None, "cpu", "bfloat16", 2048, [2, 17, 250], 4)
    assert row["available"] is False and "make peer" in row["why"]
    assert all(row[key] is None for key in FIGURES)
    assert label(row) == "llama.cpp Q4_0 (native build, repacked)"


def test_llama_cpp_ways_are_listed_and_an_unknown_one_is_refused(tiny):
    assert {"llamacpp-q4_0", "llamacpp-q8_0-norepack", "llamacpp-avx2-q4_0", "llamacpp-bf16"} <= set(PEER)
    with pytest.raises(ValueError, match="llamacpp\\[-avx512\\|-avx2\\]"):
        run_way("llamacpp-q2_k", tiny / "text", None, "cpu", "bfloat16", 2048, [2, 17], 4)


def test_a_crash_is_named_with_its_signal_and_where_the_weights_were():
    stderr = ("load_tensors:          AMX model buffer size =     1.15 MiB\n"
              "load_tensors:   CPU_Mapped model buffer size =     1.41 MiB\nsched_reserve: reserve took 3 ms\n")
    why = crash_why(subprocess.CompletedProcess([], -11, "", stderr))
    assert why == (f"llama.cpp {peer.VERSION} crashed: SIGSEGV (signal 11), weights in AMX, CPU_Mapped buffers; "
                   "its last output: sched_reserve: reserve took 3 ms")
    assert "failed (exit code 1)" in crash_why(subprocess.CompletedProcess([], 1, "", ""))


def test_ratios_to_llama_cpp_take_its_fastest_row_of_each_format_and_have_no_target():
    def row(way, tok_s):
        return {"way": way, "torch": None if way.startswith("llamacpp") else "2.13.0", "streamed_tok_s": tok_s}

    rows = {r["way"]: r for r in (row("rust-int4", 12.0), row("rust-eager", 4.0), row("llamacpp-q4_0-norepack", 6.0),
                                  row("llamacpp-avx2-q4_0", 8.0), row("llamacpp-q8_0-norepack", 5.0))}
    ratios = bench.peer_ratios(rows)
    assert [(name, value) for name, value, *_ in ratios] == [
        ("Rust int4, torch 2.13 decode / llama.cpp Q4_0 (avx2 build, repacked) decode", 1.5),
        ("Rust eager, torch 2.13 decode / llama.cpp Q8_0 (native build, no repack) decode", 0.8)]
    checks, lines = judge(ratios)
    assert [c["met"] for c in checks] == [None, None] and lines[0].endswith("1.50  (measured; no target)")


NO_PEER = peer.missing("llamacpp-q4_0")


@pytest.mark.skipif(NO_PEER is not None, reason=f"llama.cpp not built: {NO_PEER}")
@pytest.mark.parametrize("way,cold", [("llamacpp-q4_0-norepack", "prompt"), ("llamacpp-avx2-q4_0", "prefix")])
def test_a_llama_cpp_way_runs_like_the_others_on_the_trained_model(way, cold):
    text = checkpoints.trained("causal") / "text"
    if peer.missing(way):
        pytest.skip(peer.missing(way))
    ids = prompt.encode(text, prompt.PROMPT)
    row = run_way(way, text, None, "cpu", "bfloat16", 2048, ids, 8, cold=cold)  # step 06 asks for "prefix"
    assert row["available"], row["why"]
    assert row["cold"] == cold
    assert len(row["tokens"]) == 8 and row["tokens"] == prompt.expected(text, prompt.PROMPT)[:8]
    assert row["streamed_tok_s"] > 0 and row["read_tok_s"] > 0 and row["peak_gb"] > 0
    # one row of each table read per token, the rest whole: less than the file, more than its linears
    assert 0 < row["bytes_per_token"] < row["memory"]["weights as stored"]
    assert json.loads(json.dumps(row)) == row  # a row goes into the record as it is
