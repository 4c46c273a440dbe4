"""The ways to run Gemma 4 on one chip, each in a fresh process, and what each measured.

    row = run_way("rust-eager", model_dir, emb4_dir, "cpu", "bfloat16", 2048, ids, 64)

A fresh process per way is not only hygiene: TorchTPU reads its eager mode (fused or not) once, when the backend
starts, so the fused way cannot share a process with the others; and peak memory is the process's own.
"""
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from torchtpu_parity import peer
from torchtpu_parity.child_env import source_first

from . import tpu
from .way_names import OPTIONAL, PACKAGES, WAYS  # the ways worker.py runs; OPTIONAL and PACKAGES: later steps'

NAMES = {"rust-fused": "Rust fused", "rust-eager": "Rust eager", "python-compile": "Python compile",
         "python-eager": "Python eager", "rust-int4": "Rust int4", "rust-int4-aten": "Rust int4 ATen"}
# llama.cpp, the peer (peer.py): every way of the form peer.WAY_FORM, run only when asked for
PEER = [f"llamacpp-{b}{q}{r}" for b in ("", "avx512-", "avx2-") for q in peer.QUANTS for r in ("", "-norepack")]
CHOOSE = f"choose from {', '.join(WAYS + OPTIONAL)}, or a llama.cpp way: {peer.WAY_FORM}"  # what --ways takes
# Every figure a row carries; None where a way does not have it (graphs of an eager way, all of an n/a way).
FIGURES = ["load_s", "first_s", "graphs", "breaks", "streamed_tok_s", "batched_tok_s", "peak_gb",
           "read_s", "read_tok_s", "bytes_per_token"]
COUNTS = {"graphs", "breaks"}


def unavailable(way: str, why: str) -> dict:
    """The row of a way that does not exist on this device: no figure, never an invented one."""
    return {"way": way, "torch": None, "available": False, "why": why, **dict.fromkeys(FIGURES), "tokens": None,
            "decode_slots": None, "attention_dtype": None, "kv_dtype": None, "memory": None}


def unknown(ways: list[str]) -> list[str]:
    """The ways of `ways` this runner does not know."""
    return [way for way in ways if way not in WAYS + OPTIONAL + PEER]


def worker_env(way: str, python: str) -> dict:
    """The environment of a way's process: TorchTPU's fused mode on for the fused way only. When this package
    runs from its source folder (not installed), that folder goes on the path so the worker imports this copy;
    another interpreter (--compile-python) needs the package installed in its own environment."""
    env = {k: v for k, v in os.environ.items() if k != tpu.FUSED_ENV}
    if way == "rust-fused":
        env[tpu.FUSED_ENV] = "1"
    return source_first(env, __file__) if python == sys.executable else env


# --8<-- [start:run_way]
def run_way(way: str, model, emb4, device: str, dtype: str, ctx: int, ids: list[int], max_new: int,
            python: str = sys.executable, batched: bool = True, cold: str = "prompt",
            stop: list[int] | None = None) -> dict:
    """Run one way in a fresh process (`python -m torchtpu_ways.worker` under `python`) and return its row:
    way, torch, available, why, load_s, first_s, graphs, breaks, streamed_tok_s, batched_tok_s, peak_gb,
    tokens, prompt_len, read_s, read_tok_s, decode_slots, attention_dtype, kv_dtype, and memory (bytes held by part).
    `batched=False` skips the read-every-8 run; `cold="prefix"` makes the cold run read only a prefix with the
    same chunk shapes (long prompts: one full read, not two); `stop`: ids that end generation early (the
    checkpoint's eos ids), None for exactly `max_new` tokens."""
    if unknown([way]):
        raise ValueError(f"way {way!r}: {CHOOSE}")
    if peer.is_peer(way):  # its own process and worker (peer_run); a crash there is a row, not an error
        from .peer_run import PeerUnavailable, run

        if str(device).split(":")[0] != "cpu":
            return unavailable(way, "make peer builds llama.cpp for the CPU only")
        try:
            return run(way, model, ctx, ids, max_new, stop, cold)
        except PeerUnavailable as why:
            return unavailable(way, str(why))
    if way == "rust-fused" and not tpu.is_tpu(str(device)):
        return unavailable(way, tpu.NO_TPU)
    package, step = PACKAGES.get(way, (None, None))
    if package and python == sys.executable and importlib.util.find_spec(package) is None:
        return unavailable(way, f"{step} ({package}) is not installed")
    with tempfile.TemporaryDirectory(prefix="torchtpu-way-") as tmp:
        prompt, out = Path(tmp) / "ids.json", Path(tmp) / "row.json"
        prompt.write_text(json.dumps(list(ids)))
        cmd = [python, "-m", "torchtpu_ways.worker", "--way", way, "--model", str(model), "--device", str(device),
               "--dtype", dtype, "--ctx", str(ctx), "--ids", str(prompt), "--max-new", str(max_new),
               "--out", str(out), *(["--emb4", str(emb4)] if emb4 else []), *([] if batched else ["--no-batched"]),
               *(["--cold", cold] if cold != "prompt" else []),
               *(["--stop", ",".join(map(str, stop))] if stop else [])]
        proc = subprocess.run(cmd, env=worker_env(way, python), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{way} failed (exit code {proc.returncode}):\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())
# --8<-- [end:run_way]


def median_row(rows: list[dict]) -> dict:
    """One row from K runs of a way: each figure the median of the K (counts: the lower median, an integer);
    the tokens of the first run."""
    first = dict(rows[0])
    for key in FIGURES:
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            first[key] = statistics.median_low(values) if key in COUNTS else statistics.median(values)
    return first


def label(row: dict) -> str:
    """`Rust eager, torch 2.13`: the way and the torch it ran on (`2.14.1` kept whole when the patch is not 0);
    a llama.cpp way by its format, build and setting."""
    if peer.is_peer(row["way"]):
        return peer.name(row["way"])
    if not row["torch"]:
        return NAMES[row["way"]]
    release = row["torch"].split("+")[0]
    major, minor, patch = (release.split(".") + ["0", "0"])[:3]
    return f"{NAMES[row['way']]}, torch {major}.{minor}" + (f".{patch}" if patch != "0" else "")
