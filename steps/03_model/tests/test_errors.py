"""Every bad input is a Python exception that names the problem — never a crash, an abort or a Rust panic.

Each case runs in a child interpreter (conftest's `isolated`: one for the module, replaced after any case that
crashes): a segfault or an abort fails that case instead of the whole run, and a Rust panic (PyO3's PanicException,
a BaseException) is not caught by the `except` and fails it too."""
import json
import shutil
import signal

import pytest
import torch
from safetensors.torch import load_file, save_file

TENSORS = "model.safetensors"


def rewrite(folder, change):
    tensors = load_file(folder / TENSORS)
    change(tensors)
    save_file(tensors, folder / TENSORS, metadata={"format": "pt"})


def edit_config(folder, change):
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def drop(name):
    return lambda f: rewrite(f, lambda t: t.pop(name))


def set_quant(key, value):
    def change(config):
        q = config["quantization_config"]
        if key == "format":
            q["format"] = value
        else:
            q["config_groups"]["group_0"]["weights"][key] = value
    return lambda f: edit_config(f, change)


Q0 = "model.layers.0.self_attn.q_proj"

# (case id, how to break a copy of the tiny checkpoint, the call, exception, words the message must hold)
LOAD_CASES = [
    ("missing dir", lambda f: shutil.rmtree(f), "E(M)", "FileNotFoundError", "no such checkpoint folder"),
    ("missing config", lambda f: (f / "config.json").unlink(), "E(M)", "FileNotFoundError", "config.json"),
    ("config a folder", lambda f: ((f / "config.json").unlink(), (f / "config.json").mkdir()), "E(M)", "ValueError",
     "config.json: Is a directory"),
    ("garbled config", lambda f: (f / "config.json").write_text("{not json"), "E(M)", "ValueError",
     "config.json: not valid JSON"),
    ("config without a key", lambda f: edit_config(f, lambda c: c.pop("hidden_size")), "E(M)", "ValueError",
     "hidden_size"),
    ("no safetensors", lambda f: (f / TENSORS).unlink(), "E(M)", "FileNotFoundError", TENSORS),
    ("truncated safetensors", lambda f: (f / TENSORS).write_bytes((f / TENSORS).read_bytes()[:-100]), "E(M)",
     "ValueError", "not a valid safetensors file"),
    ("garbage safetensors", lambda f: (f / TENSORS).write_bytes(b"\x13" * 5000), "E(M)", "ValueError",
     "not a valid safetensors file"),
    ("missing tensor", drop("model.layers.3.mlp.down_proj.weight_packed"), "E(M)", "ValueError",
     "missing tensor model.layers.3.mlp.down_proj.weight_packed"),
    ("inconsistent weight_shape", lambda f: rewrite(f, lambda t: t.__setitem__(
        Q0 + ".weight_shape", torch.tensor([7, 9]))), "E(M)", "ValueError", Q0 + ".weight_shape"),
    ("wrong dtype", lambda f: rewrite(f, lambda t: t.__setitem__(
        Q0 + ".weight_packed", t[Q0 + ".weight_packed"].float())), "E(M)", "ValueError", "dtype F32"),
    ("8-bit weights", set_quant("num_bits", 8), "E(M)", "NotImplementedError", "num_bits Some(8)"),
    ("other format", set_quant("format", "float-quantized"), "E(M)", "NotImplementedError", '"float-quantized"'),
    ("asymmetric", set_quant("symmetric", False), "E(M)", "NotImplementedError", "symmetric Some(false)"),
]

