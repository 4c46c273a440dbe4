"""The tiny path: Transformers builds the model, compressed-tensors packs it, as the real repacks were made."""
import torch

from .packing import compress_with_ct, finish_config, quantization_config
from .random_weights import text_name
from .specs import model_class, model_config, text_config


@torch.no_grad()
def write_twin(folder, spec, layout, emb4, weight):
    """One twin (-text, or -text-emb4 when `emb4`) of a model of text config `spec` in `layout`, its tensors taken
    from `weight(name, shape)`, a bf16 tensor by layout-free name (`text_name`): the random generator, or a
    trained state dict."""
    model = model_class(layout)(model_config(text_config(spec, tied=not emb4), layout)).to(torch.bfloat16)
    for name, t in model.state_dict().items():  # parameters and the persistent layer_scalar buffers
        t.copy_(weight(text_name(name), t.shape))
    compressor = compress_with_ct(model, quantization_config(emb4))
    model.save_pretrained(folder)
    finish_config(folder, spec, compressor)
