"""The baseline reads a config as Transformers (and the Rust engine, step 03's test_config_reading) reads it:
`num_global_key_value_heads` only with `attention_k_eq_v`; proportional RoPE's `factor`; `tie_word_embeddings`
(tied wins over a shipped lm_head); each on a small config that exercises it, against Transformers."""
import copy

import pytest
import torch
from torchtpu_rs.checkpoints import copy_edited, specs, variant
from torchtpu_ways.baseline import Baseline

CTX = 256
IDS = [2] + [(7 * i + 3) % 500 + 3 for i in range(60)]  # crosses the 16-token window several times


def check(folder, hf_model):
    ours = Baseline(folder, None, "cpu", CTX, "float32").logits(IDS)
    with torch.no_grad():
        want = hf_model(folder)(torch.tensor([IDS])).logits[0].float()
    assert (ours - want).abs().max().item() < 1e-3
    return ours


def test_num_global_key_value_heads_is_read_only_with_attention_k_eq_v(tmp_path, hf_model):
    check(variant(tmp_path / "m", dict(specs.TINY, num_global_key_value_heads=2)), hf_model)


def test_proportional_rope_factor_divides_the_frequencies(tmp_path, hf_model):
    rope = copy.deepcopy(specs.TINY["rope_parameters"])
    rope["full_attention"]["factor"] = 8.0
    ours = check(variant(tmp_path / "m", dict(specs.TINY, rope_parameters=rope)), hf_model)
    unscaled = Baseline(variant(tmp_path / "plain", specs.TINY), None, "cpu", CTX, "float32").logits(IDS)
    assert (ours - unscaled).abs().max().item() > 1e-2, "the factor must change something on this config"


def test_a_tied_config_uses_the_embeddings_even_when_lm_head_ships(tmp_path, hf_model):
    def tie(config):
        config["tie_word_embeddings"] = True
    check(variant(tmp_path / "m", specs.TINY, emb4=True, edit=tie), hf_model)


def test_an_untied_config_without_lm_head_is_an_error(tmp_path, tiny):
    def untie(config):
        config["tie_word_embeddings"] = False
    folder = copy_edited(tiny / "text", tmp_path / "m", untie)
    with pytest.raises(ValueError, match="tie_word_embeddings is false but no lm_head"):
        Baseline(folder, None, "cpu", CTX, "float32")
