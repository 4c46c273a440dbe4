"""The Python baseline computes what Transformers computes, through its ring caches, and stores its weights as the
Rust engine does; in float32 its greedy tokens equal the engine's."""
import json

import pytest
import torch
import torchtpu_rs
from torchtpu_rs import prompting
from torchtpu_ways.baseline import (
    Baseline,
    attention_dtype_default,
    decode_slots_default,
    decode_slots_for,
    linear,
    one_row_in_aten,
)
from torchtpu_ways.checkpoint import DenseTable, PackedTable

CTX = 2048


def variants(tiny, tiny_multimodal):
    """(name, model dir, emb4 dir, reference folder for Transformers): with the twin, every table comes from it,
    so the reference is Transformers on the twin's folder."""
    return {
        "text": (tiny / "text", None, tiny / "text"),
        "emb4": (tiny / "text", tiny / "emb4", tiny / "emb4"),
        "multimodal": (tiny_multimodal / "text", None, tiny_multimodal / "text"),
    }


@pytest.fixture(params=["text", "emb4", "multimodal"])
def variant(request, tiny, tiny_multimodal):
    return request.param, *variants(tiny, tiny_multimodal)[request.param]


def window(folder) -> int:
    return prompting.text_config(folder)["sliding_window"]


def greedy_no_cache(model, prompt, n):
    """Transformers' greedy tokens, each from a full forward over everything so far (no cache at all)."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def test_layout_is_the_engines(tiny):
    model = Baseline(tiny / "text", None, "cpu", CTX)
    assert model.layout() == torchtpu_rs.layout_for(tiny / "text" / "config.json", CTX)


def test_weights_are_stored_as_the_engine_stores_them(tiny):
    text = Baseline(tiny / "text", None, "cpu", CTX, "bfloat16")
    assert isinstance(text.embed_tokens, DenseTable) and text.embed_tokens.weight.dtype == torch.bfloat16
    # tied head: the embedding table itself, no second copy
    assert text.lm_head.data_ptr() == text.embed_tokens.weight.data_ptr()
    layer = text.layers[0]
    assert layer.attention.q_proj.dtype == torch.bfloat16 and layer.input_norm.weight.dtype == torch.float32
    assert text.layers[-1].attention.kv is None  # KV-shared layers hold no k/v projections

    emb4 = Baseline(tiny / "text", tiny / "emb4", "cpu", CTX, "float32")
    assert isinstance(emb4.embed_tokens, PackedTable) and isinstance(emb4.per_layer_inputs.table, PackedTable)
    assert emb4.per_layer_inputs.table.packed.dtype == torch.int32  # kept packed: only gathered rows unpack
    assert emb4.embed_tokens.scale.dtype == torch.float16  # the twin's scales, as stored
    assert emb4.lm_head.dtype == torch.float32  # the untied packed head, dequantized once


def test_teacher_forced_logits_through_wrapping_rings_match_transformers(variant, hf_model):
    name, model, emb4, reference = variant
    ids = [2] + [(7 * i + 3) % 500 + 3 for i in range(9 * window(model))]  # 9 windows: every ring wraps
    ours = Baseline(model, emb4, "cpu", CTX, "float32").logits(ids)
    with torch.no_grad():
        want = hf_model(reference)(torch.tensor([ids])).logits[0].float()
    assert ours.dtype == torch.float32 and ours.shape == want.shape
    assert (ours - want).abs().max().item() < 1e-3, name


@pytest.mark.parametrize("name", ["text", "emb4"])
def test_greedy_64_equals_transformers_without_cache(name, tiny, tiny_multimodal, hf_model):
    model, emb4, reference = variants(tiny, tiny_multimodal)[name]
    prompt = [2, 17, 250, 33, 480, 5, 99, 301]
    tokens, read_s, decode_s = Baseline(model, emb4, "cpu", CTX, "float32").generate(prompt, 64)
    assert len(tokens) == 64 and read_s > 0 and decode_s > 0
    assert tokens == greedy_no_cache(hf_model(reference), prompt, 64), name
    assert len(set(tokens)) >= 32, "the tiny model should not collapse into repetition"


@pytest.mark.parametrize("name", ["text", "emb4"])
def test_float32_tokens_equal_the_rust_engines(name, tiny, tiny_multimodal):
    model, emb4, _ = variants(tiny, tiny_multimodal)[name]
    prompt = [2] + list(range(40, 40 + 2 * window(model)))  # a prompt of three chunks
    engine = torchtpu_rs.Engine(model, emb4, torch.zeros(1), CTX, "float32")
    ours = Baseline(model, emb4, "cpu", CTX, "float32").generate(prompt, 64)[0]
    assert ours == engine.generate(prompt, 64)[0]


def test_a_sharded_checkpoint_reads_the_same(tiny, tmp_path):
    """Real repacks may come in shards with a `model.safetensors.index.json`: split the tiny one in two."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(tiny / "text" / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for n, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        file = f"model-{n + 1:05d}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, tmp_path / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text((tiny / "text" / "config.json").read_text())
    ids = list(range(2, 40))
    want = Baseline(tiny / "text", None, "cpu", CTX, "float32").logits(ids)
    assert torch.equal(Baseline(tmp_path, None, "cpu", CTX, "float32").logits(ids), want)


