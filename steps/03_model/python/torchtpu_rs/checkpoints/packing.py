"""W4A16 packing: compressed-tensors' scheme for the real repacks, and this project's own packer, bit for bit equal."""
import json
from pathlib import Path

import torch

GROUP = 32  # int4 group size of the real repacks


def quantization_config(emb4=False):
    """The compressed-tensors config of a twin. -text: every nn.Linear of the text model 4-bit (symmetric int4,
    groups of 32 along the input, scales in the weight's dtype: bf16); the tied head is not stored. -text-emb4: the
    same linears, plus a group for the two embedding tables and the untied head with F16 scales. That group comes
    first: compressed-tensors gives a module the scheme of its most specific target (an exact name beats a regex
    beats a class name) either way, but it warns about a target that an earlier one (`Linear`) already claimed."""
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
    )

    w4 = dict(num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP)
    linears = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**w4))
    if not emb4:
        return QuantizationConfig(config_groups={"group_0": linears}, ignore=["lm_head"], format="pack-quantized",
                                  quantization_status=QuantizationStatus.INITIALIZED)
    tables = QuantizationScheme(targets=["lm_head", "re:.*embed_tokens$", "re:.*embed_tokens_per_layer$"],
                                weights=QuantizationArgs(**w4, scale_dtype=torch.float16))
    return QuantizationConfig(config_groups={"group_0": tables, "group_1": linears}, ignore=[],
                              format="pack-quantized", quantization_status=QuantizationStatus.INITIALIZED)


def pack_w4(weight, group=GROUP, scale_dtype=torch.bfloat16):
    """Pack a 2-D weight [out, in] the way compressed-tensors' minmax + pack-quantized does, bit for bit.

    scale = max|w| / 7.5 per group of `group` columns (calculate_qparams: absmax / ((qmax - qmin) / 2)), computed in
    float32 and rounded once to `scale_dtype` (bf16 division rounds exactly so); an all-zero group gets the dtype's
    eps. q = round(clamp(w / scale, -8, 7)), half to even, with the division in the dtypes' promotion (bf16 / bf16
    rounds to bf16 before the round, as in compressed-tensors). Stored nibble q + 8, element j of a row in int32 word
    j // 8 at bits 4 * (j % 8): low nibble first.
    Returns {"weight_packed": int32 [out, in/8], "weight_scale": [out, in/group], "weight_shape": int64 [2]}."""
    rows, cols = weight.shape
    groups = weight.unflatten(-1, (cols // group, group))
    absmax = groups.abs().amax(-1).float()
    scale = (absmax / 7.5).clamp(max=torch.finfo(scale_dtype).max).to(scale_dtype)
    scale = torch.where(scale == 0, torch.finfo(scale_dtype).eps, scale)
    q = (torch.round(torch.clamp(groups / scale.unsqueeze(-1), -8, 7)) + 8).to(torch.uint8).flatten(-2)
    # two nibbles per byte, even element low; four little-endian bytes make an int32 word
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).view(torch.int32)
    return {"weight_packed": packed, "weight_scale": scale, "weight_shape": torch.tensor([rows, cols])}


@torch.no_grad()
def compress_with_ct(model, qconfig):
    """Quantize and pack `model` in place with compressed-tensors, as llm-compressor would for W4A16: weight-only
    min/max scales (no calibration data needed), then PackedQuantizationCompressor. Returns the ModelCompressor,
    whose `update_config(folder)` writes `quantization_config` into a saved config.json."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationStatus, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams

    apply_quantization_config(model, qconfig, show_progress=False)
    for module in model.modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None:
            continue
        args = scheme.weights
        groups = module.weight.unflatten(-1, (-1, args.group_size))
        if args.scale_dtype is not None:
            # compressed-tensors 0.20 creates every scale parameter in the weight's dtype and only rounds the values
            # to `scale_dtype`; for real F16 scales compute them in float32, let calculate_qparams round them to
            # F16, and store that dtype (the compressor packs with the scale it is given, whatever its dtype).
            groups = groups.float()
        scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
        module.weight_scale = torch.nn.Parameter(scale.to(args.scale_dtype or module.weight.dtype),
                                                 requires_grad=False)
        module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor(quantization_config=qconfig, force_compression_format="pack-quantized")
    compressor.compress_model(model)
    return compressor


def finish_config(folder, spec, compressor):
    """config.json as the real checkpoints have it: Transformers writes `per_layer_config: {"4": {"head_dim": ...}}`,
    the real files carry `global_head_dim` and `num_global_key_value_heads` (which Gemma4TextConfig turns into
    per_layer_config on load; a config with neither silently means 512). Then the quantization_config."""
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    tc = config.get("text_config", config)
    tc.pop("per_layer_config")
    tc["global_head_dim"] = spec["global_head_dim"]
    tc["num_global_key_value_heads"] = spec["num_global_key_value_heads"]
    config["dtype"] = tc["dtype"] = "bfloat16"  # of the unpacked tensors (Transformers names the first one's: F16)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    compressor.update_config(str(folder))
