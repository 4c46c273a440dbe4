"""Config fields read as Transformers reads them, each on a small config that exercises it, against Transformers:
`num_global_key_value_heads` only with `attention_k_eq_v`; proportional RoPE's `factor`; `tie_word_embeddings`
(tied wins over a shipped lm_head); the embedding scales rounded in the embedding weight's dtype."""
import copy
import json

import pytest
import torch
import torchtpu_rs
from torchtpu_rs.checkpoints import copy_edited, specs, variant

CTX = 256
IDS = [2] + [(7 * i + 3) % 500 + 3 for i in range(60)]  # crosses the 16-token window several times


def teacher_forced(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def check(folder, hf_model, emb4=None, dtype="float32", tol=1e-3):
    engine = torchtpu_rs.Engine(folder, emb4, torch.zeros(1), CTX, dtype)
    ours = engine.logits(IDS)
    want = teacher_forced(hf_model(emb4 or folder, getattr(torch, dtype)), IDS)
    assert (ours - want).abs().max().item() < tol
    return ours


def test_num_global_key_value_heads_is_read_only_with_attention_k_eq_v(tmp_path, hf_model):
    spec = dict(specs.TINY, num_global_key_value_heads=2)  # ignored: attention_k_eq_v is false
    folder = variant(tmp_path / "m", spec)
    assert json.loads((folder / "config.json").read_text())["num_global_key_value_heads"] == 2
    check(folder, hf_model)


def test_proportional_rope_factor_divides_the_frequencies(tmp_path, hf_model):
    rope = copy.deepcopy(specs.TINY["rope_parameters"])
    rope["full_attention"]["factor"] = 8.0
    folder = variant(tmp_path / "m", dict(specs.TINY, rope_parameters=rope))
    ours = check(folder, hf_model)
    plain = variant(tmp_path / "plain", specs.TINY)
    unscaled = torchtpu_rs.Engine(plain, None, torch.zeros(1), CTX, "float32").logits(IDS)
    assert (ours - unscaled).abs().max().item() > 1e-2, "the factor must change something on this config"


def test_a_tied_config_uses_the_embeddings_even_when_lm_head_ships(tmp_path, hf_model):
    # an untied checkpoint with its own (random) lm_head, then marked tied: Transformers ties, ignoring the file's
    def tie(config):
        config["tie_word_embeddings"] = True
    folder = variant(tmp_path / "m", specs.TINY, emb4=True, edit=tie)
    check(folder, hf_model)


def test_an_untied_config_without_lm_head_is_an_error(tmp_path, tiny):
    def untie(config):
        config["tie_word_embeddings"] = False
    folder = copy_edited(tiny / "text", tmp_path / "m", untie)
    with pytest.raises(ValueError, match="tie_word_embeddings is false but no lm_head"):
        torchtpu_rs.Engine(folder, None, torch.zeros(1), CTX, "float32")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_embedding_scales_round_as_transformers_on_the_emb4_twin(tiny, hf_model, dtype):
    # hidden 128: sqrt = 11.3137 (11.3125 in bf16); per-layer 32: sqrt = 5.6569 (5.65625 in bf16)
    engine = torchtpu_rs.Engine(tiny / "text", tiny / "emb4", torch.zeros(1), CTX, dtype)
    ours = engine.hidden_states(IDS[:16])[0]
    hf = hf_model(tiny / "emb4", getattr(torch, dtype))
    with torch.no_grad():
        want = hf.model.embed_tokens(torch.tensor([IDS[:16]]))[0]
    assert want.dtype == ours.dtype
    assert torch.equal(ours, want), "the scaled embeddings, bit for bit"
