"""The figures that say whether two implementations of one model compute the same thing.

- top-5: the five most likely next tokens after the prompt, and their logits;
- KL(hf || rs): how much the engine's next-token distribution differs from Transformers' (0 = identical);
- max abs diff: the largest logit difference over every prompt position;
- same n of N: how long the two greedy continuations agree;
- per layer: each hidden state's largest difference, and the first one past tolerance.
"""
import torch
import torchtpu_rs
from torchtpu_rs.prompting import same_prefix

# How far a hidden state may be from Transformers', relative to its largest magnitude: float32 allows
# summation-order noise, bfloat16 a few roundings of an 8-bit mantissa.
LAYER_TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}


# --8<-- [start:figures]
def top5(logits: torch.Tensor) -> dict:
    values, ids = logits.float().topk(5)
    return {"ids": ids.tolist(), "logits": [round(v, 4) for v in values.tolist()]}


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(p || q) of the two softmax distributions, in float64: sum p · (log p − log q)."""
    log_p = torch.log_softmax(p_logits.double(), -1)
    log_q = torch.log_softmax(q_logits.double(), -1)
    return float((log_p.exp() * (log_p - log_q)).sum())


def layer_report(ours: list[torch.Tensor], theirs: list[torch.Tensor], dtype: str) -> list[dict]:
    """Per hidden state (entry i = input of layer i; the last = final-norm output): max abs diff and whether it
    is within tolerance of Transformers'."""
    rows = []
    for i, (a, b) in enumerate(zip(ours, theirs)):
        a, b = a.float(), b.float()
        diff = (a - b).abs().max().item()
        tolerance = LAYER_TOLERANCE[dtype] * max(1.0, b.abs().max().item())
        name = "embeddings" if i == 0 else "final norm" if i == len(ours) - 1 else f"after layer {i - 1}"
        rows.append({"index": i, "name": name, "max_abs_diff": diff, "tolerance": tolerance, "ok": diff <= tolerance})
    return rows
# --8<-- [end:figures]


@torch.no_grad()
def greedy(reference, ids: list[int], n: int) -> list[int]:
    """Transformers' greedy continuation, argmax after argmax through its own cache, for exactly n tokens. Not
    `generate()`: it stops at <eos>, or with `min_new_tokens` holds <eos> back and picks the runner-up instead."""
    out = reference(torch.tensor([ids]), use_cache=True)
    tokens = []
    for _ in range(n):
        tokens.append(int(out.logits[0, -1].argmax()))
        out = reference(torch.tensor([tokens[-1:]]), cache=out.cache, use_cache=True)
    return tokens


# --8<-- [start:compare]
@torch.no_grad()
def compare(engine: "torchtpu_rs.Engine", reference, ids: list[int], max_new: int, dtype: str,
            layers: bool = False) -> dict:
    """Every figure for one prompt: the engine and the reference model side by side, on the CPU."""
    ours = engine.logits(ids)
    out = reference(torch.tensor([ids]), output_hidden_states=layers)
    theirs = out.logits[0].float()
    ours_tokens = engine.generate(ids, max_new)[0]
    theirs_tokens = greedy(reference, ids, max_new)
    same = same_prefix(ours_tokens, theirs_tokens)
    result = {
        "top5_rust": top5(ours[-1]), "top5_hf": top5(theirs[-1]),
        "max_abs_diff": (ours - theirs).abs().max().item(),
        "kl_hf_rs": kl_divergence(theirs[-1], ours[-1]),
        "same": same, "of": max_new, "first_diff": None if same == max_new else same,
        "tokens_rust": ours_tokens, "tokens_hf": theirs_tokens, "layers": None,
    }
    if layers:
        theirs_hidden = [h[0] for h in out.hidden_states]
        result["layers"] = layer_report(engine.hidden_states(ids), theirs_hidden, dtype)
    return result
# --8<-- [end:compare]
