"""llama.cpp, the second reference: the ways are named and found, the stand-in vocabulary names every id, and —
where `make peer` has built it — llama.cpp's greedy tokens from ids equal the engine's on the trained model."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchtpu_rs
from torchtpu_parity import against_peer, peer, to_gguf
from torchtpu_rs import checkpoints, prompting
from transformers import AutoTokenizer

NO_PEER = peer.missing("llamacpp-bf16")
LLAMACPP = Path(__file__).resolve().parents[1] / "llamacpp.py"


def test_a_way_names_its_build_format_and_repacking():
    assert peer.parse_way("llamacpp-q4_0") == ("native", "q4_0", True)
    assert peer.parse_way("llamacpp-avx2-q8_0-norepack") == ("avx2", "q8_0", False)
    assert peer.parse_way("llamacpp-avx512-q4_0") == ("avx512", "q4_0", True)
    assert peer.name("llamacpp-avx2-bf16") == "llama.cpp BF16 (avx2 build, repacked)"
    for bad in ("llamacpp-q5_k", "llamacpp-avx2", "llamacpp-avx512", "llamacpp-q4_0-avx2", "rust-eager",
                "llamacpp-q4_0-norepack-x"):
        with pytest.raises(ValueError, match="llamacpp\\[-avx512\\|-avx2\\]"):
            peer.parse_way(bad)


def test_without_make_peer_a_way_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_CACHE", str(tmp_path))  # an empty cache: no build there
    assert "make peer" in peer.missing("llamacpp-q4_0")
    with pytest.raises(FileNotFoundError, match="make peer"):
        peer.converter()


def test_the_ggufs_are_quantized_by_whichever_build_was_made(tmp_path, monkeypatch):
    """`make bench-avx2` makes only the AVX2 build: the GGUFs are still made (the quantizer is the same C in every
    build), by the native build where there is one. The children are stood in for: what matters is the library each
    quantize child is given."""
    monkeypatch.setenv("GEMMA4_CACHE", str(tmp_path))
    monkeypatch.setattr(to_gguf, "folder_for", lambda model_dir: tmp_path / "gguf")
    libs = []

    def child(what, src, out, *rest, lib=None):
        libs.append(lib)
        Path(out).write_bytes(b"")

    monkeypatch.setattr(to_gguf, "run_child", child)
    text = checkpoints.tiny("causal") / "text"
    with pytest.raises(FileNotFoundError, match="make peer"):
        to_gguf.ggufs(text, ["q4_0"])
    peer.cache().mkdir(parents=True)
    builds = {"avx2": {"lib": "/avx2/lib", "cmake_args": "-DGGML_AVX2=ON"}}
    (peer.cache() / "builds.json").write_text(json.dumps({"builds": builds}))
    to_gguf.ggufs(text, ["q4_0"])
    builds["native"] = {"lib": "/native/lib", "cmake_args": "-DGGML_NATIVE=ON"}
    (peer.cache() / "builds.json").write_text(json.dumps({"builds": builds}))
    to_gguf.ggufs(text, ["q8_0"])
    assert libs == [None, "/avx2/lib", "/native/lib"]  # the bf16 file made once, by the converter (no library)


def test_llamacpp_py_without_the_peer_says_so_and_records_only_that(tmp_path):
    """With an empty cache (no build there) the script says why, the command to run, and records nothing else."""
    out = tmp_path / "llamacpp.json"
    proc = subprocess.run([sys.executable, str(LLAMACPP), "--device", "cpu", "--json", str(out)],
                          env={**os.environ, "GEMMA4_CACHE": str(tmp_path / "empty")}, capture_output=True, text=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.startswith("llama.cpp is not available here: ") and "make peer" in proc.stdout
    record = json.loads(out.read_text())
    assert record["available"] is False and "make peer" in record["why"]
    assert set(record) == {"meta", "model", "available", "why"}


def test_the_stand_in_vocabulary_keeps_every_id_and_its_string():
    text = checkpoints.tiny("causal") / "text"
    vocab = to_gguf.stand_in_vocab(text)
    tok = AutoTokenizer.from_pretrained(text)
    assert vocab["tokens"] == tok.convert_ids_to_tokens(list(range(len(vocab["tokens"]))))
    assert vocab["types"][:5] == [to_gguf.CONTROL] * 4 + [to_gguf.NORMAL]
    assert (vocab["pad"], vocab["eos"], vocab["bos"], vocab["unk"]) == (0, 1, 2, 3)


def test_at_e2b_size_the_stand_in_names_all_262144_ids(tmp_path):
    """The converter cuts the token table to the tokenizer's entry count: every id must have a name."""
    text = checkpoints.tiny("causal") / "text"
    shutil.copy(text / "tokenizer.json", tmp_path)
    config = json.loads((text / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 262144}))
    vocab = to_gguf.stand_in_vocab(tmp_path)
    assert len(vocab["tokens"]) == len(set(vocab["tokens"])) == 262144
    assert vocab["tokens"][600] == "<unused600>" and vocab["types"][600] == to_gguf.UNUSED


def test_a_vocabulary_past_the_config_is_refused(tmp_path):
    text = checkpoints.tiny("causal") / "text"
    shutil.copy(text / "tokenizer.json", tmp_path)
    config = json.loads((text / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    with pytest.raises(ValueError, match="below vocab_size 100"):
        to_gguf.stand_in_vocab(tmp_path)


@pytest.mark.skipif(NO_PEER is not None, reason=f"llama.cpp not built: {NO_PEER}")
def test_llama_cpp_continues_the_trained_model_as_the_engine_does():
    """bf16 GGUF from the -text checkpoint, greedy from ids: the same 8 tokens and first top-1 as the engine."""
    text = checkpoints.trained("causal") / "text"
    tok = AutoTokenizer.from_pretrained(text)
    prompts = [prompting.record_question(tok, n, seed=100 + n)[0] for n in (3, 17, 29)]
    engine = torchtpu_rs.Engine(text, None, torch.zeros(1), 2048, "bfloat16")
    ours = [engine.generate(ids, 8)[0] for ids in prompts]
    first = np.stack([engine.logits(ids, [len(ids) - 1])[0].numpy() for ids in prompts])
    runs = against_peer.llama_runs(text, prompts, 8, 2048, quants=("bf16",))
    assert runs["bf16"]["tokens"] == ours
    assert (runs["bf16"]["logits"].argmax(-1) == first.argmax(-1)).all()
    assert np.abs(runs["bf16"]["logits"] - first).max() < 0.5  # bf16 roundings of two implementations
