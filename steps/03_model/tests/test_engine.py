"""The engine computes what Transformers computes, through its ring caches, for every checkpoint variant."""
import json
import threading

import pytest
import torch
import torchtpu_rs
from safetensors.torch import load_file
from torchtpu_rs import prompting

CTX = 2048


def variants(tiny, tiny_multimodal):
    """(name, engine model dir, engine emb4 dir, reference folder for Transformers)."""
    return [
        ("causal", tiny / "text", None, tiny / "text"),
        ("multimodal", tiny_multimodal / "text", None, tiny_multimodal / "text"),
        # with the twin, every table comes from it: the reference is Transformers on the twin's folder
        ("emb4", tiny / "text", tiny / "emb4", tiny / "emb4"),
    ]


@pytest.fixture(scope="module", params=["causal", "multimodal", "emb4"])
def variant(request, tiny, tiny_multimodal):
    return next(v for v in variants(tiny, tiny_multimodal) if v[0] == request.param)


def window(folder) -> int:
    return prompting.text_config(folder)["sliding_window"]


def test_layout_follows_the_config(tiny):
    config = json.loads((tiny / "text" / "config.json").read_text())
    types = config["layer_types"]
    owners = types[: len(types) - config["num_kv_shared_layers"]]
    want = (owners.count("full_attention"), owners.count("sliding_attention"), config["num_kv_shared_layers"],
            2 * config["sliding_window"])
    engine = torchtpu_rs.Engine(tiny / "text", None, torch.zeros(1), CTX, "float32")
    assert engine.layout() == torchtpu_rs.layout_for(tiny / "text" / "config.json", CTX) == want


def test_layout_for_the_real_e2b_config(tmp_path):
    """The real gemma-4-E2B text config (key layout of the published config.json): no weights needed."""
    e2b = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": {
            "hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 35, "num_attention_heads": 8,
            "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": None,
            "hidden_size_per_layer_input": 256, "vocab_size": 262144, "vocab_size_per_layer_input": 262144,
            "num_kv_shared_layers": 20, "use_double_wide_mlp": True, "attention_k_eq_v": False,
            "sliding_window": 512, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
            "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0},
            },
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(e2b))
    assert torchtpu_rs.layout_for(tmp_path / "config.json", 33024) == (3, 12, 20, 1024)


def teacher_forced(model, ids):
    """Transformers' logits for every position of `ids`, without a cache (one full forward)."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def greedy_no_cache(model, prompt, n):
    """Transformers' greedy tokens, each from a full forward over everything so far (no cache at all)."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def test_chunked_read_through_wrapping_rings_matches_transformers(variant, hf_model):
    name, model, emb4, reference = variant
    w = window(model)
    ids = [2] + [(7 * i + 3) % 500 + 3 for i in range(9 * w)]  # 9 windows: every ring wraps several times
    engine = torchtpu_rs.Engine(model, emb4, torch.zeros(1), CTX, "float32")
    ours = engine.logits(ids)
    want = teacher_forced(hf_model(reference), ids)
    assert ours.shape == want.shape
    assert (ours - want).abs().max().item() < 1e-3, name


def test_generate_float32_tokens_equal_transformers_without_cache(variant, hf_model):
    name, model, emb4, reference = variant
    prompt = [2, 17, 250, 33, 480, 5, 99, 301]
    engine = torchtpu_rs.Engine(model, emb4, torch.zeros(1), CTX, "float32")
    tokens, read_s, decode_s = engine.generate(prompt, 64)
    assert len(tokens) == 64 and read_s > 0 and decode_s > 0
    assert tokens == greedy_no_cache(hf_model(reference), prompt, 64), name
    assert len(set(tokens)) >= 32, "the tiny model should not collapse into repetition"


def test_generate_is_deterministic_and_read_every_changes_nothing(tiny):
    engine = torchtpu_rs.Engine(tiny / "text", tiny / "emb4", torch.zeros(1), CTX)
    prompt = [2, 40, 41, 42]
    first = engine.generate(prompt, 20)[0]
    assert engine.generate(prompt, 20, read_every=8)[0] == first
    assert engine.generate(prompt, 20, read_every=100)[0] == first
    assert engine.generate(prompt, 0)[0] == []


def first_new(tokens, after=3):
    """An index k >= after whose token does not occur before it: a stop on it ends generation right there."""
    return next(k for k in range(after, len(tokens)) if tokens[k] not in tokens[:k])


def test_generate_ends_after_the_first_stop_token(tiny):
    engine = torchtpu_rs.Engine(tiny / "text", None, torch.zeros(1), CTX, "float32")
    prompt = [2, 40, 41, 42]
    full, _, full_decode_s = engine.generate(prompt, 128)
    k = first_new(full)
    tokens, read_s, decode_s = engine.generate(prompt, 128, stop=[full[k]])
    assert tokens == full[: k + 1]  # the stop token is the last one returned
    assert read_s > 0 and 0 < decode_s < full_decode_s / 2, "decode_s times only the k steps made, not 127"
    assert engine.generate(prompt, 128, read_every=8, stop=(full[k], 0))[0] == tokens  # seen at a later read
    assert engine.generate(prompt, 128, stop={full[0]})[0] == full[:1]  # the prompt read's token stops it too
    never = next(t for t in range(3, 500) if t not in full)
    assert engine.generate(prompt, 128, stop=[never])[0] == full
    assert engine.generate(prompt, 128, stop=[])[0] == full
    assert engine.generate(prompt, 0, stop=[full[0]])[0] == []


