"""Fixtures shared by step 07's tests: step 03's tiny checkpoints and Transformers' reference model."""
from pathlib import Path

import pytest
from torchtpu_rs import checkpoints
from torchtpu_rs.reference import transformers_model


@pytest.fixture(scope="session")
def tiny() -> Path:
    """The tiny Gemma 4 checkpoint (causal layout): `text/` and its `emb4/` twin."""
    return checkpoints.tiny("causal")


@pytest.fixture(scope="session")
def tiny_multimodal() -> Path:
    return checkpoints.tiny("multimodal")


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
