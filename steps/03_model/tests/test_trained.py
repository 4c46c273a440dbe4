"""The model step 03 ships: trained here on the records task, exported in both twins and both layouts. It loads
everywhere and answers record questions right, through Transformers and through the engine."""

import pytest
import torch
import torchtpu_rs
from torchtpu_rs import checkpoints, prompting
from torchtpu_rs.reference import transformers_model
from transformers import AutoTokenizer

RECORDS = (1, 3, 9, 17, 30, 48)  # context sizes inside the training range (1..48 records)


@pytest.fixture(scope="module")
def prompts():
    tokenizer = AutoTokenizer.from_pretrained(checkpoints.trained() / "text")
    return tokenizer, [prompting.record_question(tokenizer, n, seed=100 + n) for n in RECORDS]


@pytest.mark.parametrize("layout", checkpoints.LAYOUTS)
@pytest.mark.parametrize("twin", ["text", "emb4"])
def test_transformers_answers(prompts, layout, twin):
    tokenizer, cases = prompts
    model = transformers_model(checkpoints.trained(layout) / twin)
    for ids, code in cases:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert tokenizer.decode(out[0, len(ids):], skip_special_tokens=True).strip() == code


@pytest.mark.parametrize("layout", checkpoints.LAYOUTS)
@pytest.mark.parametrize("emb4", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_engine_answers_and_stops(prompts, layout, emb4, dtype):
    tokenizer, cases = prompts
    folder = checkpoints.trained(layout)
    engine = torchtpu_rs.Engine(folder / "text", folder / "emb4" if emb4 else None, torch.empty(0), 2048, dtype)
    stop = prompting.eos_ids(folder / "text")
    assert stop == [tokenizer.eos_token_id]
    for ids, code in cases:
        tokens, _, _ = engine.generate(ids, 10, stop=stop)
        assert tokens[-1] in stop and len(tokens) == 8  # "▁", six digits, <eos>: it stops where the model stops
        assert tokenizer.decode(tokens, skip_special_tokens=True).strip() == code


def test_missing_files_say_so(monkeypatch, tmp_path):
    from torchtpu_rs.checkpoints import trained_model

    monkeypatch.setattr(trained_model, "SHIPPED", tmp_path)
    with pytest.raises(FileNotFoundError, match="trained model's files are missing"):
        checkpoints.trained("causal")
    with pytest.raises(ValueError, match="layout"):
        checkpoints.trained("sideways")
