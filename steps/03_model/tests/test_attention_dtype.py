"""Attention in float32 where a CPU's bf16 matmul is slow: the default follows torch's answer for this CPU, a
bfloat16 engine with float32 attention stays as close to Transformers' float32 model as the bf16 one, and the
bf16 path (the one bit-identical to Transformers' bf16) stays selectable."""
import os
import subprocess
import sys

import pytest
import torch
import torchtpu_rs

CTX = 256
IDS = [2] + [(7 * i + 3) % 500 + 3 for i in range(60)]  # crosses the 16-token window several times


def engine(folder, dtype="bfloat16", **kw):
    return torchtpu_rs.Engine(folder / "text", folder / "emb4", torch.zeros(1), CTX, dtype, **kw)


def test_the_default_follows_this_cpu(tiny):
    fast_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert engine(tiny).attention_dtype == ("bfloat16" if fast_bf16 else "float32")
    assert engine(tiny, "float32").attention_dtype == "float32"
    assert engine(tiny, attention_dtype="float32").attention_dtype == "float32"
    assert engine(tiny, attention_dtype="bfloat16").attention_dtype == "bfloat16"


def test_the_default_is_float32_on_a_cpu_limited_to_avx2(tiny):
    # torch and oneDNN both honour these: the process sees this CPU as an AVX2-only one (and its decode steps keep
    # ATen's mat-vec: oneDNN takes no bf16 product there)
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    code = ("import torch, torchtpu_rs, sys; from pathlib import Path; t = Path(sys.argv[1]); "
            "e = torchtpu_rs.Engine(t / 'text', t / 'emb4', torch.zeros(1), 64, 'bfloat16'); "
            "print(torch.backends.cpu.get_cpu_capability(), e.attention_dtype, e.matvec)")
    out = subprocess.run([sys.executable, "-c", code, str(tiny)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["AVX2", "float32", "aten"]


def kl(want: torch.Tensor, got: torch.Tensor) -> float:
    p = want.log_softmax(-1)
    return (p.exp() * (p - got.float().log_softmax(-1))).sum(-1).mean().item()


def test_float32_attention_is_as_close_to_transformers_float32(tiny, hf_model):
    with torch.no_grad():
        want = hf_model(tiny / "emb4")(torch.tensor([IDS])).logits[0].float()
    bf16 = engine(tiny, attention_dtype="bfloat16").logits(IDS)
    f32 = engine(tiny, attention_dtype="float32").logits(IDS)
    assert not torch.equal(bf16, f32), "the two attention dtypes round differently"
    assert kl(want, f32) <= 1.1 * kl(want, bf16)
    assert (f32.argmax(-1) == want.argmax(-1)).float().mean() >= (bf16.argmax(-1) == want.argmax(-1)).float().mean()


def test_float32_attention_generates_and_bad_values_raise(tiny):
    tokens, _, _ = engine(tiny, attention_dtype="float32").generate(IDS[:20], 24)
    assert len(tokens) == 24
    for bad in ("half", "float16", ""):
        with pytest.raises(ValueError, match="attention_dtype"):
            engine(tiny, attention_dtype=bad)
    with pytest.raises(TypeError):
        engine(tiny, attention_dtype=32)
