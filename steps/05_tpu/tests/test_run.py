"""run.py runs every way in a fresh process and reports each with a complete record; fused is n/a off a TPU."""
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchtpu_rs.prompting import same_prefix
from torchtpu_ways.baseline import full_slots_for
from torchtpu_ways.compiling import chunk_shapes, decode_shapes
from torchtpu_ways.report import judge
from torchtpu_ways.ways import FIGURES, WAYS, label, median_row, run_way
from torchtpu_ways.worker import same_shapes_prefix

STEP = Path(__file__).resolve().parents[1]
ROOT = STEP.parents[1]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, ctx, short_prompt):
    """run.py on the trained model step 03 ships, float32 (the same graphs test_compile compiled), 8 tokens, all four
    ways (fused recorded as not available off a TPU)."""
    out = tmp_path_factory.mktemp("run") / "step05.json"
    proc = subprocess.run([sys.executable, str(STEP / "run.py"), "--device", "cpu", "--dtype", "float32",
                           "--ctx", str(ctx), "--max-new", "8", "--prompt", short_prompt, "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def test_every_way_has_a_complete_row(recorded):
    _, record = recorded
    assert {"device", "cpu", "python", "torch", "tch", "transformers", "date", "command"} <= set(record["meta"])
    rows = {row["way"]: row for row in record["rows"]}
    assert list(rows) == WAYS
    keys = {"way", "torch", "available", "why", "tokens", *FIGURES}
    for way, row in rows.items():
        assert keys <= set(row), way


def test_fused_is_not_available_off_a_tpu(recorded):
    _, record = recorded
    fused = record["rows"][0]
    assert fused["way"] == "rust-fused" and fused["available"] is False
    assert "TPU" in fused["why"] and fused["tokens"] is None
    assert all(fused[key] is None for key in FIGURES), "no invented numbers"


def test_each_way_ran_in_its_own_process_and_measured(recorded):
    _, record = recorded
    ran = [row for row in record["rows"] if row["available"]]
    assert len({row["pid"] for row in ran}) == 3 and os.getpid() not in {row["pid"] for row in ran}
    for row in ran:
        assert row["torch"] == torch.__version__ and row["why"] is None
        assert len(row["tokens"]) == 8
        for key in ("load_s", "first_s", "streamed_tok_s", "batched_tok_s", "read_s", "read_tok_s"):
            assert row[key] > 0, (row["way"], key)
        assert row["peak_gb"] > 0.05, "peak resident memory of a process that imported torch"


def test_every_way_itemizes_the_same_bytes_held(recorded):
    """The Rust engine and the baseline hold the same model in the same dtypes: their `memory()` agrees part for
    part, and the parts a decode step reads whole add up to what it reads, less one row of each table."""
    _, record = recorded
    ran = [row for row in record["rows"] if row["available"]]
    parts = ["linears", "head", "embed_tokens", "embed_tokens_per_layer", "norms and scalars", "kv caches"]
    assert all(list(row["memory"]) == parts for row in ran)
    assert len({tuple(row["memory"].values()) for row in ran}) == 1, [row["memory"] for row in ran]
    held = ran[0]["memory"]
    assert all(held[part] > 0 for part in ("linears", "embed_tokens", "embed_tokens_per_layer", "kv caches"))
    whole = held["linears"] + held["head"] + held["norms and scalars"]
    assert 0 < ran[0]["bytes_per_token"] - whole < held["embed_tokens"]


def test_graphs_and_breaks_are_counted_by_dynamo_for_the_compile_way_only(recorded):
    _, record = recorded
    rows = {row["way"]: row for row in record["rows"]}
    compiled = rows["python-compile"]
    assert type(compiled["graphs"]) is int and type(compiled["breaks"]) is int
    # the prompt chunk, then a decode program for each bucket of the full caches the 8 steps attend over
    ids, chunk = compiled["prompt_len"], 16  # the tiny models' sliding window
    decode = decode_shapes(ids, 8, chunk, record["ctx"], "bucket")
    assert (compiled["graphs"], compiled["breaks"]) == (len(chunk_shapes(ids, chunk, record["ctx"])) + len(decode), 0)
    assert all(rows[w]["graphs"] is None and rows[w]["breaks"] is None for w in ("rust-eager", "python-eager"))


def test_the_printed_table_and_float32_tokens_agree(recorded):
    stdout, record = recorded
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("way "))
    assert lines[header].split()[1:] == ["load", "s", "first", "s", "graphs", "breaks", "streamed", "in",
                                         "batches", "peak", "GB"]
    assert lines[header + 1].startswith("Rust fused") and "n/a" in lines[header + 1]
    version = label({"way": "rust-eager", "torch": torch.__version__}).split(", ")[1]
    assert lines[header + 2].startswith(f"Rust eager, {version}")
    reference = label({"way": "python-compile", "torch": torch.__version__})
    # float32: every way picks the same tokens
    assert f"Rust eager, {version}: first 8 of 8 tokens identical to {reference}" in lines
    assert f"Python eager, {version}: first 8 of 8 tokens identical to {reference}" in lines
    assert record["identical"] == lines[header + 5:header + 7]


@pytest.mark.parametrize("flags, error", [
    (["--compile-python", "/no/such/python"], "--compile-python /no/such/python: not an executable"),
    (["--ways", "rust-eager,rust-fast"], "--ways: unknown rust-fast"),
    (["--json", "/no/such/folder/a.json"], "argument --json: /no/such/folder/a.json: the folder"),
])
def test_bad_flags_are_refused_at_once(monkeypatch, capsys, flags, error):
    """In this process (a fresh one per case would import torch again: seconds each): argparse's exit 2."""
    monkeypatch.setattr(sys, "argv", [str(STEP / "run.py"), *flags])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(STEP / "run.py"), run_name="__main__")
    assert stop.value.code == 2 and error in capsys.readouterr().err


