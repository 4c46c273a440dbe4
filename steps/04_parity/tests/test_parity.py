"""The engine matches Transformers on every tiny checkpoint variant — and the comparison can fail."""
import json
import math
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchtpu_rs
from safetensors.torch import load_file, save_file
from torchtpu_parity import compare
from torchtpu_rs import checkpoints, records
from torchtpu_rs.reference import transformers_model

RUN = Path(__file__).resolve().parents[1] / "run.py"
PROMPT = [2, 17, 250, 33, 480, 5, 99, 301, 12, 40, 41, 7, 300, 301, 302, 9, 88, 120, 4]  # 19 tokens, as the article's


@pytest.fixture(scope="module", params=["causal", "multimodal", "emb4"])
def variant(request):
    """(engine model dir, engine emb4 dir, the folder Transformers reads)."""
    folder = checkpoints.tiny("multimodal" if request.param == "multimodal" else "causal")
    if request.param == "emb4":
        return folder / "text", folder / "emb4", folder / "emb4"
    return folder / "text", None, folder / "text"


def run_compare(variant, dtype, layers=True, matvec="aten", attention_dtype=None):
    model, emb4, reference = variant
    engine = torchtpu_rs.Engine(model, emb4, torch.zeros(1), 2048, dtype, matvec=matvec,
                                attention_dtype=attention_dtype)
    return compare(engine, transformers_model(reference, dtype), PROMPT, 64, dtype, layers=layers)


def test_float32_agrees_to_the_last_token(variant):
    r = run_compare(variant, "float32")
    assert r["top5_rust"]["ids"] == r["top5_hf"]["ids"]
    assert r["max_abs_diff"] <= 1e-3
    assert r["kl_hf_rs"] <= 1e-6
    assert (r["same"], r["first_diff"]) == (64, None)
    assert all(row["ok"] for row in r["layers"]), r["layers"]


def onednn_emulates_bf16() -> bool:
    """Whether torch's bf16 matmul runs on oneDNN (its fast path) without the CPU's own bf16 instructions: AVX-512
    and no AVX512-BF16 (Intel Skylake to Ice Lake; ONEDNN_MAX_CPU_ISA=AVX512_CORE stands in for one). There oneDNN
    widens bf16 to float32, and its float32 sums depend on how many rows a product takes: the engine reads a prompt
    in chunks (16 + 3 tokens here) where Transformers reads it whole, and a logit can come out a bf16 step apart
    (0.03125 of one, on this prompt, with oneDNN kept to AVX512_CORE on an AMX Xeon). With AVX512-BF16 or AMX, and
    without the fast path (AVX2 only: ATen's own product), a row's bits do not depend on the rows beside it."""
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    # oneDNN's ISA names below AVX512_CORE_BF16, which have no bf16 dot product (step 08's cpu.rs reads the cap alike)
    below_bf16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")
    return not (records.bf16_matmul_hardware() and cap not in below_bf16)


EMULATED = pytest.mark.skipif(onednn_emulates_bf16(), reason="oneDNN emulates bf16 on this CPU: its sums depend on "
                              "the rows a product takes (test_bfloat16_agrees_to_a_rounding holds the engine there)")


@EMULATED
def test_bfloat16_on_the_cpu_is_bit_identical(variant):
    """With Transformers' kernels (matvec="onednn") the engine does Transformers' eager arithmetic op for op, so
    on the CPU not one bit of the logits, of any hidden state or of 64 greedy tokens differs (on other devices,
    and where oneDNN emulates bf16, expect agreement in distribution only). Attention is pinned to bf16, as
    Transformers' bf16 model computes it: the default on a CPU without bf16 matmul hardware is float32 attention,
    which rounds less (page 04)."""
    r = run_compare(variant, "bfloat16", matvec="onednn", attention_dtype="bfloat16")
    assert (r["max_abs_diff"], r["kl_hf_rs"], r["same"]) == (0, 0, 64)
    assert [row["max_abs_diff"] for row in r["layers"]] == [0] * len(r["layers"])


@EMULATED
def test_atens_matvec_leaves_the_prompt_read_bit_identical(variant):
    """The default (matvec="aten") changes only the decode steps' one-row linears: the prompt read keeps every
    bit of its logits and hidden states, and so the first token. Later tokens may part from Transformers' where
    two logits sit a bf16 step apart, as they often do on these random weights (the step's record counts it).
    Attention pinned to bf16, as above."""
    r = run_compare(variant, "bfloat16", attention_dtype="bfloat16")
    assert (r["max_abs_diff"], r["kl_hf_rs"]) == (0, 0) and r["same"] >= 1
    assert [row["max_abs_diff"] for row in r["layers"]] == [0] * len(r["layers"])