@pytest.mark.parametrize("stop, error", [
    (5, TypeError), ("ab", TypeError), ({5: 1}, TypeError), ([1.5], TypeError), ([2, None], TypeError),
    ([-1], ValueError), ([3, 512], ValueError),
])
def test_bad_stop_ids_raise_naming_stop(tiny, stop, error):
    engine = torchtpu_rs.Engine(tiny / "text", None, torch.zeros(1), 64, "float32")
    with pytest.raises(error, match="^stop: "):
        engine.generate([2, 3], 4, stop=stop)


def test_logits_at_chosen_positions(tiny):
    engine = torchtpu_rs.Engine(tiny / "text", None, torch.zeros(1), CTX, "float32")
    ids = list(range(2, 60))
    every = engine.logits(ids)
    some = engine.logits(ids, positions=[57, 0, 20])
    assert some.dtype == torch.float32 and torch.equal(some, every[[57, 0, 20]])


def test_hidden_states_follow_transformers_convention(tiny, hf_model):
    ids = list(range(2, 42))
    engine = torchtpu_rs.Engine(tiny / "text", None, torch.zeros(1), CTX, "float32")
    ours = engine.hidden_states(ids)
    with torch.no_grad():
        theirs = hf_model(tiny / "text")(torch.tensor([ids]), output_hidden_states=True).hidden_states
    assert len(ours) == len(theirs) == json.loads((tiny / "text" / "config.json").read_text())["num_hidden_layers"] + 1
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert (a.float() - b[0].float()).abs().max().item() < 1e-3, f"hidden state {i}"


def test_a_call_from_another_thread_is_refused(tiny):
    engine = torchtpu_rs.Engine(tiny / "text", None, torch.zeros(1), CTX)
    caught = []

    def other():
        try:
            engine.generate([2, 3], 2)
        except RuntimeError as e:
            caught.append(str(e))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert caught and "thread" in caught[0]
    assert len(engine.generate([2, 3], 2)[0]) == 2  # the owner can still use it


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_twenty_generate_calls_do_not_grow_memory(tiny):
    engine = torchtpu_rs.Engine(tiny / "text", tiny / "emb4", torch.zeros(1), CTX)
    for _ in range(5):  # warm up allocator caches
        engine.generate([2, 5, 6, 7], 16)
    before = rss_bytes()
    for _ in range(20):
        engine.generate([2, 5, 6, 7], 16)
    assert rss_bytes() - before < 8 * 2**20


def test_memory_itemizes_what_the_engine_holds(tiny):
    """`memory()` counts the bytes held by part: the linears as dequantized (a bf16 or float32 value a weight),
    the tables as stored (the twin's packed, byte for byte), a head tied to the table counted once, the caches."""
    config = prompting.text_config(tiny / "text")
    stored, twin = load_file(tiny / "text" / "model.safetensors"), load_file(tiny / "emb4" / "model.safetensors")
    layers, shared = config["num_hidden_layers"], config["num_kv_shared_layers"]

    def owns_its_cache(name):  # a KV-shared layer has no k/v projections of its own
        return not (name.endswith(("k_proj", "v_proj")) and int(name.split(".")[2]) >= layers - shared)

    linears = [name.removesuffix(".weight_shape") for name in stored if name.endswith(".weight_shape")]
    weights = sum(int(stored[f"{n}.weight_shape"].prod()) for n in linears if owns_its_cache(n))

    def nbytes(*tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    engine = torchtpu_rs.Engine(tiny / "text", None, torch.zeros(1), CTX)
    held = engine.memory()
    assert list(held) == ["linears", "head", "embed_tokens", "embed_tokens_per_layer", "norms and scalars",
                          "kv caches"]
    assert held["linears"] == 2 * weights
    # tied: in bf16 the head is the stored table itself; in float32 it is the table cast, a copy
    assert held["head"] == 0 and held["embed_tokens"] == nbytes(stored["model.embed_tokens.weight"])
    assert held["embed_tokens_per_layer"] == nbytes(stored["model.embed_tokens_per_layer.weight"])
    in_float32 = torchtpu_rs.Engine(tiny / "text", None, torch.zeros(1), CTX, "float32").memory()
    assert in_float32["linears"] == 4 * weights and in_float32["head"] == 2 * held["embed_tokens"]
    # the twin's tables stay packed; its head (untied, packed) is dequantized once
    with_twin = torchtpu_rs.Engine(tiny / "text", tiny / "emb4", torch.zeros(1), CTX).memory()
    table = "model.embed_tokens_per_layer"
    assert with_twin["embed_tokens_per_layer"] == nbytes(twin[f"{table}.weight_packed"], twin[f"{table}.weight_scale"])
    assert with_twin["head"] == 2 * int(twin["lm_head.weight_shape"].prod())
    # keys and values of every layer that owns a cache, in the dtype attention computes in (bf16 by default, float32
    # on a CPU without bf16 matmul hardware: the engine says which), and the slot positions (int64) of both kinds
    ring = 2 * config["sliding_window"]
    owners = config["layer_types"][: layers - shared]
    full, sliding = owners.count("full_attention"), owners.count("sliding_attention")
    heads = config["num_key_value_heads"]
    kv_bytes = torch.empty(0, dtype=getattr(torch, engine.attention_dtype)).element_size()
    kv = 2 * kv_bytes * heads * (full * CTX * config["global_head_dim"] + sliding * ring * config["head_dim"])
    assert held["kv caches"] == kv + 8 * (CTX + ring)
