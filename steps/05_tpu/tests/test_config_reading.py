"""The baseline reads a config as Transformers (and the Rust engine, step 03's test_config_reading) reads it:
`num_global_key_value_heads` only with `attention_k_eq_v`; proportional RoPE's `factor`; `tie_word_embeddings`
(tied wins over a shipped lm_head); each on a small config that exercises it, against Transformers."""
import copy
import json

import pytest
import torch
from torchtpu_rs.checkpoints import specs, with_ct
from torchtpu_rs.checkpoints.random_weights import random_tensor
from torchtpu_rs.checkpoints.tokenizer import write_tokenizer
from torchtpu_ways.baseline import Baseline

CTX = 256
IDS = [2] + [(7 * i + 3) % 500 + 3 for i in range(60)]  # crosses the 16-token window several times


def write(folder, spec, emb4=False, edit=None):
    with_ct.write_twin(folder, spec, "causal", emb4, lambda name, shape: random_tensor(name, shape, 3))
    write_tokenizer(folder)
    if edit:
        config = json.loads((folder / "config.json").read_text())
        edit(config)
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def check(folder, hf_model):
    ours = Baseline(folder, None, "cpu", CTX, "float32").logits(IDS)
    with torch.no_grad():
        want = hf_model(folder)(torch.tensor([IDS])).logits[0].float()
    assert (ours - want).abs().max().item() < 1e-3
    return ours


def test_num_global_key_value_heads_is_read_only_with_attention_k_eq_v(tmp_path, hf_model):
    check(write(tmp_path / "m", dict(specs.TINY, num_global_key_value_heads=2)), hf_model)


def test_proportional_rope_factor_divides_the_frequencies(tmp_path, hf_model):
    rope = copy.deepcopy(specs.TINY["rope_parameters"])
    rope["full_attention"]["factor"] = 8.0
    ours = check(write(tmp_path / "m", dict(specs.TINY, rope_parameters=rope)), hf_model)
    unscaled = Baseline(write(tmp_path / "plain", specs.TINY), None, "cpu", CTX, "float32").logits(IDS)
    assert (ours - unscaled).abs().max().item() > 1e-2, "the factor must change something on this config"


def test_a_tied_config_uses_the_embeddings_even_when_lm_head_ships(tmp_path, hf_model):
    def tie(config):
        config["tie_word_embeddings"] = True
    check(write(tmp_path / "m", specs.TINY, emb4=True, edit=tie), hf_model)


def test_an_untied_config_without_lm_head_is_an_error(tmp_path, tiny):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(tiny / "text", folder)
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="tie_word_embeddings is false but no lm_head"):
        Baseline(folder, None, "cpu", CTX, "float32")
