"""The default model of steps 03-06 (trained on the records task): int4 against the bf16 path of the same files,
on record prompts — top-5 equal, KL <= 1e-3, the same greedy answer — and against Transformers in float32,
KL <= 1e-2. Skipped, saying why, while the trained model is not installed with torchtpu_rs."""
import random

import pytest
import torch
import torchtpu_int4
from torchtpu_rs import checkpoints, prompting
from torchtpu_rs.reference import transformers_model


def trained_or_skip(layout):
    try:
        return checkpoints.trained(layout)
    except (FileNotFoundError, AttributeError) as e:
        pytest.skip(f"the trained default model is not installed yet: {e}")


def record_prompt(tokenizer, n: int, seed: int):
    """Step 06's format: n records with distinct six-digit codes, a question about one; returns ids and code."""
    rng = random.Random(seed)
    codes = [str(c) for c in rng.sample(range(100000, 1000000), n)]
    asked = rng.randint(1, n)
    text = " ".join(f"Record {i}: code {c}." for i, c in enumerate(codes, 1))
    return prompting.encode(tokenizer, f"{text} What is the code of record {asked}? Answer:"), codes[asked - 1]


def kl(p_logits, q_logits) -> float:
    log_p, log_q = p_logits.double().log_softmax(-1), q_logits.double().log_softmax(-1)
    return float((log_p.exp() * (log_p - log_q)).sum())


@pytest.mark.parametrize("layout", ["causal", "multimodal"])
@pytest.mark.parametrize("twin", ["text", "emb4"])
def test_int4_answers_as_bf16_does(layout, twin):
    from transformers import AutoTokenizer

    folder = trained_or_skip(layout)
    emb4 = folder / "emb4" if twin == "emb4" else None
    tokenizer = AutoTokenizer.from_pretrained(folder / "text")
    int4 = torchtpu_int4.Engine(folder / "text", emb4, torch.empty(0), 2048, weights="int4")
    bf16 = torchtpu_int4.Engine(folder / "text", emb4, torch.empty(0), 2048, weights="bf16")
    hf = transformers_model(folder / twin)
    stop = prompting.eos_ids(folder / "text")
    for n in (1, 3, 9, 17, 30, 48):
        ids, code = record_prompt(tokenizer, n, seed=100 + n)
        a, b = int4.logits(ids, [len(ids) - 1])[0], bf16.logits(ids, [len(ids) - 1])[0]
        with torch.no_grad():
            want = hf(torch.tensor([ids])).logits[0, -1].float()
        # the same five tokens; in the same order but where two of them are a near-tie (the emb4 twin's 4th and 5th
        # differ by 0.03 in bf16 logits, each about e^-12.5 as likely as the answer)
        ia, (vb, ib) = a.topk(5).indices, b.topk(5)
        assert set(ia.tolist()) == set(ib.tolist()), n
        swapped = ia != ib
        assert not swapped.any() or (b[ia[swapped]] - vb[swapped]).abs().max().item() <= 0.05, n
        assert kl(b, a) <= 1e-3, (n, kl(b, a))
        assert kl(want, a) <= 1e-2, (n, kl(want, a))
        tokens = int4.generate(ids, 10, stop=stop)[0]
        assert tokens == bf16.generate(ids, 10, stop=stop)[0], n
        assert tokenizer.decode(tokens, skip_special_tokens=True).strip() == code, n
