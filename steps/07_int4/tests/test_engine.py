"""Step 07's Engine: step 03's contract plus `weights=`; int4 and bf16 answers agree, and both agree with
Transformers, on the tiny random checkpoints of every variant."""
import json
import shutil
import threading

import pytest
import torch
import torchtpu_int4
from safetensors.torch import load_file, save_file
from torchtpu_rs import checkpoints
from torchtpu_rs.prompting import same_prefix

CTX = 2048
PROMPTS = [[2, 17, 250, 33, 480, 5, 99, 301], [2] + [(7 * i + 3) % 500 + 3 for i in range(200)]]
LONG = [2] + [(7 * i + 3) % 500 + 3 for i in range(255)]  # two chunks of 128 with a window of 128


def cpu():
    return torch.empty(0)


def test_auto_takes_int4_on_the_cpu_in_bfloat16_and_says_so(tiny):
    engine = torchtpu_int4.Engine(tiny / "text", tiny / "emb4", cpu(), CTX)
    assert engine.weights == "int4"
    assert engine.weights_reason == "auto: int4 runs on this device, multiplied by aten::_weight_int4pack_mm_for_cpu"
    assert "weights=int4" in repr(engine)
    assert torchtpu_int4.int4_kernel(cpu()) == (True, "aten::_weight_int4pack_mm_for_cpu runs on this device")


def test_float32_auto_keeps_step_03s_weights_and_int4_can_be_forced(tiny, kl):
    """In float32 the kernel takes a scalar loop on x86: auto keeps the dequantized weights; "int4" forces the
    kernel, with float32 scales, and its answer stays next to the dequantized float32 one."""
    auto = torchtpu_int4.Engine(tiny / "text", None, cpu(), CTX, "float32")
    assert auto.weights == "bf16" and "scalar path" in auto.weights_reason
    forced = torchtpu_int4.Engine(tiny / "text", None, cpu(), CTX, "float32", weights="int4")
    assert forced.weights == "int4" and "float32" in forced.weights_reason
    a, b = forced.logits(PROMPTS[0], [7])[0], auto.logits(PROMPTS[0], [7])[0]
    assert kl(b, a) <= 1e-2 and a.argmax() == b.argmax()
    bf16 = torchtpu_int4.Engine(tiny / "text", None, cpu(), CTX, weights="bf16")
    assert bf16.weights == "bf16" and "step 03" in bf16.weights_reason


def test_int4_where_the_kernel_does_not_run_names_the_op(tiny):
    """The meta device stands in for a device without the kernel (a TPU, a GPU: the op is CPU-only)."""
    meta = torch.empty(0, device="meta")
    ok, why = torchtpu_int4.int4_kernel(meta)
    assert not ok and "aten::_weight_int4pack_mm_for_cpu does not run on this device" in why
    with pytest.raises(NotImplementedError, match="weights=\"int4\": aten::_weight_int4pack_mm_for_cpu does not run"):
        torchtpu_int4.Engine(tiny / "text", None, meta, CTX, weights="int4")


def test_bad_weights_argument(tiny):
    with pytest.raises(ValueError, match='weights="int8": use "int4", "bf16" or "auto"'):
        torchtpu_int4.Engine(tiny / "text", None, cpu(), CTX, weights="int8")
    with pytest.raises(TypeError):
        torchtpu_int4.Engine(tiny / "text", None, cpu(), CTX, weights=4)


def test_weights_held_4_bit_read_a_third_of_the_bytes(tiny):
    int4 = torchtpu_int4.Engine(tiny / "text", tiny / "emb4", cpu(), CTX, weights="int4")
    bf16 = torchtpu_int4.Engine(tiny / "text", tiny / "emb4", cpu(), CTX, weights="bf16")
    assert int4.weight_bytes_per_token() < 0.35 * bf16.weight_bytes_per_token()


def test_memory_is_itemized_and_int4_leaves_the_per_layer_table_in_the_file(tiny):
    """`memory()` names each part held; with int4 linears the per-layer table (the largest, one row read per
    token) stays in the mapped file, while the bf16 path holds it packed, byte for byte as stored."""
    int4 = torchtpu_int4.Engine(tiny / "text", tiny / "emb4", cpu(), CTX, weights="int4").memory()
    bf16 = torchtpu_int4.Engine(tiny / "text", tiny / "emb4", cpu(), CTX, weights="bf16").memory()
    parts = ["linears", "head", "embed_tokens", "embed_tokens_per_layer", "norms and scalars", "kv caches"]
    assert list(int4) == list(bf16) == parts
    stored = load_file(tiny / "emb4" / "model.safetensors")
    table = sum(t.numel() * t.element_size() for name, t in stored.items()
                if name.endswith(("embed_tokens_per_layer.weight_packed", "embed_tokens_per_layer.weight_scale")))
    assert int4["embed_tokens_per_layer"] == 0 and bf16["embed_tokens_per_layer"] == table
    assert 0 < int4["linears"] < 0.35 * bf16["linears"]
    assert int4["kv caches"] == bf16["kv caches"] > 0


