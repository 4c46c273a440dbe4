"""Fixtures shared by step 03's tests: the tiny checkpoints and Transformers' reference model."""
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

from torchtpu_rs import checkpoints


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


def transformers_model(folder: Path, dtype=torch.float32):
    """The reference: Transformers with eager attention, weights decompressed the way compressed-tensors
    does (`dequantize=True`; its default path rounds differently in float32)."""
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, attn_implementation="eager",
        quantization_config=CompressedTensorsConfig(dequantize=True)).eval()
