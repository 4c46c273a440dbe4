"""Random weights: every tensor drawn from its own seeded generator, block by block, so a tensor is the same
whether it is made whole (the tiny path) or streamed (the E2B writer)."""
import hashlib
import math

import torch

ROWS = 4096  # rows per random block: one block of the E2B PLE table is 4096 x 8960 floats (147 MB)


def text_name(name):
    """The layout-free name a tensor is seeded by, so both layouts hold the same model. An untied head starts as a
    copy of the embedding table: the emb4 twin re-packs the -text model's tied head, it is no new model."""
    for prefix in ("model.language_model.", "model."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return "embed_tokens.weight" if name == "lm_head.weight" else name


def random_block(name, shape, seed, block=0):
    """Rows [block*ROWS, (block+1)*ROWS) of the bf16 tensor `name` (a layout-free name, see `text_name`).

    Each block has its own generator, seeded from (seed, name, block): a tensor is the same whether it is made
    whole (the tiny path) or streamed block by block (the E2B writer), and independent of every other tensor.
    HF's init (std 0.02, unit norms) makes a near-constant model. These values make every path matter and keep
    greedy decoding varied (50 or so distinct tokens in 64 on the tiny model, on every seed tried) and calm."""
    rows = shape[0] if len(shape) == 2 else 1
    shape = (min(ROWS, rows - block * ROWS), *shape[1:]) if len(shape) == 2 else tuple(shape)
    key = hashlib.sha256(f"{seed}/{name}/{block}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little"))
    if name.endswith("layer_scalar"):  # scales the whole residual stream each layer: near 1, or it compounds
        return (0.8 + 0.4 * torch.rand(shape, generator=g)).to(torch.bfloat16)
    n = torch.randn(shape, generator=g)
    if name.endswith(("q_norm.weight", "k_norm.weight")):  # attention scaling is 1.0: these set its temperature
        x = 0.5 * (1.0 + 0.1 * n)
    elif name == "embed_tokens.weight":
        # The head is tied, so the current token's own embedding, still in the residual stream, votes for that
        # token: at full size it wins and the model repeats one token forever. A quarter of it leaves the echo
        # below the spread of the logits (layer inputs are normed: this scale reaches only the residual and head).
        x = 0.25 * n / math.sqrt(shape[1])
    elif name == "norm.weight":  # the final norm: logits of std 4, about +-12 at the top, so the softcap bends them
        x = 16.0 * (1.0 + 0.1 * n)
    elif name.endswith("norm.weight"):
        x = 1.0 + 0.2 * n
    else:  # linears and the per-layer table: unit-variance outputs for unit-variance inputs
        x = n / math.sqrt(shape[1])
    return x.to(torch.bfloat16)


def row_blocks(shape):
    """The row slices of a tensor's random blocks: ROWS rows each, one block for a 1-D tensor."""
    return [slice(None)] if len(shape) == 1 else [slice(r, r + ROWS) for r in range(0, shape[0], ROWS)]


def random_tensor(name, shape, seed):
    """The whole bf16 tensor, filled block by block in place (no second copy: the E2B PLE table is 4.4 GiB)."""
    out = torch.empty(shape, dtype=torch.bfloat16)
    for b, rows in enumerate(row_blocks(shape)):
        out[rows] = random_block(name, shape, seed, b)
    return out