def test_run_way_refuses_fused_off_a_tpu_without_starting_a_process(tiny):
    row = run_way("rust-fused", tiny / "text", None, "cpu", "bfloat16", 64, [2, 3], 4, python="/nonexistent")
    assert row["available"] is False and row["load_s"] is None


def test_median_row_label_and_same_prefix():
    runs = [{"way": "python-compile", "torch": "2.14.1", "available": True, "why": None, "tokens": [1, 2],
             **dict.fromkeys(FIGURES, float(i)), "graphs": g, "breaks": 0} for i, g in zip((3, 1, 2), (2, 3, 2))]
    row = median_row(runs)
    assert row["load_s"] == 2.0 and row["graphs"] == 2 and row["tokens"] == [1, 2]
    assert label(row) == "Python compile, torch 2.14.1"
    assert label({"way": "rust-eager", "torch": "2.13.0+cu130"}) == "Rust eager, torch 2.13"
    assert same_prefix([1, 2, 3], [1, 2, 4]) == 2 and same_prefix([1, 2], [1, 2]) == 2


def test_targets_are_judged_met_missed_or_not_measured():
    checks, lines = judge([("a / b", 1.2, ">=", 0.9), ("c / d", 1.2, "<=", 1.05), ("e / f", None, ">=", 0.9)])
    assert [c["met"] for c in checks] == [True, False, None]
    assert [line.split()[-1] for line in lines] == ["met", "MISSED", "measured"]


def test_the_cold_prefix_has_the_prompt_s_chunk_shapes(tiny, ctx):
    w = json.loads((tiny / "text" / "config.json").read_text())["sliding_window"]  # one chunk
    ids = list(range(7 * w + 5))  # whole chunks in buckets of w, 2w, 4w, 4w, 8w, 8w, 8w slots; the last in 8w
    assert chunk_shapes(len(ids), w, ctx)[-3:] == [(w, 8 * w), (w, 8 * w), (5, 8 * w)]
    assert same_shapes_prefix(ids[:w], tiny / "text", ctx) == ids[:w]  # one chunk: the whole prompt
    assert same_shapes_prefix(ids, tiny / "text", ctx) == ids[: 5 * w + 5]  # up to the first chunk in 8w, then 5
    assert same_shapes_prefix(ids[: 6 * w], tiny / "text", ctx) == ids[: 5 * w]
    assert same_shapes_prefix(ids[: 4 * w + 5], tiny / "text", ctx) == ids[: 4 * w + 5]  # the last: a new bucket


def test_the_cold_prefix_of_the_article_s_longest_prompt(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"sliding_window": 512}))  # E2B's chunk
    ids = list(range(32748))  # step 06's longest prompt, in a 33,024-token context
    assert len(same_shapes_prefix(ids, tmp_path, 33024)) == 33 * 512 + 492  # the first chunk in 32,768, the last


def test_full_slots_round_the_visible_prefix_up_to_few_buckets():
    # the article's context: 512-token chunks in a 33,024-slot full cache
    assert [full_slots_for(end, 512, 33024) for end in (1, 512, 513, 4076, 16384, 16385, 32768, 32769)] == \
        [512, 512, 1024, 4096, 16384, 32768, 32768, 33024]
    shapes = chunk_shapes(32748, 512, 33024)
    assert len(shapes) == 64 and len(set(shapes)) == 8  # 7 buckets of whole chunks and the last, 492-token chunk
    assert all(slots >= min(512 * (i + 1), 32748) for i, (_, slots) in enumerate(shapes))  # never hides a key
