"""Step 03 checkpoints: the real formats bit for bit, the project's packer equal to compressed-tensors, the same
bytes for the same seed, a tokenizer with Gemma's ids, a cache that never shows half a checkpoint, and tiny models
whose greedy text varies."""
import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torchtpu_rs import checkpoints

PROMPT = [2, 17, 250, 33, 480, 5, 99, 301]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "per_layer_input_gate",
           "per_layer_projection", "per_layer_model_projection")
TABLES = ("embed_tokens", "embed_tokens_per_layer", "lm_head")  # packed, with F16 scales, in the emb4 twin only


@pytest.fixture(scope="session")
def made(tmp_path_factory):
    """make() of the tiny model, once per layout."""
    return {layout: checkpoints.make(tmp_path_factory.mktemp(layout) / "ckpt", "tiny", layout)
            for layout in checkpoints.LAYOUTS}


def load(folder: Path) -> dict:
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    return tensors


def unpack_w4(packed, scale, shape):
    """Element j of a row: int32 word j // 8, bits 4 * (j % 8) and up, stored as q + 8; W = q * scale, rounded once
    to the scale's dtype (what compressed-tensors' decompress computes)."""
    rows, cols = shape.tolist()
    nibbles = (packed.unsqueeze(-1) >> torch.arange(0, 32, 4, dtype=torch.int32)) & 0xF
    q = nibbles.reshape(rows, -1)[:, :cols] - 8
    return (q.to(scale.dtype).unflatten(-1, (scale.shape[-1], -1)) * scale.unsqueeze(-1)).flatten(-2)


