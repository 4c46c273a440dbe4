"""Step 08's decode budget (budget.rs, budget.py): the parts cover a decode step, time the steps generate makes,
and count every matrix a step reads exactly once."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchtpu_kernels

STEP = Path(__file__).resolve().parents[1]
CTX = 2048
IDS = [2, 17, 250, 33, 480, 5, 99, 301]
PARTS = ["embedding gathers", "per-layer model projection", "cache write and masks", "q/k/v projections",
         "attention over the cache", "o projection", "gate/up projections", "down projection",
         "per-layer input gate and projection", "output head", "norms (with rotary, residual adds)",
         "gelu(gate) times up, where not fused", "sampling (argmax)", "the rest (views, the step's glue)"]


def test_the_parts_cover_the_steps_generate_makes_and_count_each_matrix_once(tiny, matmul):
    covers_the_steps(torchtpu_kernels.Engine(tiny / "text", tiny / "emb4", torch.empty(0), CTX, int4_matmul=matmul))


def test_so_do_the_parts_of_the_bf16_engine(tiny):
    covers_the_steps(torchtpu_kernels.Engine(tiny / "text", tiny / "emb4", torch.empty(0), CTX, weights="bf16"))


def covers_the_steps(engine):
    tokens, _, _ = engine.generate(IDS, 4)
    budget = engine.decode_budget(IDS, 3)
    assert budget["tokens"] == tokens  # the same steps as generate's
    names = [name for name, _, _ in budget["parts"]]
    assert names == PARTS
    seconds = {name: s for name, s, _ in budget["parts"]}
    read = {name: b for name, _, b in budget["parts"]}
    assert all(s >= 0 for s in seconds.values()) and math.isclose(sum(seconds.values()), budget["step_s"])
    assert seconds["output head"] > 0 and seconds["attention over the cache"] > 0
    # every engine norms; the per-layer input's gelu is a call of its own in every engine
    assert seconds["norms (with rotary, residual adds)"] > 0 and seconds["gelu(gate) times up, where not fused"] > 0
    held = engine.memory()
    matrices = [n for n in PARTS if "projection" in n]
    assert sum(read[n] for n in matrices) == held["linears"]  # every layer's matrices, once a step
    if held["head"]:  # a head that is the bf16 embedding table itself is held once, as embed_tokens
        assert read["output head"] == held["head"]
    assert read["embedding gathers"] > 0 and read["attention over the cache"] > 0
    assert all(read[n] == 0 for n in PARTS[-4:])  # norms, gelu, sampling and the rest read no weights


def test_the_parts_cover_a_prompt_read_and_count_each_matrix_once_a_chunk(tiny, matmul):
    engine = torchtpu_kernels.Engine(tiny / "text", tiny / "emb4", torch.empty(0), CTX, int4_matmul=matmul)
    held = engine.memory()
    matrices = [n for n in PARTS if "projection" in n]
    weights = {}
    for ids, chunks in ((IDS, 1), (IDS * 3, 2), (IDS * 5, 3)):  # the tiny model reads 16 tokens a chunk
        tokens, _, _ = engine.generate(ids, 1)
        budget = engine.read_budget(ids)
        assert budget["token"] == tokens[0]  # the same read as generate's
        assert [name for name, _, _ in budget["parts"]] == PARTS
        seconds = {name: s for name, s, _ in budget["parts"]}
        read = {name: b for name, _, b in budget["parts"]}
        assert all(s >= 0 for s in seconds.values()) and math.isclose(sum(seconds.values()), budget["read_s"])
        assert seconds["gate/up projections"] > 0 and seconds["attention over the cache"] > 0
        weights[chunks] = sum(read[n] for n in matrices)
        if held["head"]:
            assert read["output head"] == held["head"]  # the head once, on the last row
        assert all(read[n] == 0 for n in PARTS[-4:])
    # one chunk reads every matrix once; each further chunk the cache owners' again, not the KV-shared layers'
    assert weights[1] == held["linears"]
    again = weights[2] - weights[1]
    assert 0 < again < held["linears"] and weights[3] == weights[1] + 2 * again
    with pytest.raises(TypeError, match=r"read_budget\(ids\)"):
        engine.read_budget("not ids")
    with pytest.raises(ValueError, match=r"ids\[1\] = -3 is outside the vocabulary"):
        engine.read_budget([2, -3])


def kv_shared_multiply_adds(text: dict) -> dict:
    """Multiply-adds of one row through the KV-shared layers, by part, from a Gemma 4 text config: q but no k or
    v, the o projection, the (double-wide) feed-forward block and the per-layer input's two products."""
    hidden, layers, shared = text["hidden_size"], text["num_hidden_layers"], text["num_kv_shared_layers"]
    count = dict.fromkeys(["q/k/v projections", "o projection", "gate/up projections", "down projection",
                           "per-layer input gate and projection"], 0)
    for kind in text["layer_types"][layers - shared:]:
        q = text["num_attention_heads"] * text["global_head_dim" if kind == "full_attention" else "head_dim"]
        wide = text["intermediate_size"] * (2 if text["use_double_wide_mlp"] else 1)
        count["q/k/v projections"] += hidden * q
        count["o projection"] += q * hidden
        count["gate/up projections"] += 2 * hidden * wide
        count["down projection"] += wide * hidden
        count["per-layer input gate and projection"] += 2 * hidden * text["hidden_size_per_layer_input"]
    return count


