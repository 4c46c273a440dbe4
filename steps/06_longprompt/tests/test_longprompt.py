"""The long-prompt builder, the answer parser, and the long read itself (tiny checkpoint, CPU)."""
import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchtpu_rs
from torchtpu_longprompt import build_prompt, parse_answer, shortest
from torchtpu_rs import checkpoints
from torchtpu_rs.reference import transformers_model
from torchtpu_ways.baseline import Baseline
from transformers import AutoTokenizer

RUN = Path(__file__).resolve().parents[1] / "run.py"
CTX = 2048


@pytest.fixture(scope="module")
def tiny():
    return checkpoints.tiny()


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return AutoTokenizer.from_pretrained(tiny / "text")


@pytest.mark.parametrize("target", [60, 253, 1000, 2031])
def test_prompt_fits_the_target_and_holds_the_asked_code_once(tokenizer, target):
    prompt = build_prompt(tokenizer, target, seed=3)
    one_record = len(build_prompt(tokenizer, 2 * shortest(tokenizer), seed=3).ids) - shortest(tokenizer)
    assert target - one_record - 2 <= len(prompt.ids) <= target  # short of the target by under one record
    assert prompt.ids[0] == tokenizer.bos_token_id
    assert 1 <= prompt.asked <= prompt.records
    text = tokenizer.decode(prompt.ids)
    assert f"Record {prompt.asked}: code {prompt.expected}." in text
    assert text.count(prompt.expected) == 1
    assert text.endswith(f"What is the code of record {prompt.asked}? Answer:")


def test_same_seed_same_prompt(tokenizer):
    assert build_prompt(tokenizer, 500, seed=1) == build_prompt(tokenizer, 500, seed=1)
    assert build_prompt(tokenizer, 500, seed=1).ids != build_prompt(tokenizer, 500, seed=2).ids


def test_a_target_below_one_record_is_refused(tokenizer):
    with pytest.raises(ValueError, match="smallest prompt"):
        build_prompt(tokenizer, 5)


@pytest.mark.parametrize("reply, answer", [
    (" 6 1 0 3 9 5 .", "610395"),
    ("The code is 610395, I think. Record 18", "610395"),
    ("code 610395\n\nRecord 2: code 111111.", "610395"),
    ("no digits here", None),
])
def test_parse_answer_takes_the_first_number(reply, answer):
    assert parse_answer(reply) == answer


@pytest.fixture(scope="module")
def long_prompt(tokenizer):
    return build_prompt(tokenizer, CTX - 20, seed=0)  # nearly full: the sliding rings wrap ~60 times


def test_chunked_read_equals_an_unchunked_forward(tiny, long_prompt):
    engine = torchtpu_rs.Engine(tiny / "text", None, torch.zeros(1), CTX, "float32")
    ours = engine.logits(long_prompt.ids)
    reference = transformers_model(tiny / "text")
    with torch.no_grad():
        theirs = reference(torch.tensor([long_prompt.ids])).logits[0]
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_rust_and_python_read_the_long_prompt_alike(tiny, long_prompt):
    engine = torchtpu_rs.Engine(tiny / "text", tiny / "emb4", torch.zeros(1), CTX, "float32")
    baseline = Baseline(tiny / "text", tiny / "emb4", torch.device("cpu"), CTX, "float32")
    assert (engine.logits(long_prompt.ids) - baseline.logits(long_prompt.ids)).abs().max().item() <= 1e-3


def test_run_py_table_and_json(tmp_path):
    out = tmp_path / "long.json"
    proc = subprocess.run([sys.executable, str(RUN), "--dtype", "float32", "--lengths", "40,100",
                           "--ways", "rust-fused,rust-eager,python-eager", "--json", str(out)],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines()[0].split() == ["way", "prompt", "read", "s", "read", "tok/s", "decode",
                                                   "answer", "expected", "found"]
    assert proc.stdout.count("all ways gave") == 2  # float32: Rust and Python give the same answer
    r = json.loads(out.read_text())
    assert r["meta"]["device"] == "cpu" and r["lengths"] == [40, 100]
    assert r["stop"] == [1]  # the default model's <eos>: answers end where the model ends them
    assert all(row["found"] for row in r["rows"] if row["available"] and row["prompt_tokens"] <= 40)
    keys = {"way", "available", "prompt_tokens", "read_s", "read_tok_s", "decode_tok_s", "answer", "expected",
            "found"}
    for row in r["rows"]:
        assert keys <= row.keys()
        if row["way"] == "rust-fused":
            assert row["available"] is False and row["why"] and row["read_s"] is None
        else:
            assert row["available"] and row["read_s"] > 0 and row["read_tok_s"] > 0 and row["decode_tok_s"] > 0


@pytest.mark.parametrize("flags, error", [
    (["--lengths", "40,x,0"], "argument --lengths: 'x', '0': not a whole number of at least 1"),
    (["--lengths", "40,3"], "--lengths: 3 below "),  # the smallest prompt: one record and the question
    (["--ways", "rust-eager,llamacpp-q5_k"], "--ways: unknown llamacpp-q5_k"),
    (["--max-new", "0"], "--max-new 0: at least 1"),
    (["--json", "/no/such/folder/long.json"], "argument --json: /no/such/folder/long.json: the folder"),
])
def test_run_py_refuses_bad_flags_before_any_way_runs(monkeypatch, capsys, flags, error):
    """In this process (a fresh one per case would import torch again: seconds each): argparse's exit 2."""
    monkeypatch.setattr(sys, "argv", [str(RUN), *flags])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(RUN), run_name="__main__")
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and error in err and out == ""