def file_hashes(folder: Path) -> dict:
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("layout", checkpoints.LAYOUTS)
@pytest.mark.parametrize("twin", ["text", "emb4"])
def test_packed_tensors_are_what_compressed_tensors_decompresses(made, layout, twin):
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    folder = made[layout] / twin
    config = json.loads((folder / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    scheme = QuantizationScheme.model_validate(next(iter(groups.values())))
    tensors = load(folder)
    prefixes = [k.removesuffix(".weight_packed") for k in tensors if k.endswith(".weight_packed")]
    for p in prefixes:
        packed, scale, shape = (tensors[f"{p}.weight_{s}"] for s in ("packed", "scale", "shape"))
        want = PackedQuantizationCompressor.decompress(
            {"weight_packed": packed, "weight_scale": scale, "weight_shape": shape}, scheme)["weight"]
        assert torch.equal(unpack_w4(packed, scale, shape), want), p
        is_table = p.rsplit(".", 1)[-1] in TABLES
        assert scale.dtype == (torch.float16 if is_table else torch.bfloat16), p

    # what is packed: every linear of the text model; in the twin also both tables and the untied head
    kinds = {p.rsplit(".", 1)[-1] for p in prefixes}
    assert kinds == set(LINEARS) | (set(TABLES) if twin == "emb4" else set())
    tables = {k for k in tensors if k.endswith(("embed_tokens.weight", "embed_tokens_per_layer.weight"))}
    assert len(tables) == (0 if twin == "emb4" else 2) and all(tensors[k].dtype == torch.bfloat16 for k in tables)
    prefix = "model." if layout == "causal" else "model.language_model."
    assert all(k.startswith((prefix, "lm_head.")) for k in tensors)

    # the real config keys: global_head_dim, not transformers' per_layer_config; head untied in the twin only
    text = config.get("text_config", config)
    assert text["global_head_dim"] == checkpoints.TINY["global_head_dim"] and "per_layer_config" not in text
    assert text["tie_word_embeddings"] == config["tie_word_embeddings"] == (twin == "text")
    assert config["quantization_config"]["format"] == "pack-quantized" and config["dtype"] == "bfloat16"


@pytest.mark.parametrize("layout", checkpoints.LAYOUTS)
def test_twin_is_the_text_model_with_its_tables_packed(made, layout):
    """The emb4 twin is a full checkpoint: every other tensor equals the -text one; its untied head is the -text
    model's tied head (the embedding table), packed the same way."""
    text, emb4 = load(made[layout] / "text"), load(made[layout] / "emb4")
    prefix = "model." if layout == "causal" else "model.language_model."
    tables = [f"{prefix}embed_tokens", f"{prefix}embed_tokens_per_layer"]
    assert text.keys() - emb4.keys() == {f"{t}.weight" for t in tables}
    assert emb4.keys() - text.keys() == {f"{t}.weight_{s}" for t in [*tables, "lm_head"]
                                         for s in ("packed", "scale", "shape")}
    assert all(torch.equal(text[k], emb4[k]) for k in text.keys() & emb4.keys())
    for s in ("packed", "scale"):
        assert torch.equal(emb4[f"lm_head.weight_{s}"], emb4[f"{prefix}embed_tokens.weight_{s}"])


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
def test_pack_w4_equals_compressed_tensors(scale_dtype):
    """Random rows, plus the corners: a group whose scale is exactly 1 so that w / scale hits every half (rounded
    half to even; -7.5 becomes -8), and an all-zero group (its scale is the dtype's eps)."""
    w = checkpoints.random_tensor("layers.0.mlp.down_proj.weight", (6, 128), seed=1)
    w[0, :32] = torch.arange(-7.5, 8.5, 0.5).clamp(max=7.5)
    w[1, 32:64] = 0
    module = torch.nn.Module()
    module.proj = torch.nn.Linear(128, 6, bias=False)  # group "Linear": the weight's dtype (bf16)
    module.lm_head = torch.nn.Linear(128, 6, bias=False)  # group of the tables: F16 scales
    for linear in (module.proj, module.lm_head):
        linear.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
    checkpoints.compress_with_ct(module, checkpoints.quantization_config(emb4=True))
    ct = module.lm_head if scale_dtype == torch.float16 else module.proj
    ours = checkpoints.pack_w4(w, 32, scale_dtype)
    for name in ("weight_packed", "weight_scale", "weight_shape"):
        assert ours[name].dtype == getattr(ct, name).dtype, name
        assert torch.equal(ours[name], getattr(ct, name)), name
    assert ours["weight_scale"][0, 0] == 1 and ours["weight_scale"][1, 1] == torch.finfo(scale_dtype).eps


def test_pack_w4_bit_layout():
    """The example of notes/checkpoint-formats.md: q = [3, -2, 0, 4, -1, -3, 3, 1] packs to the word 0x9b57c86b."""
    w = torch.zeros(1, 32, dtype=torch.bfloat16)
    w[0, :8] = torch.tensor([3, -2, 0, 4, -1, -3, 3, 1])
    w[0, 8] = 7.5  # absmax 7.5: scale 1, so q = w
    packed = checkpoints.pack_w4(w)["weight_packed"]
    assert packed.shape == (1, 4) and packed[0, 0].item() & 0xFFFFFFFF == 0x9B57C86B


@pytest.mark.parametrize("layout", checkpoints.LAYOUTS)
def test_streaming_writer_writes_what_transformers_and_compressed_tensors_write(made, layout, tmp_path):
    """write_random (the E2B writer) on the tiny config: the same tensors, bit for bit, and the same configs; the
    multimodal run is cut into many small shards to check the index."""
    shard_bytes = 300_000 if layout == "multimodal" else checkpoints.SHARD_BYTES
    checkpoints.write_random(tmp_path, checkpoints.TINY, seed=0, layout=layout, shard_bytes=shard_bytes)
    for twin in ("text", "emb4"):
        ours, ref = tmp_path / twin, made[layout] / twin
        a, b = load(ours), load(ref)
        assert a.keys() == b.keys()
        for k in b:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        for name in ("config.json", "generation_config.json"):
            assert (ours / name).read_text() == (ref / name).read_text(), name
        shards = sorted(ours.glob("*.safetensors"))
        if layout == "causal":
            assert [f.name for f in shards] == ["model.safetensors"]
            continue
        assert len(shards) > 2
        index = json.loads((ours / "model.safetensors.index.json").read_text())
        assert index["weight_map"].keys() == a.keys()
        for file in shards:
            with safe_open(str(file), "pt") as f:
                assert all(index["weight_map"][k] == file.name for k in f.keys())
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in a.values())


def test_sharded_writer_output_runs_in_transformers(made, hf_model, tmp_path):
    checkpoints.write_random(tmp_path, checkpoints.TINY, seed=0, shard_bytes=200_000)
    ids = torch.tensor([PROMPT])
    logits = {}
    for folder in (tmp_path / "emb4", made["causal"] / "emb4"):
        with torch.no_grad():
            logits[folder] = hf_model(folder)(ids).logits
    a, b = logits.values()
    assert a.shape == (1, len(PROMPT), checkpoints.TINY["vocab_size"]) and torch.isfinite(a).all()
    assert torch.equal(a, b)


def test_same_seed_same_bytes(made, tmp_path):
    again = checkpoints.make(tmp_path / "again", "tiny", "causal", seed=0)
    assert file_hashes(again) == file_hashes(made["causal"])
    other = checkpoints.random_tensor("layers.0.self_attn.q_proj.weight", (128, 128), seed=1)
    assert not torch.equal(other, checkpoints.random_tensor("layers.0.self_attn.q_proj.weight", (128, 128), seed=0))


def test_tokenizer_ids(made):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(made["causal"] / "text")
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert len(tok) == checkpoints.TINY["vocab_size"]
    text = "Record 17: code 610395.\nRecord 18: code 24.\n\nWhat is the code of record 17? Answer:"
    ids = tok(text).input_ids
    assert ids[0] != tok.bos_token_id  # like Gemma's: callers prepend <bos> themselves
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text
    digits = tok.convert_ids_to_tokens(tok("610395").input_ids)
    assert digits == list("610395")


def test_make_never_overwrites(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=re.escape(str(tmp_path))):
        checkpoints.make(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTPU_RS_CACHE", str(tmp_path / "env"))
    assert checkpoints.cache_root() == tmp_path / "env"
    monkeypatch.delenv("TORCHTPU_RS_CACHE")
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "repo" / "sub")
    assert checkpoints.cache_root() == tmp_path / "repo" / ".cache" / "checkpoints"


def test_cache_is_made_once_atomically_and_a_lost_race_uses_the_winner(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTPU_RS_CACHE", str(tmp_path))
    calls = []

    def fake_make(out, size, layout, seed):
        calls.append(Path(out))
        (Path(out) / "text").mkdir()

    monkeypatch.setattr(checkpoints.cache, "make", fake_make)
    first = checkpoints.tiny(seed=5)
    assert first == checkpoints.cache_path("tiny", "causal", 5) and (first / "text").is_dir()
    assert checkpoints.tiny(seed=5) == first and len(calls) == 1  # a hit makes nothing
    assert calls[0].parent == tmp_path and calls[0] != first  # made in a sibling, then renamed

    def rival_renames_first(out, size, layout, seed):
        final = checkpoints.cache_path(size, layout, seed)
        final.mkdir()
        (final / "who").write_text("rival")
        fake_make(out, size, layout, seed)

    monkeypatch.setattr(checkpoints.cache, "make", rival_renames_first)
    won = checkpoints.tiny(seed=6)
    assert (won / "who").read_text() == "rival"

    def crash(out, size, layout, seed):
        fake_make(out, size, layout, seed)
        raise RuntimeError("disk full")

    monkeypatch.setattr(checkpoints.cache, "make", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        checkpoints.tiny(seed=7)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, won.name])  # nothing half-made


@pytest.mark.parametrize("twin", ["text", "emb4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_greedy_text_varies(made, hf_model, twin, dtype):
    """Tiny random models can echo one token forever; then token agreement between two engines proves little."""
    from transformers import GenerationConfig

    model = hf_model(made["causal"] / twin, dtype)
    ids = torch.tensor([PROMPT])
    greedy = GenerationConfig(max_new_tokens=64, min_new_tokens=64, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
    tokens = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=greedy)[0, len(PROMPT):]
    assert len(tokens) == 64 and len(set(tokens.tolist())) >= 32
