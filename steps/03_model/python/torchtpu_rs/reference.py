"""Transformers as the reference every later step checks the engine against, loaded one way everywhere."""
import warnings
from pathlib import Path

import torch


def transformers_model(folder: Path, dtype: str | torch.dtype = torch.float32):
    """The checkpoint in `folder` through Transformers: eager attention (sdpa's fused kernel rounds differently in
    bf16) and weights decompressed as compressed-tensors does (`dequantize=True`; the default path upcasts the
    scales first in float32, one bf16 rounding away from the checkpoint's weights). Either layout, either twin."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    packed = "quantization_config" in (Path(folder) / "config.json").read_text()
    quant = {"quantization_config": CompressedTensorsConfig(dequantize=True)} if packed else {}
    with warnings.catch_warnings():  # "the quantization_config from the model will be used": we override on purpose
        warnings.filterwarnings("ignore", "You passed `quantization_config`")
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager", **quant).eval()
