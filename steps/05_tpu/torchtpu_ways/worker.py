"""One way, run in this (fresh) process: `python -m torchtpu_ways.worker --way W ... --ids IDS.json --out OUT.json`.

`ways.run_way` starts it; it loads the model (timed), generates three times (twice with `--no-batched`) and
writes what it measured as JSON: a cold run with tokens read every step (`first_s`: the time to the first token,
compiling included), then warm runs with tokens read every step (`streamed_tok_s`, `read_s`) and, unless
`--no-batched`, every 8 steps (`batched_tok_s`). With `--cold prefix` the cold run reads only the shortest
prefix of the prompt that has the same chunk shapes, which compiles the same graphs: a 32,000-token prompt is
then read about one and a half times, not twice. The Python ways import nothing from the Rust engine, so they
can run under another interpreter and torch.
"""
import argparse
import importlib
import json
import os
import time
from pathlib import Path

import torch

from .compiling import chunk_shapes
from .memory import PeakMemory
from .way_names import OPTIONAL, PACKAGES, WAYS

BATCH = 8  # "in batches": tokens copied to the host every 8 decode steps


def load(way: str, model: str, emb4: str | None, device: torch.device, ctx: int, dtype: str):
    """The model a way runs: the Rust Engine (fused or eager is the process's TorchTPU mode) or the baseline."""
    if way in PACKAGES:  # step 07's or step 08's engine: linears kept 4-bit
        engine = importlib.import_module(PACKAGES[way][0]).Engine
        return engine(model, emb4, torch.empty(0, device=device), ctx, dtype, weights="int4")
    if way.startswith("rust"):
        import torchtpu_rs

        return torchtpu_rs.Engine(model, emb4, torch.empty(0, device=device), ctx, dtype)
    from .baseline import Baseline

    return Baseline(model, emb4, device, ctx, dtype, compile=way == "python-compile")


def same_shapes_prefix(ids: list[int], model: str, ctx: int) -> list[int]:
    """The shortest prefix of `ids` whose read runs the same chunk shapes (tokens, full_slots) as reading all of
    `ids`: whole chunks up to the first one in the prompt's largest bucket, then a last chunk as long as the
    prompt's, in the same bucket as the prompt's last."""
    config = json.loads((Path(model) / "config.json").read_text())  # not torchtpu_rs: see the module docstring
    chunk = config.get("text_config", config)["sliding_window"]
    shapes = set(chunk_shapes(len(ids), chunk, ctx))
    last = len(ids) % chunk or chunk
    n = next(n for n in range(last, len(ids) + 1, chunk) if set(chunk_shapes(n, chunk, ctx)) == shapes)
    return ids[:n]


def tok_s(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if seconds > 0 else None


def measure(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    ids = json.loads(Path(args.ids).read_text())
    if args.way in PACKAGES:
        from .ways import unavailable

        ok, why = importlib.import_module(PACKAGES[args.way][0]).int4_kernel(torch.empty(0, device=device))
        if not ok:
            return unavailable(args.way, why)
    peak = PeakMemory(device)
    peak.start()
    start = time.perf_counter()
    model = load(args.way, args.model, args.emb4, device, args.ctx, args.dtype)
    load_s = time.perf_counter() - start
    # --8<-- [start:runs]
    cold = ids if args.cold == "prompt" else same_shapes_prefix(ids, args.model, args.ctx)
    first_s = model.generate(cold, args.max_new, 1, stop=args.stop)[1]  # cold: compiling happens here
    tokens, read_s, decode_s = model.generate(ids, args.max_new, 1, stop=args.stop)  # warm: one token at a time
    batched = model.generate(ids, args.max_new, BATCH, stop=args.stop) if args.batched else None
    # --8<-- [end:runs]
    graphs = breaks = None
    if args.way == "python-compile":
        from .compiling import dynamo_counts

        graphs, breaks = dynamo_counts()
    steps = len(tokens) - 1  # decode steps after the token the prompt read yields (fewer when a stop id came)
    return {
        "way": args.way, "torch": torch.__version__, "available": True, "why": None, "pid": os.getpid(),
        "load_s": load_s, "cold": args.cold, "first_s": first_s, "graphs": graphs, "breaks": breaks,
        "streamed_tok_s": tok_s(steps, decode_s),
        "batched_tok_s": tok_s(len(batched[0]) - 1, batched[2]) if batched else None,
        "peak_gb": peak.gb(), "tokens": tokens, "bytes_per_token": model.weight_bytes_per_token(),
        # what decode's attention reads, for the bandwidth figure; the bytes held by part
        "decode_slots": model.decode_slots, "attention_dtype": str(model.attention_dtype).removeprefix("torch."),
        # the caches' dtype: step 08's engine may hold them bf16 for float32 attention; the others hold them in it
        "kv_dtype": str(getattr(model, "kv_dtype", model.attention_dtype)).removeprefix("torch."),
        "sliding_slots": getattr(model, "sliding_slots", "ring"),  # step 08's engine: "bucket"
        # step 08's own attention call reads only the slots a query sees
        "kv_read": "seen" if getattr(model, "decode_attention", "aten") == "own" else "slots",
        "memory": model.memory(),
        "weights_reason": getattr(model, "weights_reason", None),  # steps 07 and 08: which int4 kernel, and why
        # the kernel of an eager decode step's dense one-row linears ("aten" or "onednn"); a compiled step's: inductor's
        "matvec": None if getattr(model, "compiled", False) else model.matvec,
        "prompt_len": len(ids), "read_s": read_s, "read_tok_s": tok_s(len(ids), read_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--way", required=True, choices=WAYS + OPTIONAL)
    ap.add_argument("--model", required=True)
    ap.add_argument("--emb4")
    ap.add_argument("--device", required=True, help="a device name: cpu, cuda:0, tpu:0")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--ids", required=True, help="a JSON file holding the prompt ids")
    ap.add_argument("--max-new", type=int, required=True)
    ap.add_argument("--stop", type=lambda s: [int(t) for t in s.split(",")], help="stop ids, comma-separated")
    ap.add_argument("--cold", choices=["prompt", "prefix"], default="prompt",
                    help="what the cold run reads: the prompt, or its shortest prefix with the same chunk shapes")
    ap.add_argument("--no-batched", dest="batched", action="store_false", help="skip the read-every-8 run")
    ap.add_argument("--out", required=True, help="where to write the results (JSON)")
    args = ap.parse_args()
    result = measure(args)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