def regroup(folder, group):
    """The checkpoint repacked with another group size (compressed-tensors' scheme, the project's packer)."""
    tensors = load_file(folder / "model.safetensors")
    for name in [k for k in tensors if k.endswith(".weight_packed")]:
        p = name.removesuffix(".weight_packed")
        packed, scale = tensors[f"{p}.weight_packed"], tensors[f"{p}.weight_scale"]
        cols = int(tensors[f"{p}.weight_shape"][1])
        nibbles = ((packed.unsqueeze(-1) >> torch.arange(0, 32, 4, dtype=torch.int32)) & 0xF).flatten(-2)[:, :cols]
        w = ((nibbles - 8).to(scale.dtype).unflatten(-1, (-1, 32)) * scale.unsqueeze(-1)).flatten(-2)
        tensors.update({f"{p}.{k}": v for k, v in checkpoints.pack_w4(w, group, scale.dtype).items()})
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    for scheme in config["quantization_config"]["config_groups"].values():
        scheme["weights"]["group_size"] = group
    (folder / "config.json").write_text(json.dumps(config))


def test_a_group_size_the_kernel_does_not_take(tiny, tmp_path):
    """Groups of 16: "int4" refuses it, naming the tensor and the constraint; "auto" holds those matrices bf16
    and says which; "bf16" reads it as step 03 does."""
    folder = tmp_path / "g16"
    shutil.copytree(tiny / "text", folder)
    regroup(folder, 16)
    with pytest.raises(NotImplementedError, match=r"tensor model\.\S+_proj\S* in .*: group_size 16: "
                                                  r"the int4 kernel takes groups of 32, 64, 128 or"):
        torchtpu_int4.Engine(folder, None, cpu(), CTX, weights="int4")
    auto = torchtpu_int4.Engine(folder, None, cpu(), CTX)
    assert auto.weights == "int4" and "held bf16" in auto.weights_reason and "q_proj" in auto.weights_reason
    bf16 = torchtpu_int4.Engine(folder, None, cpu(), CTX, weights="bf16")
    assert torch.equal(auto.logits(PROMPTS[0]), bf16.logits(PROMPTS[0]))