def test_a_prompt_reads_multiply_adds_are_its_rows_times_a_decode_steps_but_the_kv_shared_layers_once(tiny, matmul):
    engine = torchtpu_kernels.Engine(tiny / "text", tiny / "emb4", torch.empty(0), CTX, int4_matmul=matmul)
    step = engine.decode_budget(IDS, 2)["multiply_adds"]
    # a decode step multiplies each weight once: the head's are the vocabulary times the hidden size
    assert set(step) == {n for n in PARTS if "projection" in n} | {"output head"}
    config = json.loads((tiny / "text" / "config.json").read_text())
    text = config.get("text_config", config)
    assert text["num_kv_shared_layers"] > 0
    assert step["output head"] == text["vocab_size"] * text["hidden_size"]
    shared = kv_shared_multiply_adds(text)
    assert all(0 < shared[n] < step[n] for n in shared)
    for ids in (IDS, IDS * 5):  # one chunk, and three
        read = engine.read_budget(ids)["multiply_adds"]
        # every product multiplies each of its weights by each row, but the KV-shared layers and the head take only
        # the last row: they write no cache, so the rows before it need nothing from them
        rows = len(ids)
        assert read == {n: c if n == "output head" else rows * c - (rows - 1) * shared.get(n, 0)
                        for n, c in step.items()}


def test_the_fma_limit_is_a_rate_and_refuses_bad_arguments():
    if not torchtpu_kernels.fma4_runs():
        with pytest.raises(RuntimeError, match="fma_limit: needs a CPU with AVX2"):
            torchtpu_kernels.fma_limit()
        return
    assert math.isfinite(limit := torchtpu_kernels.fma_limit(rounds=200_000)) and limit > 0
    for rounds, tries in ((0, 3), (10, 0)):
        with pytest.raises(ValueError, match=rf"fma_limit\(rounds={rounds}, tries={tries}\): need both >= 1"):
            torchtpu_kernels.fma_limit(rounds, tries)


def test_attention_is_counted_by_the_slots_it_reads(tiny):
    def attention(engine, n):  # bytes of one decode step after n prompt tokens
        return {name: b for name, _, b in engine.decode_budget(IDS[:n], 1)["parts"]}["attention over the cache"]

    try:
        own = torchtpu_kernels.Engine(tiny / "text", tiny / "emb4", torch.empty(0), CTX, decode_attention="own")
    except NotImplementedError as why:
        pytest.skip(str(why))
    aten = torchtpu_kernels.Engine(tiny / "text", tiny / "emb4", torch.empty(0), CTX, decode_attention="aten")
    # after n tokens every layer's query sees n + 1 slots (the tiny window is 16): the own call reads those, ATen's
    # ops every slot of the bucket, the same after 5 tokens as after 6
    assert attention(own, 5) * 7 == attention(own, 6) * 6
    assert attention(aten, 5) == attention(aten, 6) > attention(own, 6) > 0