def test_bfloat16_agrees_to_a_rounding(variant):
    """What holds on every CPU, oneDNN's emulated bf16 included: the prompt read's logits within one bf16 step of
    the largest a logit can be (the softcap's), the same top-5 and first token, every hidden state within the
    layer tolerance."""
    config = json.loads((variant[0] / "config.json").read_text())
    cap = config.get("text_config", config)["final_logit_softcapping"]
    r = run_compare(variant, "bfloat16", matvec="onednn", attention_dtype="bfloat16")
    assert r["top5_rust"]["ids"] == r["top5_hf"]["ids"] and r["same"] >= 1
    assert r["max_abs_diff"] <= 2.0 ** (math.floor(math.log2(cap)) - 7)
    assert r["kl_hf_rs"] <= 1e-4
    assert all(row["ok"] for row in r["layers"]), r["layers"]


def test_a_planted_fault_is_found_by_layer(tmp_path):
    """One layer's weights perturbed in the engine's copy; Transformers reads the clean checkpoint."""
    clean = checkpoints.tiny("causal") / "text"
    faulty = tmp_path / "faulty"
    shutil.copytree(clean, faulty)
    tensors = load_file(faulty / "model.safetensors")
    name = "model.layers.3.mlp.down_proj.weight_scale"
    tensors[name] = tensors[name] * 3
    save_file(tensors, faulty / "model.safetensors", metadata={"format": "pt"})

    out = tmp_path / "parity.json"
    proc = subprocess.run([sys.executable, str(RUN), "--model", str(faulty), "--reference-model", str(clean),
                           "--dtype", "float32", "--max-new", "8", "--layers", "--json", str(out)],
                          capture_output=True, text=True, check=True)
    assert "first layer past tolerance: after layer 3" in proc.stdout
    r = json.loads(out.read_text())
    first_off = next(row for row in r["layers"] if not row["ok"])
    assert first_off["index"] == 4 and all(row["ok"] for row in r["layers"][:4])
    assert r["kl_hf_rs"] > 1e-6  # the float32 bound fails


def test_the_plant_fault_demo_names_the_layer():
    proc = subprocess.run([sys.executable, str(RUN), "--dtype", "float32", "--max-new", "4", "--layers",
                           "--plant-fault", "6"], capture_output=True, text=True, check=True)
    assert "first layer past tolerance: after layer 6" in proc.stdout


@pytest.mark.parametrize("flags, error", [
    (["--plant-fault", "99"], "--plant-fault 99: "),  # the trained model's layers: 0 to its count - 1
    (["--plant-fault", "-1"], "--plant-fault -1: "),
    (["--prompt-len", "0"], "--prompt-len 0: at least 1"),
    (["--max-new", "0"], "--max-new 0: at least 1"),
    (["--json", "/no/such/folder/parity.json"], "argument --json: /no/such/folder/parity.json: the folder"),
])
def test_bad_flags_are_refused_before_any_copy_or_load(monkeypatch, capsys, flags, error):
    """In this process (a fresh one per case would import torch again: seconds each): argparse's exit 2."""
    monkeypatch.setattr(sys, "argv", [str(RUN), *flags])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(RUN), run_name="__main__")
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and error in err
    assert "planted a fault" not in out and "load" not in out


def test_the_default_model_answers_and_a_planted_fault_changes_the_answer(tmp_path):
    """On the trained default model the prompt has a right answer; the fault makes the engine miss it."""
    answers = {}
    for fault in ([], ["--plant-fault", "3"]):
        out = tmp_path / f"parity{len(fault)}.json"
        subprocess.run([sys.executable, str(RUN), "--dtype", "float32", "--max-new", "8", *fault, "--json", str(out)],
                       capture_output=True, text=True, check=True)
        answers[bool(fault)] = json.loads(out.read_text())["answers"]
    assert answers[False] == {"rust": " 220431", "hf": " 220431"}
    assert answers[True]["hf"] == " 220431" and answers[True]["rust"] != " 220431"


def test_run_py_prints_the_article_figures_and_a_complete_json(tmp_path):
    out = tmp_path / "parity.json"
    proc = subprocess.run([sys.executable, str(RUN), "--dtype", "float32", "--max-new", "16", "--json", str(out)],
                          capture_output=True, text=True, check=True)
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["load", "top5", "top5", "max", "same", "first", "answer",
                                                   "answer"]
    r = json.loads(out.read_text())
    for key in ("meta", "top5_rust", "top5_hf", "max_abs_diff", "kl_hf_rs", "same", "of", "first_diff", "layers",
                "answers"):
        assert key in r
    assert set(r["top5_rust"]) == {"ids", "logits"} and r["of"] == 16
    assert r["meta"]["device"] == "cpu" and r["meta"]["transformers"] == "5.24.0"
