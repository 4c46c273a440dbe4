"""Quantization-aware training: the model sees, in its forward pass, the 4-bit weights it will be exported with.

The export is compressed-tensors' W4A16 (symmetric int4, groups of 32 along the input, scale = max|w| / 7.5
rounded to the scale dtype, q = round(w / scale) clamped to -8..7, weights held in bf16). `fake_quantize` gives
exactly the value compressed-tensors decompresses for a weight (a test holds it to compressed-tensors' own
quantize/dequantize, bit for bit), and passes the gradient straight through to the float weight (the
straight-through estimator), so training moves the float weights to where their rounded values work.
"""
import torch
from torch import nn
from torch.nn.utils import parametrize

GROUP = 32


def quantize_dequantize(weight: torch.Tensor, scale_dtype=torch.bfloat16, group: int = GROUP) -> torch.Tensor:
    """What compressed-tensors stores and gives back for `weight` [out, in], as a bf16 tensor: the weight rounded
    to bf16 (the dtype the model is exported in), per-group scale in `scale_dtype`, q × scale rounded to it."""
    w = weight.detach().to(torch.bfloat16)
    groups = w.unflatten(-1, (w.shape[-1] // group, group))
    scale = (groups.abs().amax(-1).float() / 7.5).to(scale_dtype)
    scale = torch.where(scale == 0, torch.finfo(scale_dtype).eps, scale).unsqueeze(-1)
    q = torch.round(torch.clamp(groups / scale, -8, 7))  # bf16 / bf16 stays bf16; bf16 / f16 is float32
    return (q.to(scale_dtype) * scale).to(torch.bfloat16).flatten(-2)


class FakeQuantize(nn.Module):
    """A parametrization: the module's weight reads as its quantized value, its gradient goes to the float one."""

    def __init__(self, scale_dtype=torch.bfloat16):
        super().__init__()
        self.scale_dtype = scale_dtype
        self.enabled = True

    def forward(self, weight):
        if not self.enabled:
            return weight
        return weight + (quantize_dequantize(weight, self.scale_dtype).to(weight.dtype) - weight).detach()


def linears(model: nn.Module):
    """The modules both exported twins pack: every nn.Linear of the text model (the tied head is the table)."""
    return [m for name, m in model.named_modules() if isinstance(m, nn.Linear) and name != "lm_head"]


def tables(model: nn.Module):
    """The tables only the -text-emb4 twin packs (F16 scales): the token and per-layer embeddings, and the head,
    which the emb4 twin stores as a 4-bit copy of the token table (here tied to it: the same parameter)."""
    return [model.model.embed_tokens, model.model.embed_tokens_per_layer, model.lm_head]


def attach(model: nn.Module) -> list[FakeQuantize]:
    """Fake-quantize every linear (bf16 scales) and both tables (F16 scales). Returns the tables'
    parametrizations, which the trainer switches on and off by step: the -text twin keeps its tables in bf16."""
    for m in linears(model):
        parametrize.register_parametrization(m, "weight", FakeQuantize(torch.bfloat16))
    switches = []
    for m in tables(model):
        fq = FakeQuantize(torch.float16)
        parametrize.register_parametrization(m, "weight", fq)
        switches.append(fq)
    return switches


def detach(model: nn.Module) -> None:
    """Remove the parametrizations, keeping the float weights (the export quantizes them itself)."""
    for m in model.modules():
        if parametrize.is_parametrized(m):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=False)
