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
