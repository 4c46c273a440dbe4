"""The fake quantizer gives exactly what compressed-tensors' own quantize/dequantize give, with both scale dtypes,
and lets the gradient through."""
import fakequant
import pytest
import torch
from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize
from compressed_tensors.quantization.utils import calculate_qparams


def weights():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 96, generator=g) / 10
    w[0, :32] = torch.arange(-7.5, 8.5, 0.5).clamp(max=7.5) / 100  # every half step: round half to even
    w[1, 32:64] = 0  # an all-zero group: scale eps
    return w


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
def test_equals_compressed_tensors(scale_dtype):
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32,
                            scale_dtype=scale_dtype if scale_dtype != torch.bfloat16 else None)
    w = weights().to(torch.bfloat16)  # exported weights are bf16 before they are packed
    groups = w.unflatten(-1, (-1, 32))
    if scale_dtype == torch.float16:
        groups = groups.float()  # as checkpoints.compress_with_ct computes F16 scales
    scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    scale = scale.to(scale_dtype)
    q = quantize(w, scale, zero, args)
    theirs = dequantize(q, scale, zero, args).to(torch.bfloat16)
    ours = fakequant.quantize_dequantize(weights(), scale_dtype)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, theirs)


def test_straight_through_gradient():
    w = weights().requires_grad_()
    out = fakequant.FakeQuantize()(w)
    assert torch.equal(out.detach(), fakequant.quantize_dequantize(w).float())
    out.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))


def test_attach_and_detach_keep_the_float_weights():
    from torchtpu_rs.checkpoints import TINY, text_config
    from transformers import Gemma4ForCausalLM

    torch.manual_seed(0)
    model = Gemma4ForCausalLM(text_config(TINY)).float()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    switches = fakequant.attach(model)
    layer = model.model.layers[0].mlp.down_proj
    want = fakequant.quantize_dequantize(before["model.layers.0.mlp.down_proj.weight"]).float()
    assert torch.equal(layer.weight, want)
    assert len(switches) == 3
    for fq in switches:
        fq.enabled = False
    assert torch.equal(model.model.embed_tokens.weight, before["model.embed_tokens.weight"])
    fakequant.detach(model)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
