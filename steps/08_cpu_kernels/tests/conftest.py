"""Fixtures shared by step 08's tests: step 03's tiny checkpoints and Transformers' reference model."""
from pathlib import Path

import pytest
import torchtpu_kernels
from torchtpu_rs import checkpoints
from torchtpu_rs.reference import transformers_model


@pytest.fixture(scope="session")
def tiny() -> Path:
    """The tiny Gemma 4 checkpoint (causal layout): `text/` and its `emb4/` twin."""
    return checkpoints.tiny("causal")


@pytest.fixture(scope="session")
def tiny_multimodal() -> Path:
    return checkpoints.tiny("multimodal")


# This step's own kernels, and why one does not run here: dot4 needs AVX512-BF16, fma4 AVX2, FMA and F16C, each with
# ATen allowed that ISA (under ATEN_CPU_CAPABILITY=avx2, as on an AVX2-only CPU, only fma4 runs) and dot4 oneDNN
# allowed AVX512-BF16 (under ONEDNN_MAX_CPU_ISA=AVX512_CORE, as on Skylake to Ice Lake, fma4 and fma16 run).
OWN = [pytest.param("dot4", marks=pytest.mark.skipif(not torchtpu_kernels.dot4_runs(), reason=(
           "torchtpu_dot4_mm does not run here (no AVX512-BF16, or ATen kept to AVX2, or oneDNN from AVX512-BF16)"))),
       pytest.param("fma4", marks=pytest.mark.skipif(not torchtpu_kernels.fma4_runs(), reason=(
           "torchtpu_fma4_mm does not run here (no AVX2, FMA and F16C)")))]


@pytest.fixture(scope="session", params=["aten", *OWN])
def matmul(request) -> str:
    """Each int4 kernel, as `Engine(int4_matmul=...)` and `Int4Linear(matmul=...)` name them."""
    return request.param


@pytest.fixture(scope="session", params=OWN)
def own(request) -> str:
    """Each of this step's own kernels that runs here."""
    return request.param


@pytest.fixture(scope="session")
def auto_kernel() -> str:
    """What int4_matmul="auto" takes here for bfloat16 on the CPU: dot4, else fma4, else ATen's."""
    return "dot4" if torchtpu_kernels.dot4_runs() else "fma4" if torchtpu_kernels.fma4_runs() else "aten"


@pytest.fixture(scope="session")
def hf_model():
    """A loader for the reference model: `hf_model(folder, dtype=torch.float32)`."""
    return transformers_model


def _kl(p_logits, q_logits) -> float:
    """KL(p || q) of two softmax distributions, in float64."""
    log_p, log_q = p_logits.double().log_softmax(-1), q_logits.double().log_softmax(-1)
    return float((log_p.exp() * (log_p - log_q)).sum())


def _top5_agree(a, b, near=0.125) -> bool:
    """The same five most likely next tokens, in the same order, except where `b` has a near-tie (logits within
    `near`: two bf16 steps at 8 to 16, probabilities within 13 %): two such may swap places, and a token tied with
    b's fifth may take its place. Both happen between two sums of the same products in another order on the tiny
    random models' crowded logits, where a next-token logit is 9.3125 one way and 9.375 the other."""
    ia, (vb, ib) = a.topk(5).indices, b.topk(5)
    fifth = vb[-1].item()
    if any(abs(b[t].item() - fifth) > near for t in set(ia.tolist()) ^ set(ib.tolist())):
        return False
    return all(abs(b[ia[i]].item() - vb[i].item()) <= near for i in (ia != ib).nonzero().flatten().tolist())


# The two comparisons test_engine and test_trained make, as fixtures: pytest's importlib mode (pyproject.toml)
# puts no test folder on sys.path, so a helper module here could not be imported by name.
@pytest.fixture(scope="session")
def kl():
    return _kl


@pytest.fixture(scope="session")
def top5_agree():
    return _top5_agree
