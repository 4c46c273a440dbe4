"""The model shapes: E2B as released, and E2B in miniature (TINY), as Transformers' config classes take them."""
LAYOUTS = ("causal", "multimodal")

_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}
_COMMON = dict(
    num_key_value_heads=1, num_global_key_value_heads=None, use_double_wide_mlp=True, attention_k_eq_v=False,
    max_position_embeddings=131072, final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2, rope_parameters=_ROPE,
)
# The real gemma-4-E2B text config (notes/gemma4-text.md).
E2B = dict(
    _COMMON, vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size=1536, intermediate_size=6144,
    num_hidden_layers=35, num_attention_heads=8, head_dim=256, global_head_dim=512, hidden_size_per_layer_input=256,
    num_kv_shared_layers=20, sliding_window=512, layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
)
# E2B in miniature. Layers 5..9 are KV-shared (sliding ones read layer 3's cache, full ones layer 4's, as E2B's
# 15..34 read 13 and 14) and double-wide; a 16-token window is crossed several times by a 64-token run.
TINY = dict(
    _COMMON, vocab_size=512, vocab_size_per_layer_input=512, hidden_size=128, intermediate_size=256,
    num_hidden_layers=10, num_attention_heads=4, head_dim=32, global_head_dim=64, hidden_size_per_layer_input=32,
    num_kv_shared_layers=5, sliding_window=16, layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
)
SPECS = {"tiny": TINY, "e2b": E2B}


def text_config(spec=TINY, tied=True):
    """The Gemma4TextConfig of a spec (TINY, E2B); `tied=False` unties the output head (the emb4 twin)."""
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(**{k: (list(v) if isinstance(v, list) else v) for k, v in spec.items()},
                            tie_word_embeddings=tied)


def model_config(text, layout):
    """Wrap a text config for a layout: `causal` is Gemma4ForCausalLM (tensors under `model.`), `multimodal` is
    Gemma4ForConditionalGeneration with no vision or audio tower (tensors under `model.language_model.`)."""
    from transformers import Gemma4Config

    if layout == "causal":
        text.architectures = ["Gemma4ForCausalLM"]
        return text
    config = Gemma4Config(text_config=text, vision_config=None, audio_config=None,
                          tie_word_embeddings=text.tie_word_embeddings)
    config.architectures = ["Gemma4ForConditionalGeneration"]
    return config


def model_class(layout):
    from transformers import Gemma4ForCausalLM, Gemma4ForConditionalGeneration

    return {"causal": Gemma4ForCausalLM, "multimodal": Gemma4ForConditionalGeneration}[layout]
