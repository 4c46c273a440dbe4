"""Fixtures shared by step 05's tests: the tiny checkpoints (step 03 makes them) and Transformers' reference."""
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
def ctx() -> int:
    """The tiny checkpoint's default context in every run.py."""
    return 2048


@pytest.fixture(scope="session")
def short_prompt() -> str:
    """One prompt chunk on the tiny model, so a compiled run makes two graphs (the chunk, the decode step):
    test_compile and test_run use it with the same checkpoint and dtype, so inductor compiles them once."""
    return "What is the code of record 17 ?"


@pytest.fixture(scope="session")
def hf_model():
    """A loader for the reference model: `hf_model(folder)`, float32."""
    return transformers_model
