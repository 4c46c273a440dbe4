"""One llama.cpp way, run in this (fresh) process: `python -m torchtpu_ways.peer_worker --way W --gguf F ...`.

`peer_run.run` starts it (for `ways.run_way`) with `LLAMA_CPP_LIB_PATH` set to the way's build (peer.env). It
measures what worker.py measures for the engine, the same way: load (timed), then a cold run, a warm run whose
prompt read and decode are timed, from the same token ids, greedy (argmax of the last logits; llama.cpp's
tokenizer and samplers are never used): step 04's torchtpu_parity.llama.Peer, llama.cpp's C API and no torch in
this process, so its peak memory is llama.cpp's own (and the Python around it). Each token reaches the host as
it is made, so there is no separate "in batches" figure. With `--cold prefix` the cold run reads only the
prompt's first batch: llama.cpp compiles nothing, and one batch touches every mapped weight, so a 32,761-token
prompt is read once, not twice.
"""
import argparse
import json
import os
import time
from pathlib import Path

from torchtpu_parity.llama import Peer, peak_bytes, threads
from torchtpu_parity.peer import parse_way


def measure(args: argparse.Namespace) -> dict:
    build, quant, repack = parse_way(args.way)
    ids = json.loads(Path(args.ids).read_text())
    start = time.perf_counter()
    peer = Peer(args.gguf, args.ctx, repack, threads())
    load_s = time.perf_counter() - start
    cold = ids if args.cold == "prompt" else ids[:peer.n_batch]
    first_s = peer.generate(cold, args.max_new, args.stop)[1]  # cold: first touch of the mapped weights
    tokens, read_s, decode_s = peer.generate(ids, args.max_new, args.stop)
    steps = len(tokens) - 1
    return {
        "way": args.way, "torch": None, "available": True, "why": None, "pid": os.getpid(), "load_s": load_s,
        "cold": args.cold, "first_s": first_s, "graphs": None, "breaks": None,
        "streamed_tok_s": steps / decode_s if decode_s > 0 else None, "batched_tok_s": None,
        "peak_gb": peak_bytes() / 1e9, "tokens": tokens, "prompt_len": len(ids), "read_s": read_s,
        "read_tok_s": len(ids) / read_s if read_s > 0 else None, "threads": threads(), "build": build,
        "quant": quant, "repack": repack,
        "system_info": peer.ll.llama_print_system_info().decode().strip(),
        # its KV cache is float16 and attends over the cells in use (rounded up): the "bucket" rule's count
        "decode_slots": "bucket", "attention_dtype": "float16", "kv_dtype": "float16",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--way", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--ids", required=True, help="a JSON file holding the prompt ids")
    ap.add_argument("--max-new", type=int, required=True)
    ap.add_argument("--stop", type=lambda s: [int(t) for t in s.split(",")], help="stop ids, comma-separated")
    ap.add_argument("--cold", choices=["prompt", "prefix"], default="prompt",
                    help="what the cold run reads: the prompt, or its first batch")
    ap.add_argument("--out", required=True, help="where to write the results (JSON)")
    args = ap.parse_args()
    result = measure(args)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
