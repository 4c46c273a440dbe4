"""llama.cpp as a second reference: its greedy tokens and first logits for prompts of ids, beside the engine's.

    runs = llama_runs(model_dir, prompts, max_new=8, ctx=2048)     # {quant: {"tokens": [...], "logits": array}}
    summary = agreement(engine_tokens, engine_first, runs, hf_tokens, hf_first)

llama.cpp's `gemma4` runtime is an implementation of the same arithmetic written by other people (per-layer
inputs, KV sharing, sliding and full layers, its own kernels), so the engine agreeing with it token for token is
evidence Transformers alone cannot give. Each GGUF runs in a fresh process (`python -m torchtpu_parity.llama`),
from the same ids, with llama.cpp's weight repacking off: its plain CPU kernels, the path that runs on every CPU
(on an AMX Xeon its repacked Q4_0/Q8_0 path crashes in 0.3.36; step 05's bench records that).
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import peer, to_gguf
from .child_env import source_first


def llama_runs(model_dir, prompts: list[list[int]], max_new: int, ctx: int, quants=peer.QUANTS) -> dict:
    """{quant: {"tokens": per prompt, "logits": float32 [prompts, vocab] of each first token, "system_info"}}.
    RuntimeError naming the GGUF when llama.cpp fails; FileNotFoundError when the peer is not built."""
    if why := peer.missing("llamacpp-bf16"):
        raise FileNotFoundError(why)
    files = to_gguf.ggufs(model_dir, list(quants))
    env = source_first(peer.env("llamacpp-bf16"), __file__)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="torchtpu-llama-") as tmp:
        ids = Path(tmp) / "prompts.json"
        ids.write_text(json.dumps(prompts))
        for quant, gguf in files.items():
            out = Path(tmp) / f"{quant}.json"
            proc = subprocess.run([sys.executable, "-m", "torchtpu_parity.llama", "--gguf", str(gguf), "--prompts",
                                   str(ids), "--max-new", str(max_new), "--ctx", str(ctx), "--no-repack",
                                   "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"llama.cpp on {gguf} failed (exit code {proc.returncode}):\n{proc.stderr[-2000:]}")
            runs[quant] = {**json.loads(out.read_text()), "logits": np.load(out.with_suffix(".npy")), "gguf": gguf}
    return runs


def agreement(ours: list[list[int]], ours_first: np.ndarray, runs: dict, hf: list[list[int]],
              hf_first: np.ndarray) -> dict:
    """Counts over the prompts: Transformers' and each llama.cpp GGUF's greedy tokens equal to the engine's (all
    of them), the first token's top-1 equal, and the largest first-token logit difference, to the engine and to
    Transformers."""
    out = {"prompts": len(ours), "hf_same": sum(a == b for a, b in zip(ours, hf)),
           "hf_top1_same": int((ours_first.argmax(-1) == hf_first.argmax(-1)).sum()),
           "hf_max_abs_diff": float(np.abs(ours_first - hf_first).max()), "llama": {}}
    for quant, run in runs.items():
        theirs = run["logits"]
        out["llama"][quant] = {
            "same": sum(a == b for a, b in zip(ours, run["tokens"])),
            "top1_same": int((ours_first.argmax(-1) == theirs.argmax(-1)).sum()),
            "max_abs_diff": float(np.abs(ours_first - theirs).max()),
            "max_abs_diff_hf": float(np.abs(hf_first - theirs).max()),
        }
    return out
