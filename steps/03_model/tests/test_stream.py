"""Decode over the visible bucket equals decode over all slots; prefill + the token iterator; sampling as
Transformers filters; bad arguments name themselves."""
import math

import pytest
import torch
import torchtpu_rs
from torchtpu_rs import _engine
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

CTX = 2048
PROMPT = [2, 17, 33, 101, 7, 250, 3, 88, 41, 12]  # 10 tokens; the tiny model's chunk (window) is 16


def engine(tiny, dtype="bfloat16", decode_slots=None, twin=False):
    return torchtpu_rs.Engine(tiny / "text", tiny / "emb4" if twin else None, torch.zeros(1), CTX, dtype,
                              decode_slots=decode_slots)


def decoded(e, n):
    """n greedy tokens and the logits each was picked from."""
    stream = e.stream(PROMPT, n)
    tokens, logits = [], []
    for token in stream:
        tokens.append(token)
        logits.append(stream.last_logits().clone())
    return tokens, torch.stack(logits)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decode_over_the_bucket_equals_decode_over_all_slots(tiny, dtype):
    # positions 10 .. 79: the buckets of 16, 32, 64 and 128 slots, three boundaries crossed
    bucket, every = engine(tiny, dtype, "bucket"), engine(tiny, dtype, "all")
    assert (bucket.decode_slots, every.decode_slots) == ("bucket", "all")
    tokens, logits = decoded(bucket, 70)
    tokens_all, logits_all = decoded(every, 70)
    assert tokens == tokens_all
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert torch.equal(logits, logits_all), "bit for bit"
    else:
        # without AVX-512 MKL's float32 product (attention's there) sums a row of more slots in another order, the
        # extra ones masked to 0: a float32 rounding apart, which a bf16 logit carries as one last-bit step at most
        bound = logits_all.abs().max().item() * (2 ** -7 if dtype == "bfloat16" else 1e-6)
        assert (logits - logits_all).abs().max().item() <= bound
    assert bucket.generate(PROMPT, 70)[0] == every.generate(PROMPT, 70)[0] == tokens


def test_the_default_is_the_bucket_off_a_tpu(tiny):
    assert engine(tiny).decode_slots == "bucket"
    with pytest.raises(ValueError, match='decode_slots="some"'):
        engine(tiny, decode_slots="some")


def test_prefill_then_tokens_equals_generate_and_stops(tiny):
    e = engine(tiny, "float32")
    want = e.generate(PROMPT, 12)[0]
    logits = e.prefill(PROMPT)
    assert logits.shape == (e.logits(PROMPT, [len(PROMPT) - 1]).shape[1],)
    assert torch.equal(logits, e.logits(PROMPT, [len(PROMPT) - 1])[0])
    e.prefill(PROMPT)
    assert list(e.tokens(12)) == want
    stop = want[5]
    first = want.index(stop)
    assert list(e.stream(PROMPT, 12, stop=[stop])) == want[: first + 1]
    assert list(e.stream(PROMPT, 0)) == []


def test_another_call_ends_a_stream(tiny):
    e = engine(tiny, "float32")
    stream = e.stream(PROMPT, 10)
    next(stream)
    e.generate(PROMPT, 2)
    with pytest.raises(RuntimeError, match="another call"):
        next(stream)
    with pytest.raises(RuntimeError, match="prefill"):
        e.tokens(3)  # no prefill to continue from


def test_the_same_seed_gives_the_same_tokens(tiny):
    e = engine(tiny)
    def draws(seed):
        return list(e.stream(PROMPT, 30, temperature=1.3, top_k=50, top_p=0.95, seed=seed))
    assert draws(5) == draws(5)
    assert draws(5) != draws(6)
    assert list(e.stream(PROMPT, 30, temperature=1.0, seed=2**70)) == list(e.stream(PROMPT, 30, temperature=1.0,
                                                                                        seed=2**70))


SETTINGS = [
    dict(temperature=0.7),
    dict(temperature=1.0, top_k=1),
    dict(temperature=1.0, top_k=40),
    dict(temperature=1.5, top_p=0.9),
    dict(temperature=0.8, top_k=100, top_p=0.7),
    dict(temperature=1.0, top_p=1.0),
    dict(top_p=0.05),
]


def transformers_probs(logits, temperature=1.0, top_k=None, top_p=None):
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None and top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)


@pytest.mark.parametrize("kw", SETTINGS, ids=str)
def test_the_filtered_distribution_is_transformers(kw):
    logits = torch.randn(3, 512, generator=torch.Generator().manual_seed(0)) * 3
    want = transformers_probs(logits, **kw)
    got = _engine.filtered_probs(logits, **kw)
    assert (got - want).abs().max().item() <= 1e-6
    assert torch.equal(got > 0, want > 0), "the same tokens kept"


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.9, top_k=8, top_p=0.8)], ids=str)
def test_the_draws_follow_the_filtered_distribution(kw):
    """Pearson's chi-square over the kept tokens (those expected 5+ times pooled): p > 1e-4 for a fixed seed."""
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(1)) * 2
    probs = transformers_probs(logits, **kw)[0].double()
    n = 40_000
    draws = _engine.sample(logits, n, 1234, **kw)
    counts = torch.bincount(torch.tensor(draws), minlength=64).double()
    assert counts[probs == 0].sum() == 0, "a filtered-out token was drawn"
    expected = probs * n
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    expect = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = expect > 0
    chi2 = (((observed - expect) ** 2) / expect)[keep].sum().item()
    dof = int(keep.sum()) - 1
    # Wilson-Hilferty: the chi-square quantile for p = 1e-4 (z = 3.719)
    limit = dof * (1 - 2 / (9 * dof) + 3.719 * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < limit, (chi2, dof, limit)


@pytest.mark.parametrize("kw, error, words", [
    (dict(temperature=0.0), ValueError, "temperature=0"),
    (dict(temperature=-1.0), ValueError, "temperature=-1"),
    (dict(top_k=0), ValueError, "top_k=0"),
    (dict(top_k=2.5), TypeError, "top_k"),
    (dict(top_p=0.0), ValueError, "top_p=0"),
    (dict(top_p=1.5), ValueError, "top_p=1.5"),
    (dict(temperature="hot"), TypeError, "temperature"),
    (dict(temperature=1.0, seed="x"), TypeError, "seed"),
    (dict(temperature=1.0, seed=1.5), TypeError, "seed"),
    (dict(stop=[10**9]), ValueError, "stop"),
    (dict(stop=5), TypeError, "stop"),
    (dict(max_new=-1), ValueError, "max_new=-1"),
    (dict(max_new=CTX), ValueError, "max_new"),
    (dict(max_new=2**63 - 1), ValueError, "max_new"),
])
def test_bad_arguments_raise_naming_the_argument(tiny, kw, error, words):
    e = engine(tiny, "float32")
    kw = {"max_new": 4, **kw}
    with pytest.raises(error, match=words):
        e.stream(PROMPT, **kw)
    e.prefill(PROMPT)
    with pytest.raises(error, match=words):
        e.tokens(**kw)
    assert list(e.stream(PROMPT, 3)) == e.generate(PROMPT, 3)[0], "usable afterwards"


def test_a_bad_max_new_leaves_the_prefill_for_the_next_call(tiny):
    e = engine(tiny, "float32")
    e.prefill(PROMPT)
    with pytest.raises(ValueError, match="max_new=-1"):
        e.tokens(max_new=-1)
    assert list(e.tokens(max_new=3)) == e.generate(PROMPT, 3)[0]