def test_a_tied_head_the_kernel_does_not_take(tiny, tmp_path):
    """The emb4 twin's embedding table as the tied head, in groups of 16: "auto" holds it bf16 and says so, as it
    does a linear, where it once failed to load; "int4" refuses the twin."""
    twin = tmp_path / "emb4"
    shutil.copytree(tiny / "emb4", twin)
    regroup(twin, 16)
    config = json.loads((twin / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (twin / "config.json").write_text(json.dumps(config))
    with pytest.raises(NotImplementedError, match="group_size 16: the int4 kernel takes groups of 32"):
        torchtpu_int4.Engine(tiny / "text", twin, cpu(), CTX, weights="int4")
    auto = torchtpu_int4.Engine(tiny / "text", twin, cpu(), CTX)
    assert auto.weights == "int4" and "held bf16: [\"the tied head (embed_tokens)\"]" in auto.weights_reason
    bf16 = torchtpu_int4.Engine(tiny / "text", twin, cpu(), CTX, weights="bf16")
    assert auto.memory()["head"] == bf16.memory()["head"] > 0, "the head dense, as weights=\"bf16\" holds it"
    assert len(auto.generate(PROMPTS[0], 4)[0]) == 4


def test_a_checkpoint_that_is_not_pack_quantized(tiny, tmp_path):
    folder = tmp_path / "fq"
    shutil.copytree(tiny / "text", folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["format"] = "float-quantized"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(NotImplementedError, match='format "float-quantized": only pack-quantized'):
        torchtpu_int4.Engine(folder, None, cpu(), CTX)


def variants(tiny, tiny_multimodal):
    """(name, engine model dir, engine emb4 dir, reference folder for Transformers)."""
    return [("causal", tiny / "text", None, tiny / "text"),
            ("multimodal", tiny_multimodal / "text", None, tiny_multimodal / "text"),
            ("emb4", tiny / "text", tiny / "emb4", tiny / "emb4")]


@pytest.fixture(scope="module", params=["causal", "multimodal", "emb4"])
def variant(request, tiny, tiny_multimodal):
    return next(v for v in variants(tiny, tiny_multimodal) if v[0] == request.param)


# --8<-- [start:parity]
def test_int4_and_bf16_agree_and_both_agree_with_transformers(variant, hf_model, kl, top5_agree):
    """On the tiny random models (near-uniform logits, the worst case for agreement), in bf16 arithmetic: the same
    five next tokens; the next-token KL of int4 against Transformers in float32 under 1e-2, where the bf16 path
    itself sits at the same distance, and against the bf16 path of the same files under 1.5e-2. (Measured: 2e-3 to
    7e-3 against bf16: the bf16 roundings of every activation, not the weights, make most of it — see the float32
    test below.)"""
    name, model, emb4, reference = variant
    int4 = torchtpu_int4.Engine(model, emb4, cpu(), CTX, weights="int4")
    bf16 = torchtpu_int4.Engine(model, emb4, cpu(), CTX, weights="bf16")
    hf = hf_model(reference)
    for ids in PROMPTS:
        last = [len(ids) - 1]
        a, b = int4.logits(ids, last)[0], bf16.logits(ids, last)[0]
        with torch.no_grad():
            want = hf(torch.tensor([ids])).logits[0, -1].float()
        assert top5_agree(a, b), (name, a.topk(5), b.topk(5))
        assert kl(b, a) <= 1.5e-2, (name, kl(b, a))
        assert kl(want, a) <= 1e-2, (name, kl(want, a))
        assert kl(want, a) <= 3 * max(kl(want, b), 1e-3), (name, kl(want, a), kl(want, b))
    if emb4 is None:  # greedy text: the same start (near-ties of a random model part it later, at 23 of 32 here)
        same = same_prefix(int4.generate(PROMPTS[1], 32)[0], bf16.generate(PROMPTS[1], 32)[0])
        assert same >= 8, (name, same)


def test_in_float32_arithmetic_int4_is_within_1e_3_of_bf16(variant, kl):
    """With float32 arithmetic the two paths differ only in their weights — q · scale exact (the int4 kernel) or
    rounded once to bf16 (compressed-tensors' dequantization) — and on the tiny random models the next-token KL
    stays under 1e-3, a tenth of what the same weights give in bf16 arithmetic. (Two near-tied tokens of the
    five most likely may swap places here: the top-5 test is the bf16 one above.)"""
    name, model, emb4, _ = variant
    int4 = torchtpu_int4.Engine(model, emb4, cpu(), CTX, "float32", weights="int4")
    bf16 = torchtpu_int4.Engine(model, emb4, cpu(), CTX, "float32", weights="bf16")
    assert (int4.weights, bf16.weights) == ("int4", "bf16")
    for ids in PROMPTS:
        last = [len(ids) - 1]
        a, b = int4.logits(ids, last)[0], bf16.logits(ids, last)[0]
        assert kl(b, a) <= 1e-3, (name, kl(b, a))
# --8<-- [end:parity]


@pytest.mark.parametrize("attention_dtype", [None, "float32"])
def test_the_bf16_path_is_step_03s(tiny, attention_dtype):
    """weights="bf16" is step 03's engine, bit for bit (its logits and tokens equal torchtpu_rs's), with either
    attention dtype."""
    import torchtpu_rs

    ours = torchtpu_int4.Engine(tiny / "text", tiny / "emb4", cpu(), CTX, weights="bf16",
                                attention_dtype=attention_dtype)
    theirs = torchtpu_rs.Engine(tiny / "text", tiny / "emb4", cpu(), CTX, attention_dtype=attention_dtype)
    assert ours.attention_dtype == theirs.attention_dtype
    assert torch.equal(ours.logits(PROMPTS[1]), theirs.logits(PROMPTS[1]))
    assert ours.generate(PROMPTS[0], 24)[0] == theirs.generate(PROMPTS[0], 24)[0]


def test_generate_contract_holds_in_int4(tiny):
    engine = torchtpu_int4.Engine(tiny / "text", None, cpu(), CTX, weights="int4")
    prompt = [2, 40, 41, 42]
    tokens, read_s, decode_s = engine.generate(prompt, 20)
    assert len(tokens) == 20 and read_s > 0 and decode_s > 0
    assert engine.generate(prompt, 20, read_every=8)[0] == tokens
    assert engine.generate(prompt, 20, stop=[tokens[5]])[0] == tokens[: tokens.index(tokens[5]) + 1]
    assert len(engine.hidden_states(prompt)) == 11 and engine.logits(prompt).shape == (4, 512)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([2, 99999], 4)
    with pytest.raises(ValueError, match="max_new"):
        engine.generate(prompt, CTX)
    with pytest.raises(ValueError, match="max_new"):  # not a sum that wraps past 2^63 and runs on forever
        engine.generate(prompt, 2**63 - 1)
    errors = []
    worker = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, engine.layout)))
    worker.start()
    worker.join()
    assert errors and "thread" in str(errors[0].value)


def test_streaming_sampling_and_decode_slots_hold_in_int4(tiny):
    """Step 03's prefill, token stream, sampling and decode_slots, unchanged with 4-bit linears."""
    bucket = torchtpu_int4.Engine(tiny / "text", tiny / "emb4", cpu(), CTX, weights="int4", decode_slots="bucket")
    every = torchtpu_int4.Engine(tiny / "text", tiny / "emb4", cpu(), CTX, weights="int4", decode_slots="all")
    prompt = PROMPTS[0]
    greedy = bucket.generate(prompt, 24)[0]
    assert list(bucket.stream(prompt, 24)) == greedy == list(every.stream(prompt, 24))
    last = bucket.logits(prompt, [len(prompt) - 1])[0]
    assert torch.equal(bucket.prefill(prompt), last)
    assert list(bucket.tokens(10, stop=[greedy[3]])) == greedy[: greedy.index(greedy[3]) + 1]
    def draws(seed):
        return list(bucket.stream(prompt, 20, temperature=1.3, top_k=50, top_p=0.95, seed=seed))
    assert draws(5) == draws(5) != draws(6)


