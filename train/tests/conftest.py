"""The trainer's modules live beside its scripts (train/), not in an installed package."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    from torchtpu_rs.checkpoints import write_tokenizer
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(folder)
    return AutoTokenizer.from_pretrained(folder)