CALL_CASES = [
    ("missing emb4 dir", "E(M, M + '-nowhere')", "FileNotFoundError", "-nowhere: no such checkpoint folder"),
    ("like not a tensor", "torchtpu_rs.Engine(M, None, 'cpu', 64)", "TypeError",
     "Engine(like): expected a torch.Tensor, got str"),
    ("bad dtype", "E(M, dtype='float16')", "ValueError", 'dtype="float16"'),
    ("ctx zero", "torchtpu_rs.Engine(M, None, torch.zeros(1), 0)", "ValueError", "ctx=0"),
    ("ctx too long", "torchtpu_rs.Engine(M, None, torch.zeros(1), 10**9)", "ValueError", "max_position_embeddings"),
    ("id out of range", "E(M).generate([2, 5, 512], 4)", "ValueError", "ids[2] = 512 is outside the vocabulary"),
    ("negative id", "E(M).generate([2, -1], 4)", "ValueError", "ids[1] = -1"),
    ("ids a string", "E(M).generate('hello', 4)", "TypeError", "generate(ids): expected a list of ints, got str"),
    ("ids not ints", "E(M).logits([2, 'a'])", "TypeError", "logits(ids): expected a list of ints"),
    ("empty prompt", "E(M).generate([], 4)", "ValueError", "the prompt is empty"),
    ("prompt plus max_new over ctx", "E(M).generate([2] * 60, 5)", "ValueError", "len(ids) + max_new <= ctx"),
    ("negative max_new", "E(M).generate([2], -1)", "ValueError", "max_new=-1"),
    # a sum with len(ids) that wraps past 2^63 would pass a check written as one, and generate would never end
    ("max_new at i64's top", "E(M).generate([2], 2**63 - 1)", "ValueError", "len(ids) + max_new <= ctx"),
    ("top_k past i64", "E(M).stream([2], 4, top_k=2**64)", "ValueError", "top_k=18446744073709551616: out of range"),
    ("sample n negative", "torchtpu_rs.sample(torch.zeros(8), -1, 0)", "ValueError", "n=-1: need 0 <= n"),
    ("sample of a 0-d tensor", "torchtpu_rs.sample(torch.tensor(1.0), 1, 0)", "ValueError", "sample(logits): shape []"),
    ("filtered_probs of a 0-d tensor", "torchtpu_rs.filtered_probs(torch.tensor(1.0))", "ValueError",
     "filtered_probs(logits): shape []"),
    ("filtered_probs of no tokens", "torchtpu_rs.filtered_probs(torch.zeros(2, 0))", "ValueError", "vocab >= 1"),
    ("read_every zero", "E(M).generate([2], 4, read_every=0)", "ValueError", "read_every=0"),
    ("stop not a collection", "E(M).generate([2], 4, stop=1)", "TypeError", "stop: expected a list, tuple or set"),
    ("stop not ints", "E(M).generate([2], 4, stop=['x'])", "TypeError", "stop: expected ints, got str 'x'"),
    ("stop outside the vocabulary", "E(M).generate([2], 4, stop=[1, 512])", "ValueError",
     "stop: 512 is outside the vocabulary"),
    ("logits over ctx", "E(M).logits([2] * 65)", "ValueError", "65 tokens do not fit ctx=64"),
    ("logits position", "E(M).logits([2, 3], positions=[2])", "ValueError", "positions: 2"),
    ("layout_for missing config", "torchtpu_rs.layout_for(M + '/nope.json', 64)", "FileNotFoundError", "nope.json"),
]

PRELUDE = """
import sys, torch, torchtpu_rs
M = sys.argv[1]
def E(model, emb4=None, dtype="float32"):
    return torchtpu_rs.Engine(model, emb4, torch.zeros(1), 64, dtype)
"""


def run_case(isolated, folder, call, kind):
    code = f"{PRELUDE}\ntry:\n    {call}\nexcept {kind} as e:\n    print('raised:', e)\n"
    return isolated.run(code, str(folder), timeout=300)


def check(proc, words):
    assert proc.returncode == 0, f"the process failed (crash, panic or wrong exception):\n{proc.stderr[-2000:]}"
    assert "raised:" in proc.stdout, f"no exception at all: {proc.stdout}"
    assert words in proc.stdout, proc.stdout
    assert "panicked" not in proc.stderr


@pytest.fixture
def broken_copy(tiny, tmp_path):
    folder = tmp_path / "text"
    shutil.copytree(tiny / "text", folder)
    return folder


@pytest.mark.parametrize("name, breakit, call, kind, words", LOAD_CASES, ids=[c[0] for c in LOAD_CASES])
def test_a_broken_checkpoint_raises(isolated, broken_copy, name, breakit, call, kind, words):
    breakit(broken_copy)
    check(run_case(isolated, broken_copy, call, kind), words)


@pytest.mark.parametrize("name, call, kind, words", CALL_CASES, ids=[c[0] for c in CALL_CASES])
def test_a_bad_argument_raises(isolated, tiny, name, call, kind, words):
    check(run_case(isolated, tiny / "text", call, kind), words)


def test_the_original_is_untouched_by_a_failed_load(isolated, tiny):
    before = (tiny / "text" / TENSORS).stat().st_mtime_ns
    check(run_case(isolated, tiny / "text", "E(M).generate([], 1)", "ValueError"), "empty")
    assert (tiny / "text" / TENSORS).stat().st_mtime_ns == before


def test_a_crash_or_an_escaped_exception_fails_only_its_own_case(bare_isolated):
    """The isolation these cases rely on: cases share one child until one crashes (a segfault) or lets an exception
    escape (as a Rust panic's PanicException would); that case fails, and the next runs in a new child."""
    first = bare_isolated.run("import os; print(os.getpid())")
    assert bare_isolated.run("import os; print(os.getpid())").stdout == first.stdout  # one interpreter
    crash = bare_isolated.run("import os, signal; print('before', flush=True); os.kill(os.getpid(), signal.SIGSEGV)")
    assert (crash.returncode, crash.stdout) == (-signal.SIGSEGV, "before\n")
    escaped = bare_isolated.run("raise BaseException('a panic')")
    assert escaped.returncode == 1 and "BaseException: a panic" in escaped.stderr
    after = bare_isolated.run("import os, sys; print(os.getpid(), *sys.argv[1:])", "an argument")
    assert after.returncode == 0 and after.stdout.split()[1:] == ["an", "argument"]
    assert after.stdout.split()[0] != first.stdout.strip()
