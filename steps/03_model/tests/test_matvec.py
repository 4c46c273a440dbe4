"""A decode step's one-row linears on ATen's mat-vec or on oneDNN's (Transformers' kernel), by default the one
that streams faster on this kind of CPU: prompt reads are the same bits either way, a decode step's logits agree
to a bf16 rounding, and the trained model gives the same answers."""
import pytest
import torch
import torchtpu_rs
from torchtpu_rs import checkpoints, prompting, records
from transformers import AutoTokenizer

CTX = 256
IDS = [2] + [(7 * i + 3) % 500 + 3 for i in range(60)]


def engine(folder, dtype="bfloat16", **kw):
    return torchtpu_rs.Engine(folder / "text", folder / "emb4", torch.zeros(1), CTX, dtype, **kw)


def test_the_default_follows_this_cpu_and_bad_values_raise(tiny):
    # oneDNN's where it has a bf16 fast path on an Intel CPU; elsewhere ATen's (twice oneDNN's rate on an AMD EPYC,
    # and without the fast path oneDNN does not take a bf16 product at all)
    intel = records._cpuinfo("vendor_id") == "GenuineIntel"
    onednn = intel and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert engine(tiny).matvec == ("onednn" if onednn else "aten")
    assert engine(tiny, matvec="aten").matvec == "aten"
    assert engine(tiny, matvec="onednn").matvec == "onednn"
    for bad in ("mkldnn", "ATen", ""):
        with pytest.raises(ValueError, match="matvec"):
            engine(tiny, matvec=bad)


def decode_logits(eng, steps: int) -> torch.Tensor:
    stream = eng.stream(IDS, steps)
    list(stream)
    return stream.last_logits()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_only_decode_steps_change_and_only_by_a_rounding(tiny, dtype):
    aten, onednn = engine(tiny, dtype), engine(tiny, dtype, matvec="onednn")
    assert torch.equal(aten.logits(IDS), onednn.logits(IDS)), "a prompt read keeps oneDNN"
    a, o = decode_logits(aten, 4), decode_logits(onednn, 4)
    # bf16 rounds each product's output to 8 bits; the logits differ by at most a few such steps
    bound = a.abs().max().item() * (2 ** -6 if dtype == "bfloat16" else 1e-5)
    assert (a - o).abs().max().item() <= bound


def test_the_trained_model_answers_the_same_either_way():
    folder = checkpoints.trained("causal")
    tokenizer = AutoTokenizer.from_pretrained(folder / "text")
    prompt = ("Record 1: code 482913. Record 2: code 705126. Record 3: code 610395. "
              "What is the code of record 2? Answer:")
    ids = prompting.encode(tokenizer, prompt)
    answers = set()
    for matvec in ("aten", "onednn"):
        eng = torchtpu_rs.Engine(folder / "text", folder / "emb4", torch.zeros(1), 2048, matvec=matvec)
        tokens, _, _ = eng.generate(ids, 16, stop=prompting.eos_ids(folder / "text"))
        answers.add(tokenizer.decode(prompting.until_stop(tokens, prompting.eos_ids(folder / "text")),
                                     skip_special_tokens=True))
    assert answers == {" 705126"}


def test_torchs_onednn_switch_is_left_as_it_was(tiny):
    """The engine flips torch's process-wide switch around each one-row linear; whatever the caller had set
    survives a generation, a stream and a failed call."""
    eng = engine(tiny, matvec="aten")
    for setting in (True, False):
        torch.backends.mkldnn.enabled = setting
        try:
            eng.generate(IDS[:8], 4)
            list(eng.stream(IDS[:8], 3))
            with pytest.raises(ValueError):
                eng.generate(IDS[:8], CTX)  # over the context: refused
            assert torch.backends.mkldnn.enabled is setting
        finally:
            torch.backends.mkldnn.enabled = True