def test_bad_steps_name_the_argument(tiny):
    engine = torchtpu_kernels.Engine(tiny / "text", None, torch.empty(0), 64)
    for steps in (0, 64, 2**63 - 1):
        with pytest.raises(ValueError, match=rf"decode_budget\(steps={steps}\): need 1 <= steps"):
            engine.decode_budget(IDS, steps)
    with pytest.raises(TypeError, match=r"decode_budget\(ids\)"):
        engine.decode_budget("not ids", 2)


def test_the_script_prints_the_table_and_writes_the_record(tmp_path):
    out = tmp_path / "budget.json"
    run = subprocess.run([sys.executable, STEP / "budget.py", "--steps", "2", "--repeat", "2", "--json", out,
                          "--chart", tmp_path / "budget.png"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    for name in PARTS + ["a decode step, the parts summed", "the same steps untimed (generate)"]:
        assert name in run.stdout, run.stdout
    record = json.loads(out.read_text())
    assert [p["part"] for p in record["parts"]] == PARTS and len(record["rounds"]) == 2
    assert math.isclose(sum(p["ms"] for p in record["parts"]), record["step_ms"])
    assert record["limit_ms"] > 0 and (tmp_path / "budget.png").stat().st_size > 0
    # the limit is the read-only stream's; the copy's, which also writes, is beside it
    assert record["read_gb_s"] > 0 and record["read_kernel"] and record["copy_limit_ms"] > 0
    assert "of its read limit; at the copy's" in run.stdout


def test_the_script_budgets_a_prompt_read_too(tmp_path):
    out = tmp_path / "read.json"
    run = subprocess.run([sys.executable, STEP / "budget.py", "--read", "--tokens", "40", "--repeat", "2", "--json",
                          out], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    for name in PARTS + ["a prompt read, the parts summed", "the same read untimed (generate)"]:
        assert name in run.stdout, run.stdout
    record = json.loads(out.read_text())
    assert record["budget"] == "read" and len(record["prompt_ids"]) == 40 and len(record["tokens"]) == 1
    assert math.isclose(sum(p["ms"] for p in record["parts"]), record["step_ms"])
    # the KV-shared layers take the last row only: fewer products than every row through every layer
    assert 0 < record["multiply_adds"] < record["every_row_multiply_adds"]
    assert "every row through every layer would multiply" in run.stdout
    if record["int4_matmul"] == "fma4":  # its products against the FMA limit
        assert record["fma_gflop_s"] > 0 and "of its arithmetic limit" in run.stdout
        assert record["multiply_adds"] == sum(p["multiply_adds"] for p in record["parts"]) > 0
    run = subprocess.run([sys.executable, STEP / "budget.py", "--read", "--tokens", "0"], capture_output=True,
                         text=True)
    assert run.returncode == 2 and "--tokens 0: 1 <= N <= ctx" in run.stderr


def test_the_script_budgets_a_decode_step_after_a_long_prompt(tmp_path):
    """--tokens without --read: decode steps after that many tokens, whose attention reads a fuller cache."""
    out = tmp_path / "long.json"
    run = subprocess.run([sys.executable, STEP / "budget.py", "--tokens", "100", "--steps", "2", "--repeat", "1",
                          "--json", out], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["budget"] == "decode" and len(record["prompt_ids"]) == 100 and len(record["tokens"]) == 3
    assert "100-token prompt" in run.stdout
    run = subprocess.run([sys.executable, STEP / "budget.py", "--tokens", "99999"], capture_output=True, text=True)
    assert run.returncode == 2 and "less the decode steps without --read" in run.stderr
