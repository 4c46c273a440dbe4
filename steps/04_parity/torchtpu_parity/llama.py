"""llama.cpp driven from token ids, through its C API (llama-cpp-python's ctypes bindings), never its tokenizer.

    peer = Peer(gguf_path, ctx=2048, repack=True, threads=2)
    tokens, read_s, decode_s = peer.generate(ids, max_new)     # Engine.generate's contract: greedy, from ids
    logits = peer.first_logits(ids)                            # float32 [vocab]: the token after ids

Greedy is the argmax of the last logits, as the engine's: llama.cpp's samplers are never used. Its library is the
one `LLAMA_CPP_LIB_PATH` names (peer.env picks a build), else the installed package's. No torch here: a process
that runs llama.cpp holds llama.cpp's memory and Python's, nothing else.

`python -m torchtpu_parity.llama --gguf F --prompts P.json --max-new N --ctx C [--no-repack] --out OUT.json`:
step 04's reference run, in a fresh process: for each prompt (a list of ids) its greedy tokens and its first
token's logits (OUT.json, and the logits beside it as OUT.npy).
"""
import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def peak_bytes() -> int:
    """This process's peak resident set size (VmHWM), as memory.cpu_peak_bytes reads it (that module imports torch)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


class Peer:
    """A GGUF loaded by llama.cpp on the CPU with `threads` threads: `generate` has the Engine's contract."""

    def __init__(self, gguf: str, ctx: int, repack: bool, threads: int):
        import llama_cpp

        self.ll = llama_cpp
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.use_extra_bufts = repack  # llama.cpp's weight repacking for its CPU kernels (its default: on)
        self.model = llama_cpp.llama_model_load_from_file(gguf.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"{gguf}: llama.cpp could not load it")
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx, cparams.n_threads, cparams.n_threads_batch = ctx, threads, threads
        cparams.n_batch = cparams.n_ubatch = min(512, ctx)  # its default, kept within ctx
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError(f"{gguf}: llama.cpp could not make a context of {ctx}")
        self.n_batch = cparams.n_batch
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))

    def _decode(self, ids: list[int]) -> int:
        """Feed ids (after those already in the cache) in batches; the argmax of the last one's logits."""
        for start in range(0, len(ids), self.n_batch):
            part = ids[start:start + self.n_batch]
            tokens = (self.ll.llama_token * len(part))(*part)  # kept alive until the decode has read it
            batch = self.ll.llama_batch_get_one(tokens, len(part))
            if (rc := self.ll.llama_decode(self.ctx, batch)) != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
        logits = np.ctypeslib.as_array(self.ll.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
        return int(logits.argmax())

    def generate(self, ids: list[int], max_new: int, stop: list[int] | None = None):
        """(tokens, read_s, decode_s) as Engine.generate: the read yields the first token, then max_new - 1 steps."""
        if not ids or any(not 0 <= i < self.n_vocab for i in ids):
            raise ValueError(f"ids must be 1 or more token ids below {self.n_vocab}")
        self.ll.llama_memory_clear(self.ll.llama_get_memory(self.ctx), True)  # a fresh cache, as each Engine run
        start = time.perf_counter()
        tokens = [self._decode(ids)]
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        while len(tokens) < max_new and not (stop and tokens[-1] in stop):
            tokens.append(self._decode(tokens[-1:]))
        return tokens, read_s, time.perf_counter() - start

    def first_logits(self, ids: list[int]) -> np.ndarray:
        """float32 logits of the token after `ids`, from a fresh cache (step 04's comparison)."""
        self.ll.llama_memory_clear(self.ll.llama_get_memory(self.ctx), True)
        self._decode(ids)
        return np.ctypeslib.as_array(self.ll.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)).copy()


def threads() -> int:
    """The cores this process may use: what torch takes by default for the engine's ways."""
    return len(os.sched_getaffinity(0))


def main() -> None:
    ap = argparse.ArgumentParser(description="llama.cpp's greedy tokens and first logits for prompts of ids")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompts", required=True, help="a JSON file: a list of prompts, each a list of ids")
    ap.add_argument("--max-new", type=int, required=True)
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--no-repack", dest="repack", action="store_false", help="use_extra_bufts off")
    ap.add_argument("--out", required=True, help="OUT.json: tokens per prompt; OUT.npy: first logits per prompt")
    args = ap.parse_args()
    peer = Peer(args.gguf, args.ctx, args.repack, threads())
    prompts = json.loads(Path(args.prompts).read_text())
    tokens = [peer.generate(ids, args.max_new)[0] for ids in prompts]
    np.save(args.out.removesuffix(".json") + ".npy", np.stack([peer.first_logits(ids) for ids in prompts]))
    with open(args.out, "w") as f:
        json.dump({"tokens": tokens, "threads": threads(),
                   "system_info": peer.ll.llama_print_system_info().decode().strip()}, f)


if __name__ == "__main__":
    main()