def test_read_every_changes_nothing_and_bad_input_raises(tiny):
    model = Baseline(tiny / "text", tiny / "emb4", "cpu", 64)
    prompt = [2, 40, 41, 42]
    first = model.generate(prompt, 20)[0]
    assert model.generate(prompt, 20, read_every=8)[0] == first
    assert model.generate(prompt, 20, read_every=100)[0] == first
    assert model.generate(prompt, 0)[0] == []
    assert torch.equal(model.logits(prompt, positions=[3, 0]), model.logits(prompt)[[3, 0]])
    for bad in ([], [2, 100000]):
        with pytest.raises(ValueError, match="ids"):
            model.generate(bad, 4)
    with pytest.raises(ValueError, match="max_new"):
        model.generate(prompt, 61)  # 4 + 61 > ctx 64
    with pytest.raises(ValueError, match="dtype"):
        Baseline(tiny / "text", None, "cpu", 64, "float16")


def test_generate_ends_after_the_first_stop_token_as_the_engine_does(tiny):
    model = Baseline(tiny / "text", None, "cpu", CTX, "float32")
    engine = torchtpu_rs.Engine(tiny / "text", None, torch.zeros(1), CTX, "float32")
    prompt = [2, 40, 41, 42]
    full, _, full_decode_s = model.generate(prompt, 128)
    k = next(k for k in range(3, len(full)) if full[k] not in full[:k])  # a token first made at step k
    tokens, read_s, decode_s = model.generate(prompt, 128, stop=[full[k]])
    assert tokens == full[: k + 1]  # the stop token is the last one returned
    assert read_s > 0 and 0 < decode_s < full_decode_s / 2, "decode_s times only the k steps made, not 127"
    assert tokens == engine.generate(prompt, 128, stop=[full[k]])[0]
    assert model.generate(prompt, 128, read_every=8, stop=(full[k], 0))[0] == tokens  # seen at a later read
    assert model.generate(prompt, 128, stop={full[0]})[0] == full[:1]
    assert model.generate(prompt, 128, stop=[next(t for t in range(3, 500) if t not in full)])[0] == full


@pytest.mark.parametrize("stop, error", [
    (5, TypeError), ("ab", TypeError), ({5: 1}, TypeError), ([1.5], TypeError), ([2, None], TypeError),
    ([-1], ValueError), ([3, 512], ValueError),
])
def test_bad_stop_ids_raise_naming_stop(tiny, stop, error):
    model = Baseline(tiny / "text", None, "cpu", 64, "float32")
    with pytest.raises(error, match="^stop: "):
        model.generate([2, 3], 4, stop=stop)


@pytest.mark.parametrize("emb4", [False, True])
def test_both_count_the_same_weight_bytes_per_token(tiny, emb4):
    twin = tiny / "emb4" if emb4 else None
    rust = torchtpu_rs.Engine(tiny / "text", twin, torch.zeros(1), 64, "bfloat16")
    python = Baseline(tiny / "text", twin, "cpu", 64, "bfloat16")
    assert rust.weight_bytes_per_token() == python.weight_bytes_per_token() > 0


