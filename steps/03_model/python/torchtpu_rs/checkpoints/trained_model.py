"""The default model of steps 03-06: a tiny Gemma 4 trained here on the records task, shipped in both real formats.

No model hub is reachable where this walkthrough is built, so its outputs could only ever be noise; this model
has learned something, so an answer can be right or wrong. `train/train.py` trains it (quantization-aware) and
`export` writes it the way the real repacks are written: Transformers builds the model, compressed-tensors packs
it, in both twins (-text, -text-emb4) and both layouts. The files ship inside this package (a few hundred KB).
"""
from pathlib import Path

import torch

from .random_weights import text_name
from .specs import LAYOUTS, TINY
from .tokenizer import write_tokenizer
from .with_ct import write_twin

SHIPPED = Path(__file__).parent / "trained-model"  # package data, not a module


def trained(layout: str = "causal") -> Path:
    """The shipped folder of the trained model (holding `text/` and `emb4/`) in `layout`."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    folder = SHIPPED / layout
    if not (folder / "text" / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: the trained model's files are missing from this install "
                                "(they ship in the package; `make train` makes them again)")
    return folder


def export(state: dict, out_dir, layouts=LAYOUTS) -> Path:
    """Write `out_dir/<layout>/text` and `.../emb4` of a Gemma4ForCausalLM state dict of the TINY shape (float
    weights; compressed-tensors quantizes them), each with the project's tokenizer. `out_dir` must be new."""
    out = Path(out_dir)
    out.mkdir(parents=True)
    weights = {text_name(k): v.detach() for k, v in state.items()}

    def weight(name, shape):
        if tuple(weights[name].shape) != tuple(shape):
            raise ValueError(f"{name}: trained shape {tuple(weights[name].shape)}, the model wants {tuple(shape)}")
        return weights[name].to(torch.bfloat16)

    for layout in layouts:
        for twin, emb4 in (("text", False), ("emb4", True)):
            folder = out / layout / twin
            write_twin(folder, TINY, layout, emb4, weight)
            write_tokenizer(folder)
    return out
