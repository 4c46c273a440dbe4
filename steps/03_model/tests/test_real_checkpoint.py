"""The real gemma-4-E2B-it QAT repacks, when they are on this machine (they are not downloaded here).

    GEMMA4_E2B_TEXT=/path/to/…-w4a16-ct-text GEMMA4_E2B_EMB4=/path/to/…-text-emb4 python -m pytest steps/03_model
"""
import os
from pathlib import Path

import pytest
import torch
import torchtpu_rs

TEXT = os.environ.get("GEMMA4_E2B_TEXT")
EMB4 = os.environ.get("GEMMA4_E2B_EMB4")

pytestmark = pytest.mark.skipif(not TEXT, reason="GEMMA4_E2B_TEXT is not set: the real -text repack is not here")


def test_real_checkpoint_loads_and_agrees_with_transformers(hf_model):
    ctx = 4096
    engine = torchtpu_rs.Engine(Path(TEXT), Path(EMB4) if EMB4 else None, torch.zeros(1), ctx, "bfloat16")
    assert engine.layout() == (3, 12, 20, 1024)
    ids = [2, 818, 5279, 529, 7001, 563]  # <bos> and a few ordinary tokens
    ours = engine.logits(ids, positions=[len(ids) - 1])[0]
    with torch.no_grad():
        theirs = hf_model(Path(EMB4 or TEXT), torch.bfloat16)(torch.tensor([ids])).logits[0, -1].float()
    assert torch.equal(ours.topk(5).indices, theirs.topk(5).indices)
    tokens, _, _ = engine.generate(ids, 8)
    assert len(tokens) == 8