PROMPT = [2, 17, 33, 101, 7, 250, 3, 88, 41, 12]  # 10 tokens; the tiny model's chunk (window) is 16


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decode_over_the_bucket_equals_decode_over_all_slots(tiny, dtype):
    """Tokens, and each decode step's logits bit for bit (a rounding apart without AVX-512), across the
    16/32/64/128-slot bucket boundaries; and the tokens, in either dtype, equal the Rust engine's with its default
    (bucket) decode."""
    runs = {}
    for decode_slots in ("bucket", "all"):
        model = Baseline(tiny / "text", None, "cpu", CTX, dtype, decode_slots=decode_slots)
        assert model.decode_slots == decode_slots
        tokens = model.generate(PROMPT, 70)[0]
        model.cache.clear()
        for chunk, pos, slots in model.chunks(PROMPT):
            model.forward(chunk, pos, slots)
        logits = []
        for n, token in enumerate(tokens[:-1]):
            p = len(PROMPT) + n
            slots = decode_slots_for(p, model.cfg.sliding_window, CTX, decode_slots)
            out = model.forward(torch.tensor([token]), torch.tensor([p]), slots)
            logits.append(model.head(out).float())
        runs[decode_slots] = tokens, torch.cat(logits)
    assert runs["bucket"][0] == runs["all"][0]
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert torch.equal(runs["bucket"][1], runs["all"][1])
    else:
        # without AVX-512 MKL's float32 product (attention's there) sums a row of more slots in another order, the
        # extra ones masked to 0: a float32 rounding apart, which a bf16 logit carries as one last-bit step at most
        bound = runs["all"][1].abs().max().item() * (2 ** -7 if dtype == "bfloat16" else 1e-6)
        assert (runs["bucket"][1] - runs["all"][1]).abs().max().item() <= bound
    engine = torchtpu_rs.Engine(tiny / "text", None, torch.zeros(1), CTX, dtype)
    assert engine.generate(PROMPT, 70)[0] == runs["bucket"][0]


def test_decode_slots_default_and_bad_values(tiny):
    assert decode_slots_default("cpu") == "bucket" and decode_slots_default("tpu:0") == "all"
    assert Baseline(tiny / "text", None, "cpu", CTX, "float32").decode_slots == "bucket"
    with pytest.raises(ValueError, match="decode_slots='some'"):
        Baseline(tiny / "text", None, "cpu", CTX, "float32", decode_slots="some")
    assert [decode_slots_for(p, 16, CTX, "bucket") for p in (0, 15, 16, 31, 32, 2047)] == [16, 16, 32, 32, 64, 2048]
    assert decode_slots_for(5, 16, CTX, "all") == CTX


@pytest.mark.parametrize("attention_dtype", ["bfloat16", "float32"])
def test_bf16_logits_equal_the_rust_engines_in_either_attention_dtype(tiny, attention_dtype):
    # the same operations in the same order: the same bits, with float32 attention too
    ids = [2] + [(7 * i + 3) % 500 + 3 for i in range(3 * window(tiny / "text"))]
    ours = Baseline(tiny / "text", tiny / "emb4", "cpu", CTX, "bfloat16", attention_dtype=attention_dtype)
    engine = torchtpu_rs.Engine(tiny / "text", tiny / "emb4", torch.zeros(1), CTX, "bfloat16",
                                attention_dtype=attention_dtype)
    assert ours.attention_dtype == getattr(torch, engine.attention_dtype)
    assert torch.equal(ours.logits(ids), engine.logits(ids))
    assert ours.generate(ids[:20], 24)[0] == engine.generate(ids[:20], 24)[0]


def test_attention_dtype_default_and_bad_values(tiny):
    fast_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert attention_dtype_default(torch.bfloat16, "cpu") == (torch.bfloat16 if fast_bf16 else torch.float32)
    assert attention_dtype_default(torch.float32, "cpu") == torch.float32
    assert attention_dtype_default(torch.bfloat16, "tpu:0") == torch.bfloat16
    with pytest.raises(ValueError, match="attention_dtype"):
        Baseline(tiny / "text", None, "cpu", CTX, attention_dtype="half")


def test_one_row_linears_leave_torchs_onednn_switch_as_it_was():
    """`linear` switches oneDNN off only for a one-row product inside `one_row_in_aten(True)`, then back."""
    w, x = torch.randn(256, 128, dtype=torch.bfloat16), torch.randn(1, 128, dtype=torch.bfloat16)
    want = x.float() @ w.float().T
    for setting in (True, False):
        torch.backends.mkldnn.enabled = setting
        try:
            with one_row_in_aten(True):
                got = linear(x, w)
                assert torch.backends.mkldnn.enabled is setting
            assert (got.float() - want).abs().max() <= want.abs().max() * 2 ** -7
        finally:
            torch.backends.mkldnn.enabled = True


def test_a_bad_matvec_is_refused_and_the_default_is_the_rust_engines(tiny):
    with pytest.raises(ValueError, match="matvec"):
        Baseline(tiny / "text", tiny / "emb4", "cpu", 64, matvec="mkldnn")
    # both ways decode on the same kernel unless told: the one that streams faster on this kind of CPU
    rust = torchtpu_rs.Engine(tiny / "text", tiny / "emb4", torch.zeros(1), 64)
    assert Baseline(tiny / "text", tiny / "emb4", "cpu", 64).matvec == rust.matvec
    assert Baseline(tiny / "text", tiny / "emb4", "cpu", 64, matvec="aten").matvec == "aten"
